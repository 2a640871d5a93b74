//! The rollout decision: one pure function from what the controller sees of one
//! NodeRollout (its spec, its release, its selected nodes with their plans, the result of
//! this round's drain pass, the time) to what it should do next (plan applies, cordons,
//! uncordons), the status it should report and the Events a person cares about.
//!
//! Nothing here performs I/O, so every rule of the rollout — slots never exceeded,
//! control-plane nodes first and one at a time, pause, halt past `maxFailures`, drain
//! timeouts, ownership — is unit-tested directly. `docs/design/controller.md` describes the
//! rules; `rollout_controller` gathers the inputs and carries out the actions.
//!
//! All of the rollout's per-node memory lives on the node's plan, written by the controller
//! itself (label and annotations below), so a restarted controller (or a new leader)
//! continues where the last one stopped.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration as StdDuration;

use inplace_proto::reason::{Reason, rollout_condition};
use inplace_proto::rollout_slots::activation_slots;
use inplace_proto::{
    AgentReport, DesiredState, Disruption, NodeCounts, NodeFailure, NodeRolloutSpec,
    NodeRolloutStatus, Outcome, Phase,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Label on a plan: the NodeRollout that owns it (a node has one owner).
pub const ROLLOUT_LABEL: &str = "inplace.dev/rollout";
/// Annotation on a plan: when the node was granted an activation slot (RFC 3339).
pub const GRANTED_ANNOTATION: &str = "inplace.dev/activation-granted";
/// Annotation on a plan: `"true"` while the controller holds the node cordoned. A node a
/// person cordoned never carries it, so the controller never uncordons it.
pub const CORDONED_ANNOTATION: &str = "inplace.dev/cordoned";
/// Annotation on a plan: the node could not be drained within `drainTimeout`; the value is
/// the message. Counts as a failure of this revision.
pub const DRAIN_TIMEOUT_ANNOTATION: &str = "inplace.dev/drain-timeout";
/// The label that marks control-plane nodes; they are activated first, one at a time.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Condition type on a NodeRollout: True when selected nodes were left out because another
/// rollout owns them (reason `NodeOwnedByOtherRollout`).
pub const NODES_REFUSED_CONDITION: &str = "NodesRefused";

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
        /// `revision_of(release.spec.content)`.
        revision: String,
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
    pub target_revision: Option<String>,
    /// The revision the node runs, committed.
    pub current_revision: Option<String>,
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
    /// `spec.revision`.
    pub revision: Option<String>,
    /// `spec.desiredState`.
    pub desired_state: DesiredState,
    /// [`GRANTED_ANNOTATION`].
    pub granted_at: Option<Timestamp>,
    /// [`CORDONED_ANNOTATION`].
    pub cordoned: bool,
    /// [`DRAIN_TIMEOUT_ANNOTATION`].
    pub drain_timeout: Option<String>,
    /// `spec.allowDowngrade`.
    pub allow_downgrade: bool,
    /// The status the agent wrote.
    pub report: PlanReport,
}

/// The result of this round's drain pass over one node (evictions sent, pods counted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainProgress {
    /// Pods that still have to leave the node (evicted or not yet).
    pub remaining: usize,
    /// Evictions refused (a PodDisruptionBudget, usually), one line per pod.
    pub blocked: Vec<String>,
}

/// One node the rollout's selector picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// The node's name (also its plan's name).
    pub name: String,
    /// Whether it carries [`CONTROL_PLANE_LABEL`].
    pub control_plane: bool,
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// Who owns its plan.
    pub ownership: Ownership,
    /// Its plan, when one exists.
    pub plan: Option<PlanView>,
    /// This round's drain pass, when [`needs_drain_pass`] asked for one.
    pub drain: Option<DrainProgress>,
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
    /// The selected nodes, in any order.
    pub nodes: Vec<NodeView>,
    /// The time of this round.
    pub now: Timestamp,
}

/// The controller-owned part of a plan: what the controller applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanIntent {
    /// `spec.revision` (the content is copied from the release alongside).
    pub revision: String,
    /// `spec.desiredState`.
    pub desired_state: DesiredState,
    /// [`GRANTED_ANNOTATION`].
    pub granted_at: Option<Timestamp>,
    /// [`CORDONED_ANNOTATION`].
    pub cordoned: bool,
    /// [`DRAIN_TIMEOUT_ANNOTATION`].
    pub drain_timeout: Option<String>,
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
}

impl NodeAction {
    /// The node the action concerns.
    pub fn node(&self) -> &str {
        match self {
            NodeAction::ApplyPlan { node, .. }
            | NodeAction::Cordon { node }
            | NodeAction::Uncordon { node } => node,
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

/// Whether this round should run a drain pass (evictions) over `node` before deciding:
/// the node holds a slot for `revision` under `disruption: Drain`, is cordoned, its plan
/// is not active yet and its drain has not timed out.
pub fn needs_drain_pass(spec: &NodeRolloutSpec, release: &ReleaseState, node: &NodeView) -> bool {
    let ReleaseState::Valid { revision } = release else {
        return false;
    };
    let Some(plan) = &node.plan else {
        return false;
    };
    spec.disruption == Disruption::Drain
        && node.ownership == Ownership::Ours
        && node.unschedulable
        && plan.revision.as_deref() == Some(revision)
        && plan.granted_at.is_some()
        && plan.drain_timeout.is_none()
        && plan.desired_state == DesiredState::Staged
        && !matches!(classify(plan, revision), Some(NodeState::Failed { .. }))
}

/// Classifies a plan that carries `revision` by the agent's report and the controller's
/// own annotations. `None` when the plan is for another revision.
pub(crate) fn classify(plan: &PlanView, revision: &str) -> Option<NodeState> {
    if plan.revision.as_deref() != Some(revision) {
        return None;
    }
    let report = &plan.report;
    let outcome = report.outcome_for(revision);
    if outcome == Outcome::Reached {
        return Some(NodeState::Succeeded);
    }
    if let Some(message) = &plan.drain_timeout {
        return Some(NodeState::Failed {
            reason: Reason::DrainTimeout.as_str().to_owned(),
            message: message.clone(),
        });
    }
    if let Outcome::Failed(phase) = outcome {
        let fallback = if phase == Phase::RolledBack {
            Reason::RolledBack
        } else {
            Reason::RevisionDenied
        };
        return Some(NodeState::Failed {
            reason: report
                .reason
                .clone()
                .unwrap_or_else(|| fallback.as_str().to_owned()),
            message: report
                .message
                .clone()
                .unwrap_or_else(|| format!("the agent reports {phase:?}")),
        });
    }
    if plan.granted_at.is_some() {
        return Some(NodeState::Updating);
    }
    if outcome == Outcome::Working(Phase::Staged) {
        return Some(NodeState::Staged);
    }
    Some(NodeState::Pending)
}

/// Whether the agent is in the middle of a disruptive step, whatever revision: such a node
/// takes a slot even if its plan has moved on (it finishes its atomic step first).
pub(crate) fn busy_elsewhere(plan: &PlanView) -> bool {
    plan.report.phase.is_some_and(Phase::is_disruptive)
}

/// Whether a failure leaves the node needing a person, in which case it stays cordoned.
pub(crate) fn keeps_cordon(state: &NodeState) -> bool {
    matches!(state, NodeState::Failed { reason, .. } if reason == Reason::RollbackFailed.as_str())
}

/// The decision. See the module documentation and `docs/design/controller.md`.
pub fn decide(input: &RolloutInput<'_>) -> Decision {
    let mut decision = Decision {
        actions: Vec::new(),
        status: NodeRolloutStatus {
            observed_generation: input.generation,
            ..NodeRolloutStatus::default()
        },
        events: Vec::new(),
        requeue_after: None,
    };
    let (owned, refused): (Vec<&NodeView>, Vec<&NodeView>) = input
        .nodes
        .iter()
        .partition(|n| n.ownership == Ownership::Ours);
    let mut owned = owned;
    owned.sort_by(|a, b| activation_order(a, b));

    let refused_condition = refused_condition(&refused);
    let revision = match &input.release {
        ReleaseState::Valid { revision } => revision.clone(),
        ReleaseState::Missing | ReleaseState::Invalid { .. } => {
            let (reason, message) = match &input.release {
                ReleaseState::Invalid { message } => (
                    Reason::ReleaseInvalid,
                    format!(
                        "release {:?} is not valid: {message}; no node is touched",
                        input.spec.release
                    ),
                ),
                _ => (
                    Reason::ReleaseNotFound,
                    format!(
                        "release {:?} does not exist; no node is touched until it does",
                        input.spec.release
                    ),
                ),
            };
            decision.status.nodes = NodeCounts {
                total: count(owned.len()),
                pending: count(owned.len()),
                ..NodeCounts::default()
            };
            let conditions = vec![
                ("Progressing", false, reason, message.clone()),
                ("Complete", false, reason, message.clone()),
                ("Halted", false, Reason::AsExpected, String::new()),
                refused_condition,
            ];
            finish_conditions(input, &mut decision, conditions);
            return decision;
        }
    };
    decision.status.revision = Some(revision.clone());

    // Classify every owned node and work out what each plan should say.
    let mut states: Vec<NodeState> = Vec::with_capacity(owned.len());
    let mut intents: Vec<PlanIntent> = Vec::with_capacity(owned.len());
    let mut drains_pending: Vec<StdDuration> = Vec::new();
    let drain_timeout =
        SignedDuration::try_from(input.spec.drain_timeout.get()).unwrap_or(SignedDuration::MAX);
    for node in &owned {
        let plan = node.plan.as_ref();
        let mut state = plan
            .and_then(|p| classify(p, &revision))
            .unwrap_or(NodeState::Pending);
        if state == NodeState::Pending && plan.is_some_and(busy_elsewhere) {
            state = NodeState::Updating;
        }
        let current = plan.filter(|p| p.revision.as_deref() == Some(revision.as_str()));
        let mut intent = PlanIntent {
            revision: revision.clone(),
            desired_state: current.map_or(DesiredState::Staged, |p| p.desired_state),
            granted_at: current.and_then(|p| p.granted_at),
            cordoned: plan.is_some_and(|p| p.cordoned),
            drain_timeout: current.and_then(|p| p.drain_timeout.clone()),
            allow_downgrade: input.spec.allow_downgrade,
        };
        // A granted node still waiting for its drain: done, or out of time?
        if state == NodeState::Updating
            && let Some(granted_at) = intent.granted_at
            && intent.desired_state == DesiredState::Staged
            && input.spec.disruption == Disruption::Drain
        {
            let drained = node.drain.as_ref().is_some_and(|d| d.remaining == 0);
            let deadline = granted_at
                .saturating_add(drain_timeout)
                .unwrap_or(granted_at);
            if drained {
                intent.desired_state = DesiredState::Active;
                decision.events.push(EventNote {
                    kind: EventKind::Normal,
                    reason: "Drained".to_owned(),
                    note: format!("node {} drained; activating", node.name),
                    node: Some(node.name.clone()),
                });
            } else if input.now >= deadline {
                let blocked = node
                    .drain
                    .as_ref()
                    .filter(|d| !d.blocked.is_empty())
                    .map(|d| format!(": {}", d.blocked.join("; ")))
                    .unwrap_or_default();
                let message = format!(
                    "node {} not drained within {}{blocked}",
                    node.name,
                    input.spec.drain_timeout.as_str()
                );
                intent.drain_timeout = Some(message.clone());
                state = NodeState::Failed {
                    reason: Reason::DrainTimeout.as_str().to_owned(),
                    message,
                };
            } else {
                let left = (deadline.duration_since(input.now)).unsigned_abs();
                drains_pending.push(left.min(DRAIN_RETRY).max(StdDuration::from_millis(100)));
                if let Some(drain) = node.drain.as_ref().filter(|d| !d.blocked.is_empty()) {
                    decision.events.push(EventNote {
                        kind: EventKind::Warning,
                        reason: "EvictionBlocked".to_owned(),
                        note: format!("draining node {}: {}", node.name, drain.blocked.join("; ")),
                        node: Some(node.name.clone()),
                    });
                }
            }
        }
        states.push(state);
        intents.push(intent);
    }

    // Counts, failures and the halt rule.
    let failures: Vec<NodeFailure> = owned
        .iter()
        .zip(&states)
        .filter_map(|(node, state)| match state {
            NodeState::Failed { reason, message } => Some(NodeFailure {
                node: node.name.clone(),
                reason: reason.clone(),
                message: message.clone(),
            }),
            _ => None,
        })
        .collect();
    let halted = failures.len() > usize::try_from(input.spec.max_failures).unwrap_or(0);
    let slots = activation_slots(&input.spec.max_unavailable, owned.len());

    // Grant slots: control-plane nodes one at a time, before any other node.
    let holders = states.iter().filter(|s| **s == NodeState::Updating).count();
    let mut granted_now: Vec<usize> = Vec::new();
    if !input.spec.paused && !halted && holders < slots {
        let cp_unfinished = owned.iter().zip(&states).any(|(n, s)| {
            n.control_plane && !matches!(s, NodeState::Succeeded | NodeState::Failed { .. })
        });
        let free = slots - holders;
        if cp_unfinished {
            // One at a time, and nothing else activating meanwhile.
            if holders == 0
                && let Some(i) = (0..owned.len())
                    .find(|&i| owned[i].control_plane && states[i] == NodeState::Staged)
            {
                granted_now.push(i);
            }
        } else {
            granted_now.extend(
                (0..owned.len())
                    .filter(|&i| states[i] == NodeState::Staged)
                    .take(free),
            );
        }
    }
    // For each node, its rank among this round's grants (1-based), if granted now.
    let mut grant_rank: Vec<Option<usize>> = vec![None; owned.len()];
    for (rank, &i) in granted_now.iter().enumerate() {
        grant_rank[i] = Some(rank + 1);
    }
    for &i in &granted_now {
        states[i] = NodeState::Updating;
        let intent = &mut intents[i];
        intent.granted_at = Some(input.now);
        intent.desired_state = match input.spec.disruption {
            Disruption::None | Disruption::Cordon => DesiredState::Active,
            Disruption::Drain => DesiredState::Staged,
        };
    }

    // Turn intents into actions, node by node in activation order.
    let staging_limit = staging_batch(slots);
    let mut staging_started = 0;
    let mut staging_deferred = false;
    for (i, node) in owned.iter().enumerate() {
        let state = &states[i];
        let intent = &mut intents[i];
        let newly_granted = grant_rank[i].is_some();
        let actions_before = decision.actions.len();
        let wants_cordon = *state == NodeState::Updating
            && intent.granted_at.is_some()
            && input.spec.disruption != Disruption::None;
        let mut written = node.plan.clone();
        if wants_cordon {
            if !intent.cordoned && !node.unschedulable {
                // Record the cordon before making it, so a crash in between can't leave a
                // node cordoned with nobody remembering why.
                intent.cordoned = true;
                let mut record = intent.clone();
                record.desired_state = DesiredState::Staged;
                if plan_differs(written.as_ref(), &record) {
                    decision.actions.push(NodeAction::ApplyPlan {
                        node: node.name.clone(),
                        intent: record.clone(),
                    });
                    written = Some(view_of(&record));
                }
                decision.actions.push(cordon(node));
                decision.events.push(event(
                    EventKind::Normal,
                    "Cordoned",
                    format!("node {} cordoned for activation", node.name),
                    &node.name,
                ));
            } else if intent.cordoned && !node.unschedulable {
                decision.actions.push(cordon(node));
            }
        } else if intent.cordoned && *state != NodeState::Updating && !keeps_cordon(state) {
            if node.unschedulable {
                decision.actions.push(NodeAction::Uncordon {
                    node: node.name.clone(),
                });
                decision.events.push(event(
                    EventKind::Normal,
                    "Uncordoned",
                    format!("node {} uncordoned", node.name),
                    &node.name,
                ));
            }
            intent.cordoned = false;
        }
        if plan_differs(written.as_ref(), intent) {
            // Only a plain "start staging" write waits for a later round; a node with
            // anything else to do this round (a cordon to undo) gets its plan written too.
            let starts_staging = *state == NodeState::Pending
                && decision.actions.len() == actions_before
                && written
                    .as_ref()
                    .is_none_or(|p| p.revision.as_deref() != Some(intent.revision.as_str()));
            if starts_staging && staging_started == staging_limit {
                staging_deferred = true;
            } else {
                staging_started += usize::from(starts_staging);
                decision.actions.push(NodeAction::ApplyPlan {
                    node: node.name.clone(),
                    intent: intent.clone(),
                });
            }
        }
        if newly_granted {
            decision.events.push(event(
                EventKind::Normal,
                "ActivationStarted",
                format!(
                    "node {} granted an activation slot ({} of {slots} in use)",
                    node.name,
                    holders + grant_rank[i].unwrap_or(1)
                ),
                &node.name,
            ));
        }
    }

    // Status: counts, active and failed nodes.
    let mut counts = NodeCounts {
        total: count(owned.len()),
        ..NodeCounts::default()
    };
    for (node, state) in owned.iter().zip(&states) {
        match state {
            NodeState::Pending => counts.pending += 1,
            NodeState::Staged => counts.staged += 1,
            NodeState::Updating => {
                counts.updating += 1;
                decision.status.active_nodes.push(node.name.clone());
            }
            NodeState::Succeeded => counts.succeeded += 1,
            NodeState::Failed { .. } => counts.failed += 1,
        }
    }
    decision.status.nodes = counts.clone();
    decision.status.failed_nodes = failures.clone();
    transition_events(input, &owned, &states, &mut decision);

    // Conditions.
    let summary = format!(
        "{} of {} nodes updated, {} activating, {} staged, {} pending, {} failed",
        counts.succeeded,
        counts.total,
        counts.updating,
        counts.staged,
        counts.pending,
        counts.failed
    );
    let halted_message = if halted {
        format!(
            "{} nodes failed, more than maxFailures {}: {}",
            failures.len(),
            input.spec.max_failures,
            failures
                .iter()
                .map(|f| format!("{} ({}: {})", f.node, f.reason, f.message))
                .collect::<Vec<_>>()
                .join("; ")
        )
    } else {
        String::new()
    };
    let all_final = counts.succeeded + counts.failed == counts.total;
    let conditions = if counts.total == 0 {
        let message = if refused.is_empty() {
            "the node selector matches no node: nothing to do".to_owned()
        } else {
            "every node the selector matches is owned by another rollout: nothing to do".to_owned()
        };
        vec![
            (
                "Progressing",
                false,
                Reason::NoNodesSelected,
                message.clone(),
            ),
            ("Complete", true, Reason::NoNodesSelected, message),
            ("Halted", false, Reason::AsExpected, String::new()),
            refused_condition,
        ]
    } else if halted {
        vec![
            (
                "Progressing",
                false,
                Reason::TooManyFailures,
                halted_message.clone(),
            ),
            ("Complete", false, Reason::TooManyFailures, summary.clone()),
            ("Halted", true, Reason::TooManyFailures, halted_message),
            refused_condition,
        ]
    } else if counts.succeeded == counts.total {
        let message = format!(
            "all {} nodes run release {:?} (revision {revision})",
            counts.total, input.spec.release
        );
        vec![
            (
                "Progressing",
                false,
                Reason::AllNodesUpdated,
                message.clone(),
            ),
            ("Complete", true, Reason::AllNodesUpdated, message),
            ("Halted", false, Reason::AsExpected, String::new()),
            refused_condition,
        ]
    } else if all_final {
        let message = format!(
            "nothing left to activate: {summary} (within maxFailures {})",
            input.spec.max_failures
        );
        vec![
            ("Progressing", false, Reason::RollingOut, message.clone()),
            ("Complete", false, Reason::RollingOut, message),
            ("Halted", false, Reason::AsExpected, String::new()),
            refused_condition,
        ]
    } else if input.spec.paused {
        let message = format!("paused: {summary}; staging goes on, no new activations");
        vec![
            ("Progressing", false, Reason::Paused, message.clone()),
            ("Complete", false, Reason::Paused, message),
            ("Halted", false, Reason::AsExpected, String::new()),
            refused_condition,
        ]
    } else {
        vec![
            ("Progressing", true, Reason::RollingOut, summary.clone()),
            ("Complete", false, Reason::RollingOut, summary),
            ("Halted", false, Reason::AsExpected, String::new()),
            refused_condition,
        ]
    };
    finish_conditions(input, &mut decision, conditions);
    decision.requeue_after = drains_pending
        .into_iter()
        .chain(staging_deferred.then_some(STAGING_REQUEUE))
        .min();
    decision
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn cordon(node: &NodeView) -> NodeAction {
    NodeAction::Cordon {
        node: node.name.clone(),
    }
}

/// An Event about one node.
pub(crate) fn event(kind: EventKind, reason: &str, note: String, node: &str) -> EventNote {
    EventNote {
        kind,
        reason: reason.to_owned(),
        note,
        node: Some(node.to_owned()),
    }
}

/// The controller-owned fields a plan has after `intent` was applied.
fn view_of(intent: &PlanIntent) -> PlanView {
    PlanView {
        revision: Some(intent.revision.clone()),
        desired_state: intent.desired_state,
        granted_at: intent.granted_at,
        cordoned: intent.cordoned,
        drain_timeout: intent.drain_timeout.clone(),
        allow_downgrade: intent.allow_downgrade,
        report: PlanReport::default(),
    }
}

/// Whether the plan as it stands differs from what the controller wants it to say.
fn plan_differs(plan: Option<&PlanView>, intent: &PlanIntent) -> bool {
    let Some(plan) = plan else {
        return true;
    };
    plan.revision.as_deref() != Some(intent.revision.as_str())
        || plan.desired_state != intent.desired_state
        || plan.granted_at != intent.granted_at
        || plan.cordoned != intent.cordoned
        || plan.drain_timeout != intent.drain_timeout
        || plan.allow_downgrade != intent.allow_downgrade
}

type ConditionSpec = (&'static str, bool, Reason, String);

fn refused_condition(refused: &[&NodeView]) -> ConditionSpec {
    if refused.is_empty() {
        return (
            NODES_REFUSED_CONDITION,
            false,
            Reason::AsExpected,
            String::new(),
        );
    }
    let mut names: Vec<String> = refused
        .iter()
        .map(|n| match &n.ownership {
            Ownership::Other { owner } => format!("{} (owned by {owner})", n.name),
            Ownership::Ours => n.name.clone(),
        })
        .collect();
    names.sort();
    (
        NODES_REFUSED_CONDITION,
        true,
        Reason::NodeOwnedByOtherRollout,
        format!(
            "{} selected nodes left out, a node has one owner: {}",
            names.len(),
            names.join(", ")
        ),
    )
}

/// Builds the conditions (keeping `lastTransitionTime` when the status did not change)
/// and the Events for condition transitions.
fn finish_conditions(
    input: &RolloutInput<'_>,
    decision: &mut Decision,
    conditions: Vec<ConditionSpec>,
) {
    let previous = input
        .previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or(&[]);
    let find = |type_: &str| previous.iter().find(|c| c.type_ == type_);
    for (type_, status, reason, message) in conditions {
        let status_text = if status { "True" } else { "False" };
        let before = find(type_);
        let changed = before.is_none_or(|c| c.status != status_text);
        let reason_changed = before.is_none_or(|c| c.reason != reason.as_str());
        let last_transition_time = match before {
            Some(c) if !changed => c.last_transition_time.clone(),
            _ => Time(input.now),
        };
        if (reason_changed || changed)
            && let Some(note) = condition_event(type_, status, reason, &message, before)
        {
            decision.events.push(note);
        }
        decision.status.conditions.push(Condition {
            type_: type_.to_owned(),
            status: status_text.to_owned(),
            reason: reason.as_str().to_owned(),
            message,
            observed_generation: input.generation,
            last_transition_time,
        });
    }
}

fn condition_event(
    type_: &str,
    status: bool,
    reason: Reason,
    message: &str,
    before: Option<&Condition>,
) -> Option<EventNote> {
    let note = |kind, reason: &str| EventNote {
        kind,
        reason: reason.to_owned(),
        note: message.to_owned(),
        node: None,
    };
    match (type_, status, reason) {
        (rollout_condition::HALTED, true, _) => Some(note(EventKind::Warning, "Halted")),
        (rollout_condition::COMPLETE, true, _) => Some(note(EventKind::Normal, reason.as_str())),
        (rollout_condition::PROGRESSING, _, Reason::ReleaseNotFound | Reason::ReleaseInvalid) => {
            Some(note(EventKind::Warning, reason.as_str()))
        }
        (rollout_condition::PROGRESSING, false, Reason::Paused) => {
            Some(note(EventKind::Normal, "Paused"))
        }
        (rollout_condition::PROGRESSING, true, Reason::RollingOut) => {
            let resumed = before.is_some_and(|c| c.reason == Reason::Paused.as_str());
            Some(note(
                EventKind::Normal,
                if resumed { "Resumed" } else { "RollingOut" },
            ))
        }
        (NODES_REFUSED_CONDITION, true, _) => Some(note(EventKind::Warning, reason.as_str())),
        _ => None,
    }
}

/// Events for nodes that finished since the previous status: updated, or failed.
fn transition_events(
    input: &RolloutInput<'_>,
    owned: &[&NodeView],
    states: &[NodeState],
    decision: &mut Decision,
) {
    let previous_active: BTreeSet<&str> = input
        .previous
        .map(|p| p.active_nodes.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let previous_failed: BTreeMap<&str, &str> = input
        .previous
        .map(|p| {
            p.failed_nodes
                .iter()
                .map(|f| (f.node.as_str(), f.reason.as_str()))
                .collect()
        })
        .unwrap_or_default();
    for (node, state) in owned.iter().zip(states) {
        match state {
            NodeState::Succeeded if previous_active.contains(node.name.as_str()) => {
                decision.events.push(event(
                    EventKind::Normal,
                    "NodeUpdated",
                    format!("node {} runs the new revision", node.name),
                    &node.name,
                ));
            }
            NodeState::Failed { reason, message }
                if previous_failed.get(node.name.as_str()) != Some(&reason.as_str()) =>
            {
                decision.events.push(event(
                    EventKind::Warning,
                    reason,
                    format!("node {} failed: {message}", node.name),
                    &node.name,
                ));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
