//! Fault injection: outages, latency, forced conflicts, cut watches and 410 on the next watch.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How an outage looks to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageKind {
    /// The listening socket is closed: connections are refused, open ones are dropped.
    ConnectionRefused,
    /// Every request gets `503 Service Unavailable`.
    Unavailable,
}

/// Fault switches shared by the server and tests (through [`crate::Handle::faults`]).
pub struct Faults {
    outage: Mutex<Option<(Instant, OutageKind)>>,
    latency: Mutex<Duration>,
    conflicts: AtomicU32,
    gone: AtomicU32,
    cut: watch::Sender<u64>,
    listener: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            outage: Mutex::new(None),
            latency: Mutex::new(Duration::ZERO),
            conflicts: AtomicU32::new(0),
            gone: AtomicU32::new(0),
            cut: watch::channel(0).0,
            listener: watch::channel(0).0,
        }
    }
}

impl Faults {
    /// Be down for `duration`, as `kind`.
    pub fn outage(&self, duration: Duration, kind: OutageKind) {
        *self.outage.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now() + duration, kind));
        if kind == OutageKind::ConnectionRefused {
            self.listener.send_modify(|n| *n += 1);
        }
        self.cut_watches();
    }

    /// End an outage early.
    pub fn end_outage(&self) {
        *self.outage.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.listener.send_modify(|n| *n += 1);
    }

    /// The current outage, if any.
    pub fn current_outage(&self) -> Option<(Instant, OutageKind)> {
        let mut g = self.outage.lock().unwrap_or_else(|p| p.into_inner());
        match *g {
            Some((until, _)) if Instant::now() >= until => {
                *g = None;
                None
            }
            other => other,
        }
    }

    /// Delay every request by `d` (zero to stop).
    pub fn latency(&self, d: Duration) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = d;
    }

    /// The added latency.
    pub fn current_latency(&self) -> Duration {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answer the next `n` writes with `409 Conflict`.
    pub fn conflict_next_writes(&self, n: u32) {
        self.conflicts.store(n, Ordering::SeqCst);
    }

    /// Whether this write must fail with a conflict (consumes one).
    pub fn take_conflict(&self) -> bool {
        self.conflicts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// End every open watch stream now.
    pub fn cut_watches(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Subscribe to watch cuts.
    pub fn cut_signal(&self) -> watch::Receiver<u64> {
        self.cut.subscribe()
    }

    /// Subscribe to listener changes (outage start/end).
    pub fn listener_signal(&self) -> watch::Receiver<u64> {
        self.listener.subscribe()
    }

    /// Answer the next `n` watch requests with 410 Gone.
    pub fn gone_next_watches(&self, n: u32) {
        self.gone.store(n, Ordering::SeqCst);
    }

    /// Answer the next watch request with 410 Gone.
    pub fn gone_next_watch(&self) {
        self.gone_next_watches(1);
    }

    /// Whether this watch must get 410 (consumes one).
    pub fn take_gone(&self) -> bool {
        self.gone
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}
