//! The rollout decision: one pure function from what the controller sees of one
//! NodeRollout (its spec, its release, its selected nodes with their plans, the result of
//! this round's drain pass, the time) to what it should do next (plan applies, cordons,
//! uncordons), the status it should report and the Events a person cares about.
//!
//! Nothing here performs I/O, so every rule of the rollout — slots never exceeded,
//! control-plane nodes first and one at a time, pause, halt past `maxFailures`, drain
//! timeouts, ownership — is unit-tested directly. `docs/design/controller.md` describes the
//! rules; `rollout::controller` gathers the inputs and carries out the actions.
//!
//! A release the skew guard refuses (`version_skew.rs`: a kubelet newer than the API
//! server, a skipped minor version, a downgrade) touches no node. Otherwise
//! `decide` runs its phases, each a pure function in its own file: `classify.rs` (where
//! each owned node stands, its plan intent, its drain; with a person's steering, `steer.rs`,
//! and the architecture preflight, `architecture.rs`: a node the release has no build for
//! is passed over, not failed), `foreign.rs` (the nodes others
//! took down, each occupying a slot), `grant.rs` (the halt rule and the activation slots),
//! `autoscaler.rs` (the autoscaler's scale-down annotation on nodes holding a slot),
//! `actions.rs` (cordons, uncordons and plan applies in activation order), `status.rs`
//! (counts, conditions, Events). An agent's report is read by proto's
//! one rule ([`inplace_proto::Outcome`]), shared with the Cluster API extension and
//! `kubectl inplace`.
//!
//! All of the rollout's per-node memory lives on the node's plan, written by the controller
//! itself (label and annotations below), so a restarted controller (or a new leader)
//! continues where the last one stopped.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use inplace_proto::reason::rollout_condition;
use inplace_proto::{DesiredState, NodeRolloutStatus};
use k8s_openapi::jiff::Timestamp;

mod actions;
mod architecture;
mod autoscaler;
mod classify;
mod drain;
pub mod fleetlock;
pub mod fluo;
mod foreign;
mod grant;
mod health;
mod input;
pub mod kured;
mod memo;
mod node_events;
mod status;
mod steer;
mod version_skew;
mod window;

pub use autoscaler::{SCALE_DOWN_DISABLED_ANNOTATION, SCALE_DOWN_MARK_ANNOTATION, ScaleDownMark};
pub(crate) use classify::{busy_elsewhere, classify, keeps_cordon, progress_deadline_at};
pub use drain::{drain_pass_options, needs_drain_pass, rollout_drains};
pub use health::{AlertObservation, Readiness};
pub use input::{
    DrainTimedOut, KubernetesVersions, NodeOrder, NodeView, Ownership, PlanReport, PlanView,
    ReleaseState, RolloutInput,
};
pub use memo::DecisionMemo;
pub use version_skew::{SERVER_VERSION_RECHECK, asks_api_server};

/// Label on a plan: the NodeRollout that owns it (a node has one owner).
pub const ROLLOUT_LABEL: &str = "inplace.dev/rollout";
/// Annotation on a plan: when the node was granted an activation slot (RFC 3339).
pub const GRANTED_ANNOTATION: &str = "inplace.dev/activation-granted";
/// Annotation on a plan: when the controller first saw the node run the revision after its
/// grant (RFC 3339), written only under `minReadySeconds`: the soak counts from it.
pub const READY_SINCE_ANNOTATION: &str = "inplace.dev/ready-since";
/// Annotation on a plan: `"true"` while the controller holds the node cordoned — the one
/// cordon record of every inplace drain (`inplace_drain::cordon`). A node a person
/// cordoned never carries it, so the controller never uncordons it.
pub use inplace_drain::cordon::CORDONED_ANNOTATION;
/// Annotation on a plan: the node could not be drained within `drainTimeout`; the value is
/// the message. Counts as a failure of this revision.
pub const DRAIN_TIMEOUT_ANNOTATION: &str = "inplace.dev/drain-timeout";
/// Annotation on a plan: the node could not be drained within `drainTimeout` and the
/// rollout's `drain.onTimeout: Skip` left it at the revision it runs; the value is the
/// message. The node counts as skipped for this revision, not failed.
pub const DRAIN_SKIPPED_ANNOTATION: &str = "inplace.dev/drain-skipped";
/// The label that marks control-plane nodes; they are activated first, one at a time.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Condition type on a NodeRollout: True when selected nodes were left out because another
/// rollout owns them (reason `NodeOwnedByOtherRollout`).
pub const NODES_REFUSED_CONDITION: &str = rollout_condition::NODES_REFUSED;

/// How often a rollout with a drain in progress is looked at again (evictions are retried
/// this often until the drain completes or `drainTimeout` passes).
pub const DRAIN_RETRY: StdDuration = StdDuration::from_secs(5);

/// The fewest nodes one round may start staging (a new plan, or a plan moved to the
/// revision); a rollout with more slots stages a slot count per round ([`staging_batch`]).
/// A round's status is written and its grants are made only after its writes, so staging a
/// 30,000-node fleet in one round would hold back every status report and activation until
/// 30,000 plans are written; in batches, the first nodes are granted while later ones are
/// still being staged (the rollout asks to be looked at again at once, [`STAGING_REQUEUE`]).
pub const STAGING_BATCH: usize = 500;

/// How many nodes one round starts staging at most: a wave's worth (the slots), at least
/// [`STAGING_BATCH`]. Each round costs a pass over every selected node, so a batch smaller
/// than a wave would spend more rounds staging than activating.
pub fn staging_batch(slots: usize) -> usize {
    slots.max(STAGING_BATCH)
}

/// How soon a round that left nodes unstaged (past [`STAGING_BATCH`]) is followed by the next.
pub const STAGING_REQUEUE: StdDuration = StdDuration::ZERO;

/// The result of this round's drain pass over one node (the one drain, `inplace-drain`).
pub use inplace_drain::DrainProgress;

/// The controller-owned part of a plan: what the controller applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanIntent {
    /// `spec.revision` (the content is copied from the release alongside). Shared: every
    /// owned node's intent names the same revision, and a round builds one per node.
    pub revision: Arc<str>,
    /// `spec.desiredState`.
    pub desired_state: DesiredState,
    /// [`GRANTED_ANNOTATION`].
    pub granted_at: Option<Timestamp>,
    /// [`READY_SINCE_ANNOTATION`].
    pub ready_since: Option<Timestamp>,
    /// [`CORDONED_ANNOTATION`].
    pub cordoned: bool,
    /// [`DRAIN_TIMEOUT_ANNOTATION`] or [`DRAIN_SKIPPED_ANNOTATION`].
    pub drain_timeout: Option<DrainTimedOut>,
    /// `spec.allowDowngrade`, the rollout's own.
    pub allow_downgrade: bool,
}

/// One thing to do, in order. The executor stops at the first failure and the next
/// round starts over from what the cluster then says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAction {
    /// Server-side apply the node's plan with this intent.
    ApplyPlan {
        /// The node (and plan) name.
        node: String,
        /// What to write.
        intent: PlanIntent,
    },
    /// Set `spec.unschedulable: true` on the node.
    Cordon {
        /// The node.
        node: String,
    },
    /// Set `spec.unschedulable: false` on the node.
    Uncordon {
        /// The node.
        node: String,
    },
    /// Set the autoscaler's [`SCALE_DOWN_DISABLED_ANNOTATION`] and inplace's
    /// [`SCALE_DOWN_MARK_ANNOTATION`] on the Node, in one patch (`autoscaler.rs`).
    DisableScaleDown {
        /// The node.
        node: String,
    },
    /// Remove both annotations [`NodeAction::DisableScaleDown`] set, in one patch.
    RestoreScaleDown {
        /// The node.
        node: String,
    },
}

impl NodeAction {
    /// The node the action concerns.
    pub fn node(&self) -> &str {
        match self {
            NodeAction::ApplyPlan { node, .. }
            | NodeAction::Cordon { node }
            | NodeAction::Uncordon { node }
            | NodeAction::DisableScaleDown { node }
            | NodeAction::RestoreScaleDown { node } => node,
        }
    }
}

/// Event severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Something expected happened.
    Normal,
    /// Something needs a look.
    Warning,
}

/// An Event to publish on the rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventNote {
    /// Normal or Warning.
    pub kind: EventKind,
    /// PascalCase reason.
    pub reason: String,
    /// What happened, in words.
    pub note: String,
    /// The reason of the same Event published on the Node and its plan too (`Inplace…`,
    /// [`node_event`]), for what a person looking at one node wants to see there
    /// (`kubectl describe node`); `None`: on the rollout only.
    pub on_node: Option<&'static str>,
    /// The node concerned, if any (becomes the Event's `related` object).
    pub node: Option<String>,
}

/// What the decision returns.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Writes to make, in order.
    pub actions: Vec<NodeAction>,
    /// The status to report.
    pub status: NodeRolloutStatus,
    /// Events to publish.
    pub events: Vec<EventNote>,
    /// Look again after this long even if nothing changes (drains in progress).
    pub requeue_after: Option<StdDuration>,
}

/// Where one owned node stands for the rollout's revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeState {
    /// The plan is not (yet) staged for the revision.
    Pending,
    /// Staged, waiting for a slot.
    Staged,
    /// Holding a slot.
    Updating,
    /// Runs the revision.
    Succeeded,
    /// Failed, rolled back or could not be drained.
    Failed { reason: String, message: String },
    /// Left at the revision it runs, not failed: skipped by a person (`steer.rs`) or by its
    /// drain's `onTimeout: Skip` (`drain.rs`).
    Skipped,
}

/// The kubectl-style ordering: control-plane nodes first, then by name. Activation slots
/// are granted in this order.
pub fn activation_order(a: &NodeView, b: &NodeView) -> std::cmp::Ordering {
    b.control_plane
        .cmp(&a.control_plane)
        .then_with(|| a.name.cmp(&b.name))
}

/// Resolves who owns a node: the rollout named on its plan while that rollout exists;
/// otherwise the first of the rollouts selecting the node, oldest first (`claimants` are
/// already in that order), so two rollouts never fight over a node.
pub fn resolve_ownership(
    this: &str,
    plan_exists: bool,
    plan_label: Option<&str>,
    existing_rollouts: &BTreeSet<String>,
    claimants: &[&str],
) -> Ownership {
    let owner = match plan_label {
        Some(label) if existing_rollouts.contains(label) => Some(label.to_owned()),
        Some(_) => None,
        None if plan_exists => {
            return Ownership::Other {
                owner: "a plan not written by a rollout".to_owned(),
            };
        }
        None => None,
    };
    let owner = owner.or_else(|| claimants.first().map(|c| (*c).to_owned()));
    match owner {
        Some(owner) if owner != this => Ownership::Other {
            owner: format!("rollout {owner:?}"),
        },
        _ => Ownership::Ours,
    }
}

/// The decision, in named phases, each pure and in its own file: the skew guard
/// (`version_skew.rs`), classify the nodes (`classify.rs`), find the nodes others took
/// down (`foreign.rs`), halt and grant slots (`grant.rs`), keep the autoscaler off nodes
/// holding a slot (`autoscaler.rs`), turn intents into writes (`actions.rs`), report
/// status, conditions and Events (`status.rs`). See the module documentation and
/// `docs/design/controller.md`.
pub fn decide(input: &RolloutInput<'_>) -> Decision {
    decide_with_memo(input, &mut DecisionMemo::default())
}

/// [`decide`], reusing what the last round found for every node whose view is unchanged
/// (`memo.rs`) and keeping what this round finds for the next: the same decision, at the
/// cost of the changed nodes plus a pass over the kept classes.
pub fn decide_with_memo(input: &RolloutInput<'_>, memo: &mut DecisionMemo) -> Decision {
    let mut decision = Decision {
        actions: Vec::new(),
        status: NodeRolloutStatus {
            observed_generation: input.generation,
            ..NodeRolloutStatus::default()
        },
        events: Vec::new(),
        requeue_after: None,
    };
    let (mut owned, refused): (Vec<&NodeView>, Vec<&NodeView>) = input
        .nodes
        .iter()
        .partition(|n| n.ownership == Ownership::Ours);
    match input.order {
        NodeOrder::Any => owned.sort_by(|a, b| activation_order(a, b)),
        NodeOrder::Activation => debug_assert!(
            owned.is_sorted_by(|a, b| activation_order(a, b).is_le()),
            "nodes said to be in activation order are not"
        ),
    }
    let refused_condition = status::refused_condition(&refused);
    // Checked here, not only by the API server: a rollout stored before a CEL rule (or by a
    // server without it) would otherwise be acted on as far as the decision can read it.
    if let Err(problems) = input.spec.validate() {
        status::rollout_invalid(
            input,
            owned.len(),
            refused_condition,
            &problems,
            &mut decision,
        );
        return decision;
    }
    let ReleaseState::Valid { revision } = &input.release else {
        status::release_not_usable(input, owned.len(), refused_condition, &mut decision);
        return decision;
    };
    if let Some(refusal) = version_skew::refusal(input, &owned) {
        status::nothing_touched(
            input,
            owned.len(),
            refused_condition,
            refusal.reason,
            refusal.message,
            &mut decision,
        );
        decision.requeue_after = refusal.recheck_after;
        return decision;
    }
    decision.status.revision = Some(revision.to_string());

    let mut nodes = classify::classify_nodes(input, &owned, revision, &mut decision.events, memo);
    let failures = grant::failures(&owned, &nodes.states);
    let halted = grant::is_halted(input.spec, &failures);
    let window = window::window_verdict(&input.spec.maintenance_windows, input.now);
    let mut health = health::health_verdict(input.spec, &owned, &nodes.states, &input.alerts);
    health.block(input.kured.as_ref().and_then(kured::KuredView::blocker));
    let kured_holders = input
        .kured
        .as_ref()
        .map(kured::KuredView::held_by_others)
        .unwrap_or_default();
    let (foreign, foreign_disruptions): (Vec<usize>, Vec<_>) = foreign::foreign_disruptions(
        input.spec,
        &owned,
        &nodes.states,
        &nodes.soaking,
        &kured_holders,
    )
    .into_iter()
    .unzip();
    let gate = grant::Gate {
        open: !input.spec.paused && !halted && window.allows_grants() && health.allows_grants(),
        soaking: &nodes.soaking,
        foreign: &foreign,
    };
    let grants = grant::grant_slots(
        input.spec,
        &gate,
        input.now,
        &owned,
        &mut nodes.states,
        &mut nodes.intents,
    );
    autoscaler::disable_scale_down(&owned, &nodes.states, &mut decision.actions);
    let staging_deferred =
        actions::node_actions(input.spec, &owned, &mut nodes, &grants, &mut decision, memo);
    autoscaler::restore_scale_down(&owned, &nodes.states, &mut decision.actions);
    let found = status::Found {
        revision,
        owned: &owned,
        states: &nodes.states,
        failures,
        halted,
        window: &window,
        health: &health,
        topology_waits: grants.topology_waits(&owned),
        soaking: nodes.soaking.len(),
        foreign: foreign_disruptions,
        any_refused: !refused.is_empty(),
        refused: refused_condition,
    };
    status::report_status(input, found, &mut decision);
    // A window that opens or closes, a soak that ends and a deadline that passes change
    // nothing the watches would see: the rollout asks to be looked at again then.
    let wake = nodes
        .wake_at
        .iter()
        .copied()
        .chain(window.changes_at())
        .filter_map(|at| at.duration_since(input.now).try_into().ok());
    decision.requeue_after = nodes
        .drains_pending
        .iter()
        .copied()
        .chain(wake)
        .chain(staging_deferred.then_some(STAGING_REQUEUE))
        .min();
    memo.end(nodes);
    decision
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Event reasons of a person's steering (`steer.rs`), on the rollout (and, mirrored, on the
/// Node and its plan).
pub const NODE_HELD: &str = "NodeHeld";
/// See [`NODE_HELD`].
pub const NODE_RELEASED: &str = "NodeReleased";
/// See [`NODE_HELD`].
pub const NODE_SKIPPED: &str = "NodeSkipped";

/// An Event about one node.
pub(crate) fn event(kind: EventKind, reason: &str, note: String, node: &str) -> EventNote {
    EventNote {
        kind,
        reason: reason.to_owned(),
        note,
        node: Some(node.to_owned()),
        on_node: None,
    }
}

impl EventNote {
    /// The same Event, also published on the Node and its plan with `reason`.
    pub(crate) fn on_node(mut self, reason: &'static str) -> EventNote {
        self.on_node = Some(reason);
        self
    }
}

/// The reasons of the Events on a Node and its plan (mirrors of the rollout's per-node
/// Events, so `kubectl describe node NAME` tells the node's own story).
pub mod node_event {
    /// Granted an activation slot (rollout: `ActivationStarted`).
    pub const ACTIVATED: &str = "InplaceActivated";
    /// Runs the rollout's release (rollout: `NodeUpdated`).
    pub const SUCCEEDED: &str = "InplaceSucceeded";
    /// Rolled back to what it ran before (rollout: the failure's reason).
    pub const ROLLED_BACK: &str = "InplaceRolledBack";
    /// Failed otherwise: refused, not drained, past its deadline, rollback failed.
    pub const FAILED: &str = "InplaceFailed";
    /// Held by a person (rollout: `NodeHeld`).
    pub const HELD: &str = "InplaceHeld";
    /// Released by a person (rollout: `NodeReleased`).
    pub const RELEASED: &str = "InplaceReleased";
    /// Skipped by a person (rollout: `NodeSkipped`).
    pub const SKIPPED: &str = "InplaceSkipped";
}

#[cfg(test)]
mod tests;
