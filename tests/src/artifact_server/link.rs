//! One link all of a server's answers share, as an artifact server's uplink is shared by
//! every node that downloads from it: a cap on the bytes per second of all bodies together,
//! and a count of the bodies on it, now and at most (the fan-out, seen from the server).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The shared link. Each chunk of a body waits for its turn on the link: chunks go out one
/// after another at the cap, so concurrent bodies share it about evenly.
#[derive(Debug)]
pub struct SharedLink {
    bytes_per_second: u64,
    /// When the link is free for the next chunk.
    free_at: Mutex<Instant>,
    on_it: AtomicUsize,
    peak: AtomicUsize,
}

/// A body on the link; it leaves when this is dropped (sent, or its connection broke).
pub(super) struct OnLink<'a>(&'a SharedLink);

impl Drop for OnLink<'_> {
    fn drop(&mut self) {
        self.0.on_it.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SharedLink {
    pub(super) fn new(bytes_per_second: u64) -> SharedLink {
        SharedLink {
            bytes_per_second: bytes_per_second.max(1),
            free_at: Mutex::new(Instant::now()),
            on_it: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// A body starts on the link.
    pub(super) fn enter(&self) -> OnLink<'_> {
        let now = self.on_it.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        OnLink(self)
    }

    /// Waits until `bytes` have passed the link after everything queued before them.
    pub(super) async fn pass(&self, bytes: usize) {
        let takes = Duration::from_secs_f64(bytes as f64 / self.bytes_per_second as f64);
        let done = {
            let mut free_at = self
                .free_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *free_at = (*free_at).max(Instant::now()) + takes;
            *free_at
        };
        tokio::time::sleep_until(done).await;
    }

    /// The most bodies that were ever on the link at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}
