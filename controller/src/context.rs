//! What every reconcile gets: the client, the Event recorder, the metrics, the watch caches
//! and the controller's short-term memory of its own writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inplace_proto::{NodeRelease, NodeRollout, NodeRolloutStatus, NodeUpdatePlan};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use crate::metrics::Metrics;
use crate::rollout::alert_gate::{AlertSource, PrometheusSettings};
use crate::rollout::fleetlock::FleetLockSettings;
use crate::rollout::kured_lock::KuredSettings;
use crate::rollout::plans::RecentWrites;
use crate::rollout::status_pacing::StatusPacer;
use crate::rollout::view::{RolloutViews, Sources};
use crate::runtime::api_server_version::ApiServerVersion;
use crate::runtime::cache_readiness::CachesReady;

/// Tunables of the reconcilers.
#[derive(Debug, Clone)]
pub struct ReconcileSettings {
    /// How many nodes' writes one rollout reconcile makes at once.
    pub write_concurrency: usize,
    /// Look at every rollout again this often even if nothing changed.
    pub resync: Duration,
    /// Publish an Event for every node transition (activation started, updated). Failures
    /// and rollout-level transitions are always published.
    pub node_events: bool,
    /// The Prometheus the alert gate asks (`--prometheus-url`); none: a rollout that lists
    /// alerts is held with reason `GateUnavailable`.
    pub prometheus: Option<PrometheusSettings>,
    /// How often a rollout whose alert gate is closed asks again: no watch says when an
    /// alert resolves.
    pub alert_recheck: Duration,
    /// kured's reboot lock, shared with kured (`--kured-daemonset`); `None`: not shared.
    pub kured: Option<KuredSettings>,
    /// The FleetLock server (`--fleetlock-addr`); `None`: not served.
    pub fleetlock: Option<FleetLockSettings>,
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        ReconcileSettings {
            write_concurrency: 32,
            resync: Duration::from_secs(300),
            node_events: true,
            prometheus: None,
            alert_recheck: Duration::from_secs(30),
            kured: None,
            fleetlock: None,
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// A client that does not retry 429 answers itself: an eviction refused by a
    /// PodDisruptionBudget is retried by the drain, on the rollout's schedule.
    pub eviction_client: Client,
    /// Publishes Events.
    pub recorder: Recorder,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Every Node (slimmed: no status, no annotations).
    pub nodes: Store<Node>,
    /// Every NodeUpdatePlan (slimmed: no artifacts).
    pub plans: Store<NodeUpdatePlan>,
    /// Every NodeRelease.
    pub releases: Store<NodeRelease>,
    /// Every NodeRollout.
    pub rollouts: Store<NodeRollout>,
    /// Open once the Node, plan and release caches listed everything (a reconcile waits
    /// for it: an empty cache would look like "no nodes").
    pub caches_ready: CachesReady,
    /// Plans written but maybe not in the cache yet.
    pub writes: RecentWrites,
    /// The status each rollout was last given by this replica (newer than the cache; it
    /// may not be written yet, see [`StatusPacer`]).
    pub written_status: Mutex<HashMap<String, NodeRolloutStatus>>,
    /// Each rollout's per-node view between rounds, and what changed since.
    pub views: Arc<RolloutViews>,
    /// When each rollout's status may be written next.
    pub status_pacer: StatusPacer,
    /// Where the alert gate asks which alerts fire (from `settings.prometheus`).
    pub alerts: Option<Arc<dyn AlertSource>>,
    /// The API server's version, for the skew guard.
    pub api_server_version: ApiServerVersion,
    /// Held by a FleetLock grant and by a rollout round that may grant, so that neither
    /// decides on a budget the other is changing (`rollout/fleetlock.rs`).
    pub budget_gate: tokio::sync::Mutex<()>,
    /// Tunables.
    pub settings: ReconcileSettings,
}

impl Context {
    /// What the rollouts' views are built from.
    pub fn view_sources(&self) -> Sources<'_> {
        Sources {
            nodes: &self.nodes,
            plans: &self.plans,
            rollouts: &self.rollouts,
            writes: &self.writes,
            feed: &self.views.feed,
            metrics: &self.metrics,
        }
    }

    /// The status this replica last wrote for `rollout`, if any.
    pub fn last_status(&self, rollout: &str) -> Option<NodeRolloutStatus> {
        self.written_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(rollout)
            .cloned()
    }

    /// Remembers the status just written for `rollout`.
    pub fn remember_status(&self, rollout: &str, status: NodeRolloutStatus) {
        self.written_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(rollout.to_owned(), status);
    }

    /// Forgets the status of a rollout that is gone (a new rollout may take its name).
    pub fn forget_status(&self, rollout: &str) {
        self.written_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(rollout);
    }
}
