//! NodeRollout: *where* and *how fast* a release goes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::gates::RolloutGates;
use crate::maintenance_window::MaintenanceWindow;

/// Rolls a NodeRelease out to the nodes a selector picks, a few activation slots at a
/// time, and halts itself when too many nodes fail.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "inplace.dev",
    version = "v1alpha1",
    kind = "NodeRollout",
    doc = "Where and how fast a NodeRelease goes: staged on every selected node, activated a few nodes at a time, halted when too many fail.",
    status = "NodeRolloutStatus",
    shortname = "nro",
    category = "inplace",
    printcolumn = r#"{"name":"Release","type":"string","jsonPath":".spec.release"}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.nodes.total"}"#,
    printcolumn = r#"{"name":"Staged","type":"integer","jsonPath":".status.nodes.staged"}"#,
    printcolumn = r#"{"name":"Succeeded","type":"integer","jsonPath":".status.nodes.succeeded"}"#,
    printcolumn = r#"{"name":"Updating","type":"integer","jsonPath":".status.nodes.updating"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.nodes.failed"}"#,
    printcolumn = r#"{"name":"Skipped","type":"integer","jsonPath":".status.nodes.skipped"}"#,
    printcolumn = r#"{"name":"Complete","type":"string","jsonPath":".status.conditions[?(@.type==\"Complete\")].status"}"#,
    printcolumn = r#"{"name":"Halted","type":"string","jsonPath":".status.conditions[?(@.type==\"Halted\")].status"}"#,
    printcolumn = r#"{"name":"Paused","type":"boolean","jsonPath":".spec.paused"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Progressing\")].message"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.progressDeadline) || duration(self.progressDeadline) > duration(self.drainTimeout)", "message": "progressDeadline must be longer than drainTimeout: it counts from the grant, drain included", "fieldPath": ".progressDeadline"},
]))]
pub struct NodeRolloutSpec {
    /// The NodeRelease to roll out.
    #[schemars(length(min = 1, max = 253))]
    pub release: String,

    /// Which nodes. An empty selector selects every node.
    #[serde(default)]
    pub node_selector: LabelSelector,

    /// How many nodes may be activating at once: a number, or a percentage of the selected
    /// nodes rounded down (at least 1), as Kubernetes rounds `maxUnavailable`. Staging is
    /// limited by `staging.maxConcurrent` only.
    #[serde(default = "default_max_unavailable")]
    // maxLength bounds the CEL cost estimate of the rule below (an unbounded string is sized
    // at ~3M characters by the API server's estimator); "100%" is the longest valid value.
    #[schemars(extend("maxLength" = 4))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "type(self) == int ? self >= 1 : self.matches('^[1-9][0-9]?%$|^100%$')", "message": "maxUnavailable must be a positive integer or a percentage from 1% to 100%"},
    ]))]
    pub max_unavailable: IntOrString,

    /// Halt the rollout when more nodes than this fail or roll back.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100000))]
    pub max_failures: i32,

    /// What happens to a node's workloads before it is activated.
    #[serde(default)]
    pub disruption: Disruption,

    /// How long a drain may take before `drain.onTimeout` applies (by default the node is
    /// reported as `DrainTimeout`).
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: Duration,

    /// How `disruption: Drain` drains: pods it leaves alone, the grace period it gives, what
    /// happens when `drainTimeout` passes. Unset: every pod but DaemonSet and mirror pods is
    /// evicted with its own grace period, and a timeout fails the node.
    #[serde(default, skip_serializing_if = "DrainSpec::is_default")]
    pub drain: DrainSpec,

    /// Stop activating more nodes. Staging goes on; nodes already activating finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,

    /// Allow nodes to go to a lower `kubernetesVersion` than the kubelet they run (copied
    /// into every plan the rollout writes). Without it the rollout touches no node while a
    /// selected node's kubelet is newer than the release (`Progressing=False`, reason
    /// `DowngradeDenied`, naming the nodes and both versions), and an agent refuses such a
    /// plan with the same reason.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_downgrade: bool,

    /// Allow a release whose `kubernetesVersion` breaks the kubelet skew policy: a minor
    /// version above the API server's (`/version`), or more than one minor version above
    /// a selected node's kubelet. Without it the rollout touches no node
    /// (`Progressing=False`, reason `VersionSkewDenied`, naming both versions). Releases
    /// without a `kubernetesVersion` are never judged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_version_skew: bool,

    /// When new activations may start. Empty (the default): at any time. Otherwise only
    /// inside one of these windows; staging goes on and an activation already started
    /// finishes. Outside every window `Progressing` is False with reason
    /// `OutsideMaintenanceWindow` and says when the next one opens.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub maintenance_windows: Vec<MaintenanceWindow>,

    /// How long a node must have run the release (as seen by the controller) before its
    /// activation slot goes to the next node: a soak between nodes. 0 (the default): at once.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0, max = 86400))]
    pub min_ready_seconds: i32,

    /// How long a node may hold its activation slot, from the grant (drain included), before
    /// it is counted as failed with reason `ProgressDeadlineExceeded`: its slot goes to the
    /// next node and it counts toward `maxFailures`. Unset (the default): no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_deadline: Option<Duration>,

    /// At most `max` nodes sharing one value of the node label `key` (a zone, a rack) hold
    /// an activation slot at once, on top of `maxUnavailable`. Nodes without the label (or
    /// with it empty) form one group of their own. Unset (the default): no spread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable_per_topology: Option<TopologySpread>,

    /// Cluster health that must hold before a new activation starts: Prometheus alerts that
    /// must not fire. Whatever is set here, a new activation also waits while a node that
    /// already runs the release is not `Ready` (reason `NodeNotReady`). Empty (the
    /// default): no alert gate.
    #[serde(default, skip_serializing_if = "RolloutGates::is_empty")]
    pub gates: RolloutGates,

    /// Count selected nodes that others took down against `maxUnavailable` (and their
    /// topology group's `maxUnavailablePerTopology.max`): a node cordoned by someone else
    /// (not by inplace) or not `Ready` occupies a slot while it is not one of this rollout's
    /// activations, and no activation starts while that would exceed the budget. They are
    /// listed in `status.foreignDisruptions`. Default: true.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub count_foreign_disruption: bool,

    /// How the release is staged (downloaded) on the selected nodes. Unset: every node at
    /// once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<StagingSpec>,
}

/// `spec.staging`: staging in waves an artifact source can serve.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StagingSpec {
    /// How many nodes may be staging at once (their plan names the revision, their agent has
    /// not reported `Staged` yet): a number, or a percentage of the selected nodes rounded
    /// down (at least 1), as `maxUnavailable` is rounded. A node whose staging failed no
    /// longer counts.
    // As maxUnavailable: maxLength bounds the CEL cost estimate.
    #[schemars(extend("maxLength" = 4))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "type(self) == int ? self >= 1 : self.matches('^[1-9][0-9]?%$|^100%$')", "message": "maxConcurrent must be a positive integer or a percentage from 1% to 100%"},
    ]))]
    pub max_concurrent: IntOrString,
}

/// The shape of a label key: an optional DNS-subdomain prefix and `/`, then a name of 1 to 63
/// letters, digits, `-`, `_` and `.`, starting and ending with a letter or digit. Lengths
/// past the name's are checked by `NodeRollout::validate` and the schema's `maxLength`.
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// `spec.maxUnavailablePerTopology`: activations spread over the values of one node label.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpread {
    /// The node label whose values form the groups, e.g. `topology.kubernetes.io/zone`.
    #[schemars(length(min = 1, max = 317))]
    #[schemars(regex(pattern = LABEL_KEY_PATTERN))]
    pub key: String,

    /// How many nodes of one group may hold an activation slot at once: at least 1.
    #[schemars(range(min = 1, max = 100000))]
    pub max: i32,
}

/// `spec.drain`: how a node is drained under `disruption: Drain`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.onTimeout) || self.onTimeout != 'Force' || (has(self.allowForce) && self.allowForce)", "message": "onTimeout: Force deletes pods without eviction, ignoring PodDisruptionBudgets; it needs allowForce: true", "fieldPath": ".onTimeout"},
]))]
pub struct DrainSpec {
    /// Pods the drain leaves alone: a pod whose labels match is neither evicted nor waited
    /// for (e.g. `matchLabels: {inplace.dev/skip: "true"}`). Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)", "message": "an empty podSelector would leave every pod alone; use disruption: Cordon for that"},
        {"rule": "!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])", "message": "operator must be one of In, NotIn, Exists, DoesNotExist"},
        {"rule": "!has(self.matchExpressions) || self.matchExpressions.all(e, (e.operator in ['In', 'NotIn']) == (has(e.values) && size(e.values) > 0))", "message": "In and NotIn need at least one value; Exists and DoesNotExist take none"},
    ]))]
    pub pod_selector: Option<LabelSelector>,

    /// The grace period each pod is given to stop, in seconds, sent with its eviction (and
    /// with its deletion under `onTimeout: Force`). Unset: each pod's own
    /// `terminationGracePeriodSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub grace_period_seconds: Option<i64>,

    /// What happens when a node is not drained within `drainTimeout`.
    #[serde(default, skip_serializing_if = "OnDrainTimeout::is_default")]
    pub on_timeout: OnDrainTimeout,

    /// The opt-in that `onTimeout: Force` requires (the API server refuses Force without
    /// it): forcing deletes pods without the Eviction API, so PodDisruptionBudgets are not
    /// respected.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_force: bool,
}

impl DrainSpec {
    fn is_default(&self) -> bool {
        *self == DrainSpec::default()
    }
}

/// `spec.drain.onTimeout`: what happens to a node not drained within `drainTimeout`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OnDrainTimeout {
    /// The node fails with `DrainTimeout` (counted toward `maxFailures`) and is uncordoned;
    /// it stays at the revision it runs.
    #[default]
    Halt,
    /// The node is left at the revision it runs, uncordoned and counted as skipped (not
    /// failed); the rollout goes on with the next node.
    Skip,
    /// The pods still on the node are deleted without eviction (PodDisruptionBudgets are
    /// NOT respected), with `gracePeriodSeconds`; once they are gone the node is activated.
    /// If they are still there another `drainTimeout` later, the node fails with
    /// `DrainTimeout`. Needs `allowForce: true`.
    Force,
}

impl OnDrainTimeout {
    fn is_default(&self) -> bool {
        *self == OnDrainTimeout::Halt
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

fn default_drain_timeout() -> Duration {
    Duration::from_secs(600)
}

/// What happens to a node's workloads before activation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Disruption {
    /// Nothing: the swap restarts units but pods keep running.
    #[default]
    None,
    /// Cordon the node during activation, uncordon after success.
    Cordon,
    /// Cordon and evict pods through the Eviction API (PodDisruptionBudgets respected).
    Drain,
}

/// How the rollout is going.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeRolloutStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The release's revision being rolled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,

    /// Node counts by state.
    #[serde(default)]
    pub nodes: NodeCounts,

    /// Nodes activating now (holding a slot).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active_nodes: Vec<String>,

    /// Nodes that failed or rolled back, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub failed_nodes: Vec<NodeFailure>,

    /// When the next maintenance window opens, while every window is closed (reason
    /// `OutsideMaintenanceWindow`); absent while one is open or none is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window_opens_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,

    /// Nodes a person holds (the Node's `inplace.dev/hold` annotation): staged, never granted
    /// a slot until released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_nodes: Vec<String>,

    /// Nodes left at their current revision, counted in `nodes.skipped`, never as failed: a
    /// person skips them (the Node's `inplace.dev/skip` annotation), or the release has no
    /// build for their `kubernetes.io/arch` (condition `NodesUnsupported`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_nodes: Vec<String>,

    /// Selected nodes others took down, each occupying an activation slot
    /// (`spec.countForeignDisruption`): cordoned by someone else, or not `Ready`, while not
    /// one of this rollout's activations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub foreign_disruptions: Vec<ForeignDisruption>,

    /// `Progressing`, `Complete`, `Halted`, `NodesRefused` and `NodesUnsupported`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A selected node someone else took down: it occupies an activation slot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForeignDisruption {
    /// The node's name.
    pub node: String,
    /// What the controller saw, in words: `cordoned`, `NotReady (Ready=Unknown)`, or both.
    pub why: String,
}

/// Node counts by state. Every selected node is in exactly one of the last six.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// Nodes the rollout selects.
    pub total: i32,
    /// Waiting for the release to be staged.
    pub pending: i32,
    /// Staged, waiting for an activation slot.
    pub staged: i32,
    /// Holding a slot: draining, activating or verifying.
    pub updating: i32,
    /// Running the release.
    pub succeeded: i32,
    /// Failed or rolled back.
    pub failed: i32,
    /// Left at their current revision: skipped by a person (`inplace.dev/skip`), or without a
    /// build in the release for their `kubernetes.io/arch`.
    #[serde(default)]
    pub skipped: i32,
}

/// A node that failed (or was skipped), and why.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeFailure {
    /// The node's name.
    pub node: String,
    /// The condition reason from the node's plan (or `DrainTimeout`).
    pub reason: String,
    /// The human message.
    pub message: String,
}
