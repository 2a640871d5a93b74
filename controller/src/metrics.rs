//! The controller's metrics, owned by one struct (no global registry), kept in the
//! Prometheus project's client types and rendered in the Prometheus text format (0.0.4) by
//! its encoder for the HTTP server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of a scrape answer.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Histogram bucket bounds for reconcile durations, in seconds.
const BUCKETS: [f64; 11] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// The node states of `inplace_rollout_nodes`.
const NODE_STATES: [&str; 7] = [
    "total",
    "pending",
    "staged",
    "updating",
    "succeeded",
    "failed",
    "skipped",
];

type Labels<const N: usize> = [(&'static str, &'static str); N];

/// Every metric the controller exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Labels<1>, Counter>,
    failures: Family<Labels<2>, Counter>,
    durations: Family<Labels<1>, Histogram, fn() -> Histogram>,
    writes: Family<Labels<1>, Counter>,
    requests: Family<Labels<1>, Counter>,
    rounds: Family<Labels<1>, Counter>,
    views_built: Counter,
    rollout_nodes: Family<[(&'static str, String); 2], Gauge>,
    leader: Gauge,
    lease_transitions: Counter,
    /// Whether this replica leads: the gauge follows it, and only a change counts as an
    /// acquisition.
    leading: AtomicBool,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let metrics = Metrics {
            registry: Registry::default(),
            reconciles: Family::default(),
            failures: Family::default(),
            durations: Family::new_with_constructor(|| Histogram::new(BUCKETS)),
            writes: Family::default(),
            requests: Family::default(),
            rounds: Family::default(),
            views_built: Counter::default(),
            rollout_nodes: Family::default(),
            leader: Gauge::default(),
            lease_transitions: Counter::default(),
            leading: AtomicBool::new(false),
            ready: AtomicBool::new(false),
        };
        let mut registry = Registry::default();
        // The client appends the period that ends each help text.
        registry.register(
            "inplace_controller_reconciles",
            "Reconciles run, by controller",
            metrics.reconciles.clone(),
        );
        registry.register(
            "inplace_controller_reconcile_errors",
            "Failed reconciles, by controller and error",
            metrics.failures.clone(),
        );
        registry.register(
            "inplace_controller_reconcile_duration_seconds",
            "Time one reconcile took",
            metrics.durations.clone(),
        );
        registry.register(
            "inplace_controller_api_writes",
            "Writes to the Kubernetes API, by kind",
            metrics.writes.clone(),
        );
        registry.register(
            "inplace_controller_api_requests",
            "Requests to the Kubernetes API, by verb",
            metrics.requests.clone(),
        );
        registry.register(
            "inplace_controller_rollout_rounds",
            "Rollout reconciles by outcome: decided, unchanged (nothing the decision reads changed), or paced (too soon after the last decided round)",
            metrics.rounds.clone(),
        );
        registry.register(
            "inplace_controller_node_views_built",
            "Per-node views of a rollout built from the watch caches",
            metrics.views_built.clone(),
        );
        registry.register(
            "inplace_rollout_nodes",
            "Nodes of a rollout, by state",
            metrics.rollout_nodes.clone(),
        );
        registry.register(
            "inplace_controller_leader",
            "1 while this replica holds the leader Lease",
            metrics.leader.clone(),
        );
        registry.register(
            "inplace_controller_leader_acquisitions",
            "Times this replica became leader",
            metrics.lease_transitions.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    /// Counts one reconcile of `controller` that took `took`.
    pub fn reconciled(&self, controller: &'static str, took: Duration) {
        let label = [("controller", controller)];
        self.reconciles.get_or_create(&label).inc();
        self.durations
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }

    /// Counts a failed reconcile, labelled with [`crate::Error::metric_label`].
    pub fn failed(&self, controller: &'static str, error: &'static str) {
        self.failures
            .get_or_create(&[("controller", controller), ("error", error)])
            .inc();
    }

    /// Counts a write to the API: `plan_apply`, `rollout_status`, `release_status`,
    /// `node_cordon`, `node_uncordon`, `node_scale_down_disable`, `node_scale_down_restore`,
    /// `eviction`, `event`, `lease`.
    pub fn wrote(&self, kind: &'static str) {
        self.writes.get_or_create(&[("kind", kind)]).inc();
    }

    /// Counts one request to the API: `get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`.
    pub fn requested(&self, verb: &'static str) {
        self.requests.get_or_create(&[("verb", verb)]).inc();
    }

    /// Counts one rollout round: `decided` or `unchanged` (it did not decide).
    pub fn rollout_round(&self, outcome: &'static str) {
        self.rounds.get_or_create(&[("outcome", outcome)]).inc();
    }

    /// Counts one node's view built from the caches.
    pub fn built_node_view(&self) {
        self.views_built.inc();
    }

    /// Records a rollout's node counts.
    pub fn rollout_counts(&self, rollout: &str, counts: &inplace_proto::NodeCounts) {
        let values = [
            counts.total,
            counts.pending,
            counts.staged,
            counts.updating,
            counts.succeeded,
            counts.failed,
            counts.skipped,
        ];
        for (state, value) in NODE_STATES.into_iter().zip(values) {
            self.rollout_nodes
                .get_or_create(&node_labels(rollout, state))
                .set(i64::from(value));
        }
    }

    /// Forgets a deleted rollout.
    pub fn forget_rollout(&self, rollout: &str) {
        for state in NODE_STATES {
            self.rollout_nodes.remove(&node_labels(rollout, state));
        }
    }

    /// Whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        if leader && !self.leading.swap(true, Ordering::SeqCst) {
            self.lease_transitions.inc();
        }
        self.leading.store(leader, Ordering::SeqCst);
        self.leader.set(i64::from(leader));
    }

    /// Whether this replica leads.
    pub fn is_leader(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// Marks the process ready (caches synced, or standing by as a follower).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail, and every label is a plain string.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }
}

fn node_labels(rollout: &str, state: &'static str) -> [(&'static str, String); 2] {
    [("rollout", rollout.to_owned()), ("state", state.to_owned())]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of the hand-written renderer this replaced wrote for the test below, in
    /// its order (the client writes a family's series in no set order); integral floats
    /// were written without `.0`.
    const BEFORE: &str = r#"# HELP inplace_controller_reconciles_total Reconciles run, by controller.
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
inplace_rollout_nodes{rollout="r\"1\\x\ny",state="skipped"} 0
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

    /// Family by family, the same lines as before: what dashboards and alerts match.
    #[test]
    fn exposition_has_the_lines_of_the_hand_written_one() {
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
        let text = m.render();
        // A family's HELP and TYPE lines first, then its series (each series' bucket,
        // sum and count lines in order): compare families, and series within them as sets.
        let families = |text: &str| -> Vec<(String, Vec<String>)> {
            let mut out: Vec<(String, Vec<String>)> = Vec::new();
            for line in text.lines() {
                if line.starts_with("# HELP ") {
                    out.push((line.to_owned(), Vec::new()));
                } else if let Some((head, lines)) = out.last_mut() {
                    if line.starts_with("# TYPE ") {
                        head.push('\n');
                        head.push_str(line);
                    } else {
                        lines.push(line.replace("} 2.0", "} 2"));
                    }
                }
            }
            for (_, lines) in &mut out {
                lines.sort();
            }
            // Families added since (always shown, or empty here) are not compared.
            out.retain(|(head, _)| BEFORE.contains(head.as_str()));
            out
        };
        assert_eq!(families(&text), families(BEFORE), "{text}");
    }

    #[test]
    fn the_observability_guide_lists_every_controller_metric_with_its_type() {
        let guide =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/observability.md");
        // A family without series is left out of the text: give each one.
        let m = Metrics::default();
        m.reconciled("rollout", Duration::from_millis(3));
        m.failed("rollout", "conflict");
        m.wrote("plan_apply");
        m.requested("patch");
        m.rollout_round("decided");
        m.rollout_counts("r", &inplace_proto::NodeCounts::default());
        let text = m.render();
        assert_eq!(
            inplace_tests::metrics_guide::declared_families(&text).len(),
            10
        );
        assert_eq!(
            inplace_tests::metrics_guide::undocumented_families(
                &text,
                &std::fs::read_to_string(guide).unwrap()
            ),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_forgotten_rollout_leaves_no_series_and_leadership_counts_acquisitions() {
        let m = Metrics::default();
        m.rollout_counts(
            "a",
            &inplace_proto::NodeCounts {
                total: 3,
                ..Default::default()
            },
        );
        m.rollout_counts("b", &inplace_proto::NodeCounts::default());
        m.forget_rollout("a");
        let text = m.render();
        assert!(!text.contains("rollout=\"a\""), "{text}");
        assert!(text.contains("inplace_rollout_nodes{rollout=\"b\",state=\"total\"} 0\n"));
        m.set_leader(true);
        m.set_leader(true);
        m.set_leader(false);
        assert!(!m.is_leader());
        m.set_leader(true);
        let text = m.render();
        assert!(text.contains("inplace_controller_leader 1\n"), "{text}");
        assert!(text.contains("inplace_controller_leader_acquisitions_total 2\n"));
    }
}
