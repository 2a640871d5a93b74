//! What the decision reads: the release, the selected nodes with their plans and the
//! agent's reports, reduced to plain data by `rollout::view` and `plans`.

use std::sync::Arc;

use inplace_proto::{
    AgentReport, Architecture, NodeRolloutSpec, NodeRolloutStatus, Outcome, Phase, Steering,
};
use k8s_openapi::jiff::Timestamp;

use super::kured::KuredView;
use super::{AlertObservation, DrainProgress, PlanIntent, Readiness, ScaleDownMark};

/// The rollout's release, as far as the rollout is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseState {
    /// No NodeRelease with that name exists.
    Missing,
    /// The release exists but breaks a rule; the message lists the problems.
    Invalid {
        /// Every problem, for the condition message.
        message: String,
    },
    /// The release is valid and has this revision.
    Valid {
        /// `revision_of(release.spec.content)`, shared with the plans' views that name it
        /// (`rollout::view::revisions`), so comparing them is a pointer comparison.
        revision: Arc<str>,
    },
}

/// Who owns a node's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// This rollout.
    Ours,
    /// Another rollout (or a person, when the plan carries no rollout label).
    Other {
        /// Who, in words (`rollout "workers-a"`).
        owner: String,
    },
}

/// The agent's report on the plan, reduced to what the decision needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanReport {
    /// The agent's phase.
    pub phase: Option<Phase>,
    /// The revision the agent works towards.
    pub target_revision: Option<Arc<str>>,
    /// The revision the node runs, committed.
    pub current_revision: Option<Arc<str>>,
    /// The `Ready` condition's reason.
    pub reason: Option<String>,
    /// The `Ready` condition's message.
    pub message: Option<String>,
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// The plan's `metadata.generation` (of the controller's last write, while the cache
    /// lags behind it): a report for an older generation does not describe the plan.
    pub plan_generation: Option<i64>,
    /// Whether the `Degraded` condition is True.
    pub degraded: bool,
}

impl PlanReport {
    /// What the report says about `revision`: proto's one reading of an agent's report.
    pub fn outcome_for(&self, revision: &str) -> Outcome {
        AgentReport {
            observed_generation: self.observed_generation,
            phase: self.phase,
            target_revision: self.target_revision.as_deref(),
            current_revision: self.current_revision.as_deref(),
            degraded: self.degraded,
        }
        .outcome_for(revision, self.plan_generation)
    }
}

/// A node's plan as the controller last wrote it (spec, label, annotations) plus the
/// agent's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanView {
    /// The controller-owned part, as the plan says it. A hand-written plan that names no
    /// `spec.revision` has an empty one here (no release's revision is empty). Revisions
    /// are `Arc<str>` so that the view can share one copy of each among all plans
    /// (`rollout::view::revisions`): the decision compares every node's revisions every
    /// round, and `Arc`'s `==` compares the pointers first.
    pub intent: PlanIntent,
    /// A person's retry token (`inplace.dev/retry`) the agent has not honoured yet
    /// (`status.retryHonoured` does not show it): `steer::retry`.
    pub retry_pending: bool,
    /// The status the agent wrote.
    pub report: PlanReport,
}

impl PlanView {
    /// The plan as it stands after `intent` was applied (and no agent report).
    pub(crate) fn written(intent: &PlanIntent) -> PlanView {
        PlanView {
            intent: intent.clone(),
            retry_pending: false,
            report: PlanReport::default(),
        }
    }
}

/// A drain that ran out of `drainTimeout` for the plan's revision, as recorded on the plan:
/// final for that revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainTimedOut {
    /// What was left on the node, in words.
    pub message: String,
    /// `onTimeout: Skip` left the node at its revision ([`DRAIN_SKIPPED_ANNOTATION`](super::DRAIN_SKIPPED_ANNOTATION));
    /// otherwise it failed ([`DRAIN_TIMEOUT_ANNOTATION`](super::DRAIN_TIMEOUT_ANNOTATION)).
    pub skipped: bool,
}

/// One node the rollout's selector picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The node's name (also its plan's name).
    pub name: String,
    /// Whether it carries [`CONTROL_PLANE_LABEL`](super::CONTROL_PLANE_LABEL).
    pub control_plane: bool,
    /// Its value of the rollout's `maxUnavailablePerTopology.key` label: its group under the
    /// spread rule. Empty when it lacks the label (those nodes are one group, the empty
    /// value's) or the rollout sets no spread.
    pub topology: String,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Its `Ready` condition (the health gate).
    pub readiness: Readiness,
    /// Who owns its plan.
    pub ownership: Ownership,
    /// Its plan, when one exists.
    pub plan: Option<PlanView>,
    /// This round's drain pass, when [`needs_drain_pass`](super::needs_drain_pass) asked for one.
    pub drain: Option<DrainProgress>,
    /// What a person asked for on the Node (hold, skip): `steer.rs`.
    pub steering: Steering,
    /// The autoscaler's scale-down annotation on the Node, and whether inplace set it
    /// (`autoscaler.rs`).
    pub scale_down: ScaleDownMark,
    /// Its `kubernetes.io/arch` label, as the kubelet sets it (`architecture.rs`); `None`
    /// when it has none (the node is not judged, its agent is).
    pub architecture: Option<String>,
    /// `status.nodeInfo.kubeletVersion`, as its kubelet reports it (the skew guard,
    /// `version_skew.rs`); `None` when it reports none.
    pub kubelet_version: Option<String>,
    /// Another tool that is rebooting the node (`fluo.rs`): it is down, and uses a slot
    /// (`foreign.rs`) whether or not the rollout counts others' disruption.
    pub rebooted_by: Option<&'static str>,
    /// Which version of the node's view this is: the rollout's kept view gives every view
    /// it builds a number it never gave before (`rollout/view.rs`), so the same number
    /// means the same node and view, and the decision reuses what it found for it last
    /// round (`memo.rs`). 0: not numbered, never reused.
    pub version: u64,
}

#[cfg(test)]
impl NodeView {
    /// A Ready worker named `name` whose plan is ours to write and not written yet: what
    /// the decision's and the rollout view's tests start a node from.
    pub(crate) fn ready_worker(name: &str) -> NodeView {
        NodeView {
            name: name.into(),
            control_plane: false,
            topology: String::new(),
            unschedulable: false,
            readiness: Readiness::Ready,
            ownership: Ownership::Ours,
            plan: None,
            drain: None,
            steering: Steering::default(),
            scale_down: ScaleDownMark::default(),
            architecture: None,
            kubelet_version: None,
            rebooted_by: None,
            version: 0,
        }
    }
}

/// Everything the decision looks at.
#[derive(Debug, Clone)]
pub struct RolloutInput<'a> {
    /// The rollout's name.
    pub name: &'a str,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The rollout's spec.
    pub spec: &'a NodeRolloutSpec,
    /// The status the rollout carries now (for transitions and condition times).
    pub previous: Option<&'a NodeRolloutStatus>,
    /// The release.
    pub release: ReleaseState,
    /// The architectures the release has a build of every artifact for
    /// ([`inplace_proto::UpdateContent::architectures`]; `architecture.rs`); `None`: it serves
    /// every architecture, or there is no valid release.
    pub architectures: Option<Vec<Architecture>>,
    /// The selected nodes.
    pub nodes: Vec<NodeView>,
    /// The order `nodes` come in.
    pub order: NodeOrder,
    /// What Prometheus said about the alerts of `spec.gates.alerts`.
    pub alerts: AlertObservation,
    /// The versions the skew guard judges the release by (`version_skew.rs`).
    pub versions: KubernetesVersions,
    /// kured's reboot lock as this round read it (`kured.rs`); `None`: the controller does
    /// not share the fleet with kured (no `--kured-daemonset`).
    pub kured: Option<KuredView>,
    /// The time of this round.
    pub now: Timestamp,
}

/// The order of [`RolloutInput::nodes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeOrder {
    /// Any order: the decision sorts them.
    Any,
    /// Already in activation order ([`super::activation_order`]), as a rollout's kept
    /// view holds them (`rollout/view.rs`): the decision does not compare every adjacent
    /// pair of names again to find the order it has (a tenth of the controller's CPU in a
    /// 10,000-node rollout of 100 slots, docs/design/scale-history.md § What the runs found).
    Activation,
}

/// The Kubernetes versions the skew guard (`version_skew.rs`) compares besides the nodes'
/// kubelets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubernetesVersions {
    /// The release's `kubernetesVersion`; `None` for a release that brings no kubelet (an
    /// agent-only or OS release): not judged.
    pub release: Option<String>,
    /// The API server's `/version` (`gitVersion`); `None` when it was not asked (the
    /// release brings no Kubernetes version, or the rollout allows version skew).
    pub api_server: Option<String>,
}
