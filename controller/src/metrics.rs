//! The controller's metrics, owned by one struct (no global registry) and rendered in the
//! Prometheus text format by the HTTP server.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use inplace_proto::exposition::{Exposition, HistogramData, MetricType, lock_state as lock};

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
        let mut text = Exposition::new();
        let mut family = text.family(
            "inplace_controller_reconciles_total",
            "Reconciles run, by controller.",
            MetricType::Counter,
        );
        for (controller, n) in lock(&self.reconciles).iter() {
            family.sample(&[("controller", *controller)], *n);
        }
        let mut family = text.family(
            "inplace_controller_reconcile_errors_total",
            "Failed reconciles, by controller and error.",
            MetricType::Counter,
        );
        for ((controller, error), n) in lock(&self.failures).iter() {
            family.sample(&[("controller", *controller), ("error", *error)], *n);
        }
        let mut family = text.family(
            "inplace_controller_reconcile_duration_seconds",
            "Time one reconcile took.",
            MetricType::Histogram,
        );
        for (controller, h) in lock(&self.durations).iter() {
            family.histogram(
                &[("controller", *controller)],
                HistogramData {
                    bounds: &BUCKETS,
                    cumulative: &h.counts,
                    sum: h.sum,
                    count: h.count,
                },
            );
        }
        let mut family = text.family(
            "inplace_controller_api_writes_total",
            "Writes to the Kubernetes API, by kind.",
            MetricType::Counter,
        );
        for (kind, n) in lock(&self.writes).iter() {
            family.sample(&[("kind", *kind)], *n);
        }
        let mut family = text.family(
            "inplace_rollout_nodes",
            "Nodes of a rollout, by state.",
            MetricType::Gauge,
        );
        for ((rollout, state), n) in lock(&self.rollout_nodes).iter() {
            family.sample(&[("rollout", rollout.as_str()), ("state", *state)], *n);
        }
        text.family(
            "inplace_controller_leader",
            "1 while this replica holds the leader Lease.",
            MetricType::Gauge,
        )
        .sample(&[], u8::from(self.is_leader()));
        text.family(
            "inplace_controller_leader_acquisitions_total",
            "Times this replica became leader.",
            MetricType::Counter,
        )
        .sample(&[], self.lease_transitions.load(Ordering::SeqCst));
        text.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the hand-written renderer (before `inplace_proto::exposition`) wrote for the
    /// test below, captured from it.
    const GOLDEN: &str = r#"# HELP inplace_controller_reconciles_total Reconciles run, by controller.
# TYPE inplace_controller_reconciles_total counter
inplace_controller_reconciles_total{controller="release"} 1
inplace_controller_reconciles_total{controller="rollout"} 2
# HELP inplace_controller_reconcile_errors_total Failed reconciles, by controller and error.
# TYPE inplace_controller_reconcile_errors_total counter
inplace_controller_reconcile_errors_total{controller="release",error="api"} 1
inplace_controller_reconcile_errors_total{controller="rollout",error="conflict"} 1
# HELP inplace_controller_reconcile_duration_seconds Time one reconcile took.
# TYPE inplace_controller_reconcile_duration_seconds histogram
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="0.001"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="0.0025"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="0.005"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="0.01"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="0.025"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="0.05"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="0.1"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="0.25"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="0.5"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="1"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="5"} 1
inplace_controller_reconcile_duration_seconds_bucket{controller="release",le="+Inf"} 1
inplace_controller_reconcile_duration_seconds_sum{controller="release"} 2
inplace_controller_reconcile_duration_seconds_count{controller="release"} 1
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="0.001"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="0.0025"} 0
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="0.005"} 1
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="0.01"} 1
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="0.025"} 1
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="0.05"} 2
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="0.1"} 2
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="0.25"} 2
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="0.5"} 2
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="1"} 2
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="5"} 2
inplace_controller_reconcile_duration_seconds_bucket{controller="rollout",le="+Inf"} 2
inplace_controller_reconcile_duration_seconds_sum{controller="rollout"} 0.033
inplace_controller_reconcile_duration_seconds_count{controller="rollout"} 2
# HELP inplace_controller_api_writes_total Writes to the Kubernetes API, by kind.
# TYPE inplace_controller_api_writes_total counter
inplace_controller_api_writes_total{kind="event"} 1
inplace_controller_api_writes_total{kind="plan_apply"} 2
# HELP inplace_rollout_nodes Nodes of a rollout, by state.
# TYPE inplace_rollout_nodes gauge
inplace_rollout_nodes{rollout="r\"1\\x\ny",state="failed"} 0
inplace_rollout_nodes{rollout="r\"1\\x\ny",state="pending"} 0
inplace_rollout_nodes{rollout="r\"1\\x\ny",state="staged"} 0
inplace_rollout_nodes{rollout="r\"1\\x\ny",state="succeeded"} 1
inplace_rollout_nodes{rollout="r\"1\\x\ny",state="total"} 3
inplace_rollout_nodes{rollout="r\"1\\x\ny",state="updating"} 0
# HELP inplace_controller_leader 1 while this replica holds the leader Lease.
# TYPE inplace_controller_leader gauge
inplace_controller_leader 1
# HELP inplace_controller_leader_acquisitions_total Times this replica became leader.
# TYPE inplace_controller_leader_acquisitions_total counter
inplace_controller_leader_acquisitions_total 1
"#;

    /// The whole text, byte for byte: what dashboards and alerts already match.
    #[test]
    fn exposition_is_byte_identical_to_the_hand_written_one() {
        let m = Metrics::default();
        m.reconciled("rollout", Duration::from_millis(3));
        m.reconciled("rollout", Duration::from_millis(30));
        m.reconciled("release", Duration::from_secs(2));
        m.failed("rollout", "conflict");
        m.failed("release", "api");
        m.wrote("plan_apply");
        m.wrote("plan_apply");
        m.wrote("event");
        m.set_leader(true);
        m.rollout_counts(
            "r\"1\\x\ny",
            &inplace_proto::NodeCounts {
                total: 3,
                succeeded: 1,
                ..Default::default()
            },
        );
        assert_eq!(m.render(), GOLDEN);
    }

    #[test]
    fn the_observability_guide_lists_every_controller_metric_with_its_type() {
        let guide =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/observability.md");
        let text = Metrics::default().render();
        assert_eq!(inplace_proto::exposition::declared_families(&text).len(), 7);
        assert_eq!(
            inplace_proto::exposition::undocumented_families(
                &text,
                &std::fs::read_to_string(guide).unwrap()
            ),
            Vec::<String>::new()
        );
    }

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
