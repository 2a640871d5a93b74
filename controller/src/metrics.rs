//! The controller's metrics, owned by one struct (no global registry) and rendered in the
//! Prometheus text format by the HTTP server.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Histogram bucket bounds for reconcile durations, in seconds.
const BUCKETS: [f64; 11] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
    max: f64,
}

/// Summary of reconcile durations of one controller.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    /// How many reconciles.
    pub count: u64,
    /// Mean, seconds.
    pub mean: f64,
    /// Upper bucket bound below which 50% fall, seconds.
    pub p50: f64,
    /// Upper bucket bound below which 99% fall, seconds.
    pub p99: f64,
    /// Slowest, seconds.
    pub max: f64,
}

/// Every metric the controller exports.
#[derive(Default)]
pub struct Metrics {
    reconciles: Mutex<BTreeMap<&'static str, u64>>,
    failures: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    durations: Mutex<BTreeMap<&'static str, Histogram>>,
    writes: Mutex<BTreeMap<&'static str, u64>>,
    rollout_nodes: Mutex<BTreeMap<(String, &'static str), i64>>,
    leader: AtomicBool,
    ready: AtomicBool,
    lease_transitions: AtomicU64,
}

impl Metrics {
    /// Counts one reconcile of `controller` that took `took`.
    pub fn reconciled(&self, controller: &'static str, took: Duration) {
        *lock(&self.reconciles).entry(controller).or_default() += 1;
        let secs = took.as_secs_f64();
        let mut durations = lock(&self.durations);
        let h = durations.entry(controller).or_default();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
        h.max = h.max.max(secs);
    }

    /// Counts a failed reconcile, labelled with [`crate::Error::metric_label`].
    pub fn failed(&self, controller: &'static str, error: &'static str) {
        *lock(&self.failures).entry((controller, error)).or_default() += 1;
    }

    /// Counts a write to the API: `plan_apply`, `rollout_status`, `release_status`,
    /// `node_cordon`, `node_uncordon`, `eviction`, `event`, `lease`.
    pub fn wrote(&self, kind: &'static str) {
        *lock(&self.writes).entry(kind).or_default() += 1;
    }

    /// Writes of one kind so far.
    pub fn writes(&self, kind: &'static str) -> u64 {
        lock(&self.writes).get(kind).copied().unwrap_or(0)
    }

    /// All writes so far.
    pub fn total_writes(&self) -> u64 {
        lock(&self.writes).values().sum()
    }

    /// Records a rollout's node counts.
    pub fn rollout_counts(&self, rollout: &str, counts: &inplace_proto::NodeCounts) {
        let mut map = lock(&self.rollout_nodes);
        for (state, value) in [
            ("total", counts.total),
            ("pending", counts.pending),
            ("staged", counts.staged),
            ("updating", counts.updating),
            ("succeeded", counts.succeeded),
            ("failed", counts.failed),
        ] {
            map.insert((rollout.to_owned(), state), i64::from(value));
        }
    }

    /// Forgets a deleted rollout.
    pub fn forget_rollout(&self, rollout: &str) {
        lock(&self.rollout_nodes).retain(|(name, _), _| name != rollout);
    }

    /// Whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        if leader && !self.leader.swap(true, Ordering::SeqCst) {
            self.lease_transitions.fetch_add(1, Ordering::SeqCst);
        }
        self.leader.store(leader, Ordering::SeqCst);
    }

    /// Whether this replica leads.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    /// Marks the process ready (caches synced, or standing by as a follower).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Reconcile latency of one controller.
    pub fn latency(&self, controller: &'static str) -> LatencySummary {
        let durations = lock(&self.durations);
        let Some(h) = durations.get(controller) else {
            return LatencySummary::default();
        };
        let quantile = |q: f64| {
            let want = (h.count as f64 * q).ceil() as u64;
            BUCKETS
                .iter()
                .zip(h.counts)
                .find(|(_, c)| *c >= want)
                .map_or(h.max, |(b, _)| *b)
        };
        LatencySummary {
            count: h.count,
            mean: if h.count == 0 {
                0.0
            } else {
                h.sum / h.count as f64
            },
            p50: quantile(0.5),
            p99: quantile(0.99),
            max: h.max,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP inplace_controller_reconciles_total Reconciles run, by controller.\n# TYPE inplace_controller_reconciles_total counter"
        );
        for (controller, n) in lock(&self.reconciles).iter() {
            let _ = writeln!(
                out,
                "inplace_controller_reconciles_total{{controller=\"{controller}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP inplace_controller_reconcile_errors_total Failed reconciles, by controller and error.\n# TYPE inplace_controller_reconcile_errors_total counter"
        );
        for ((controller, error), n) in lock(&self.failures).iter() {
            let _ = writeln!(
                out,
                "inplace_controller_reconcile_errors_total{{controller=\"{controller}\",error=\"{error}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP inplace_controller_reconcile_duration_seconds Time one reconcile took.\n# TYPE inplace_controller_reconcile_duration_seconds histogram"
        );
        for (controller, h) in lock(&self.durations).iter() {
            for (bound, count) in BUCKETS.iter().zip(h.counts) {
                let _ = writeln!(
                    out,
                    "inplace_controller_reconcile_duration_seconds_bucket{{controller=\"{controller}\",le=\"{bound}\"}} {count}"
                );
            }
            let _ = writeln!(
                out,
                "inplace_controller_reconcile_duration_seconds_bucket{{controller=\"{controller}\",le=\"+Inf\"}} {}\ninplace_controller_reconcile_duration_seconds_sum{{controller=\"{controller}\"}} {}\ninplace_controller_reconcile_duration_seconds_count{{controller=\"{controller}\"}} {}",
                h.count, h.sum, h.count
            );
        }
        let _ = writeln!(
            out,
            "# HELP inplace_controller_api_writes_total Writes to the Kubernetes API, by kind.\n# TYPE inplace_controller_api_writes_total counter"
        );
        for (kind, n) in lock(&self.writes).iter() {
            let _ = writeln!(
                out,
                "inplace_controller_api_writes_total{{kind=\"{kind}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP inplace_rollout_nodes Nodes of a rollout, by state.\n# TYPE inplace_rollout_nodes gauge"
        );
        for ((rollout, state), n) in lock(&self.rollout_nodes).iter() {
            let _ = writeln!(
                out,
                "inplace_rollout_nodes{{rollout=\"{}\",state=\"{state}\"}} {n}",
                escape(rollout)
            );
        }
        let _ = writeln!(
            out,
            "# HELP inplace_controller_leader 1 while this replica holds the leader Lease.\n# TYPE inplace_controller_leader gauge\ninplace_controller_leader {}",
            u8::from(self.is_leader())
        );
        let _ = writeln!(
            out,
            "# HELP inplace_controller_leader_acquisitions_total Times this replica became leader.\n# TYPE inplace_controller_leader_acquisitions_total counter\ninplace_controller_leader_acquisitions_total {}",
            self.lease_transitions.load(Ordering::SeqCst)
        );
        out
    }
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding a metrics lock leaves plain counters behind: keep going.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.reconciled("rollout", Duration::from_millis(3));
        m.reconciled("rollout", Duration::from_millis(30));
        m.failed("rollout", "conflict");
        m.wrote("plan_apply");
        m.set_leader(true);
        m.rollout_counts(
            "r\"1",
            &inplace_proto::NodeCounts {
                total: 3,
                ..Default::default()
            },
        );
        let text = m.render();
        assert!(text.contains("inplace_controller_reconciles_total{controller=\"rollout\"} 2"));
        assert!(text.contains(
            "inplace_controller_reconcile_errors_total{controller=\"rollout\",error=\"conflict\"} 1"
        ));
        assert!(text.contains(
            "inplace_controller_reconcile_duration_seconds_bucket{controller=\"rollout\",le=\"0.005\"} 1"
        ));
        assert!(text.contains("inplace_controller_api_writes_total{kind=\"plan_apply\"} 1"));
        assert!(text.contains("inplace_rollout_nodes{rollout=\"r\\\"1\",state=\"total\"} 3"));
        assert!(text.contains("inplace_controller_leader 1"));
        let l = m.latency("rollout");
        assert_eq!(l.count, 2);
        assert_eq!(l.p50, 0.005);
        assert_eq!(l.p99, 0.05);
    }
}
