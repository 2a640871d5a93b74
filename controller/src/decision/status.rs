//! Phase 5 of the decision: the rollout's status — node counts, active and failed nodes,
//! the conditions `Progressing` (which also says why no activation starts: paused, a
//! maintenance window, a health gate; and which nodes wait for a full topology group),
//! `Complete`, `Halted`, `NodesRefused` and `NodesUnsupported` (through proto's
//! one condition setter, which keeps `lastTransitionTime` while a status holds) — and the
//! Events for nodes that finished and conditions that changed.

use std::collections::BTreeMap;

use inplace_proto::condition::{self, ConditionUpdate, status_text};
use inplace_proto::reason::{Reason, rollout_condition};
use inplace_proto::{ForeignDisruption, NodeCounts, NodeFailure};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::health::HealthVerdict;
use super::node_events;
use super::window::WindowVerdict;
use super::{
    Decision, EventKind, EventNote, NodeState, NodeView, Ownership, ReleaseState, RolloutInput,
    count,
};

/// The status of a rollout whose spec breaks a rule (`NodeRolloutSpec::validate`): every
/// owned node pending, nothing touched, every problem in the message.
pub(super) fn rollout_invalid(
    input: &RolloutInput<'_>,
    owned: usize,
    refused: ConditionUpdate,
    problems: &inplace_proto::Problems,
    decision: &mut Decision,
) {
    let message = format!("the rollout is not valid: {problems}; no node is touched");
    nothing_touched(
        input,
        owned,
        refused,
        Reason::InvalidRollout,
        message,
        decision,
    );
}

/// The status of a rollout whose release is missing or invalid: every owned node pending,
/// nothing touched.
pub(super) fn release_not_usable(
    input: &RolloutInput<'_>,
    owned: usize,
    refused: ConditionUpdate,
    decision: &mut Decision,
) {
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
    nothing_touched(input, owned, refused, reason, message, decision);
}

/// The status of a rollout that touches no node for `reason` (its release is missing or
/// invalid, the skew guard refuses it, or the rollout is invalid): every owned node pending.
pub(super) fn nothing_touched(
    input: &RolloutInput<'_>,
    owned: usize,
    refused: ConditionUpdate,
    reason: Reason,
    message: String,
    decision: &mut Decision,
) {
    decision.status.nodes = NodeCounts {
        total: count(owned),
        pending: count(owned),
        ..NodeCounts::default()
    };
    let conditions = vec![
        ConditionUpdate::new(
            rollout_condition::PROGRESSING,
            false,
            reason,
            message.clone(),
        ),
        ConditionUpdate::new(rollout_condition::COMPLETE, false, reason, message),
        not_halted(),
        refused,
        super::architecture::unsupported_condition(input, &[], &[]),
    ];
    finish_conditions(input, decision, conditions);
}

/// What the round found, for the status.
pub(super) struct Found<'a> {
    /// The rollout's revision.
    pub revision: &'a str,
    /// The owned nodes, in activation order.
    pub owned: &'a [&'a NodeView],
    /// Their states after this round's grants.
    pub states: &'a [NodeState],
    /// The failed nodes.
    pub failures: Vec<NodeFailure>,
    /// Whether the rollout halts.
    pub halted: bool,
    /// What the maintenance windows say.
    pub window: &'a WindowVerdict,
    /// What the health gates say.
    pub health: &'a HealthVerdict,
    /// Staged nodes passed over because their topology group was full, by group value.
    pub topology_waits: BTreeMap<String, Vec<String>>,
    /// Succeeded nodes still soaking for `minReadySeconds`.
    pub soaking: usize,
    /// Nodes others took down, each occupying a slot (`foreign.rs`).
    pub foreign: Vec<ForeignDisruption>,
    /// Whether selected nodes were left out (owned by another rollout).
    pub any_refused: bool,
    /// The `NodesRefused` condition.
    pub refused: ConditionUpdate,
}

/// Writes counts, active and failed nodes and conditions into the decision's status, with
/// the Events of nodes that finished and of conditions that changed.
pub(super) fn report_status(input: &RolloutInput<'_>, found: Found<'_>, decision: &mut Decision) {
    let mut counts = NodeCounts {
        total: count(found.owned.len()),
        ..NodeCounts::default()
    };
    for (node, state) in found.owned.iter().zip(found.states) {
        match state {
            NodeState::Pending => counts.pending += 1,
            NodeState::Staged => counts.staged += 1,
            NodeState::Updating => {
                counts.updating += 1;
                decision.status.active_nodes.push(node.name.clone());
            }
            NodeState::Succeeded => counts.succeeded += 1,
            NodeState::Failed { .. } => counts.failed += 1,
            NodeState::Skipped => {
                counts.skipped += 1;
                decision.status.skipped_nodes.push(node.name.clone());
            }
        }
        if node.steering.hold && *state != NodeState::Skipped {
            decision.status.held_nodes.push(node.name.clone());
        }
    }
    node_events::transition_events(input, found.owned, found.states, &found.failures, decision);
    node_events::steering_events(input, decision);
    if let WindowVerdict::Closed { opens_at, .. } = found.window {
        decision.status.next_window_opens_at = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(*opens_at),
        );
    }
    let mut conditions = rollout_conditions(input, &found, &counts);
    conditions.push(found.refused);
    conditions.push(super::architecture::unsupported_condition(
        input,
        found.owned,
        found.states,
    ));
    decision.status.foreign_disruptions = found.foreign;
    decision.status.nodes = counts;
    decision.status.failed_nodes = found.failures;
    finish_conditions(input, decision, conditions);
}

/// `Progressing`, `Complete` and `Halted` for a rollout with a valid release (the table
/// in `docs/design/controller.md` § Conditions).
fn rollout_conditions(
    input: &RolloutInput<'_>,
    found: &Found<'_>,
    counts: &NodeCounts,
) -> Vec<ConditionUpdate> {
    let spec = input.spec;
    let mut summary = format!(
        "{} of {} nodes updated, {} activating, {} staged, {} pending, {} failed",
        counts.succeeded,
        counts.total,
        counts.updating,
        counts.staged,
        counts.pending,
        counts.failed
    );
    if found.soaking > 0 {
        summary.push_str(&format!(
            ", {} soaking for minReadySeconds {}",
            found.soaking, spec.min_ready_seconds
        ));
    }
    let held = found
        .owned
        .iter()
        .zip(found.states)
        .filter(|(n, s)| n.steering.hold && **s != NodeState::Skipped)
        .count();
    for (n, what) in [(held, "held"), (count_usize(counts.skipped), "skipped")] {
        if n > 0 {
            summary.push_str(&format!(", {n} {what}"));
        }
    }
    let finished = counts.succeeded + counts.skipped;
    summary.push_str(&super::foreign::summary_note(&found.foreign));
    summary.push_str(&topology_waits(spec, &found.topology_waits));
    let (progressing, complete, reason, message) = if counts.total == 0 {
        let message = if found.any_refused {
            "every node the selector matches is owned by another rollout: nothing to do"
        } else {
            "the node selector matches no node: nothing to do"
        };
        (false, true, Reason::NoNodesSelected, message.to_owned())
    } else if found.halted {
        let failed: Vec<String> = found
            .failures
            .iter()
            .map(|f| format!("{} ({}: {})", f.node, f.reason, f.message))
            .collect();
        let message = format!(
            "{} nodes failed, more than maxFailures {}: {}",
            found.failures.len(),
            spec.max_failures,
            failed.join("; ")
        );
        let reason = Reason::TooManyFailures;
        return vec![
            ConditionUpdate::new(
                rollout_condition::PROGRESSING,
                false,
                reason,
                message.clone(),
            ),
            ConditionUpdate::new(rollout_condition::COMPLETE, false, reason, summary),
            ConditionUpdate::new(rollout_condition::HALTED, true, reason, message),
        ];
    } else if finished == counts.total {
        let skipped = if counts.skipped > 0 {
            format!(
                "; {} skipped nodes keep the revision they run",
                counts.skipped
            )
        } else {
            String::new()
        };
        let message = format!(
            "all {} nodes run release {:?} (revision {}){skipped}",
            counts.succeeded, spec.release, found.revision
        );
        (false, true, Reason::AllNodesUpdated, message)
    } else if finished + counts.failed == counts.total {
        let message = format!(
            "nothing left to activate: {summary} (within maxFailures {})",
            spec.max_failures
        );
        (false, false, Reason::RollingOut, message)
    } else if let WindowVerdict::Invalid { message } = found.window {
        let message = format!("{message}; no new activations: {summary}");
        (false, false, Reason::InvalidMaintenanceWindow, message)
    } else if spec.paused {
        let message = format!("paused: {summary}; staging goes on, no new activations");
        (false, false, Reason::Paused, message)
    } else if let WindowVerdict::Closed { opens_at, local } = found.window {
        let message = format!(
            "outside every maintenance window until {opens_at} ({local}): {summary}; \
             staging goes on, activations already started finish"
        );
        (false, false, Reason::OutsideMaintenanceWindow, message)
    } else if let Some((reason, why)) = found.health.blocked() {
        let message = format!(
            "{why}; no new activations: {summary}; staging goes on, activations already started finish"
        );
        (false, false, reason, message)
    } else {
        (true, false, Reason::RollingOut, summary)
    };
    vec![
        ConditionUpdate::new(
            rollout_condition::PROGRESSING,
            progressing,
            reason,
            message.clone(),
        ),
        ConditionUpdate::new(rollout_condition::COMPLETE, complete, reason, message),
        not_halted(),
    ]
}

fn count_usize(n: i32) -> usize {
    usize::try_from(n).unwrap_or(0)
}

/// The summary's note on nodes waiting for room in their topology group, e.g.
/// `, waiting for room in topology.kubernetes.io/zone=b (maxUnavailablePerTopology.max 1): b-2`.
fn topology_waits(
    spec: &inplace_proto::NodeRolloutSpec,
    waits: &BTreeMap<String, Vec<String>>,
) -> String {
    let Some(spread) = &spec.max_unavailable_per_topology else {
        return String::new();
    };
    waits
        .iter()
        .map(|(group, nodes)| {
            let group = if group.is_empty() {
                format!("the group without {}", spread.key)
            } else {
                format!("{}={group}", spread.key)
            };
            format!(
                ", waiting for room in {group} (maxUnavailablePerTopology.max {}): {}",
                spread.max,
                nodes.join(", ")
            )
        })
        .collect()
}

fn not_halted() -> ConditionUpdate {
    ConditionUpdate::new(rollout_condition::HALTED, false, Reason::AsExpected, "")
}

/// The `NodesRefused` condition: True, naming every selected node another rollout owns.
pub(super) fn refused_condition(refused: &[&NodeView]) -> ConditionUpdate {
    if refused.is_empty() {
        return ConditionUpdate::new(
            rollout_condition::NODES_REFUSED,
            false,
            Reason::AsExpected,
            "",
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
    ConditionUpdate::new(
        rollout_condition::NODES_REFUSED,
        true,
        Reason::NodeOwnedByOtherRollout,
        format!(
            "{} selected nodes left out, a node has one owner: {}",
            names.len(),
            names.join(", ")
        ),
    )
}

/// Writes the conditions (proto's setter keeps `lastTransitionTime` while a status holds)
/// and the Events for condition transitions.
fn finish_conditions(
    input: &RolloutInput<'_>,
    decision: &mut Decision,
    conditions: Vec<ConditionUpdate>,
) {
    let previous = input
        .previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or(&[]);
    for update in conditions {
        let before = condition::find(previous, update.type_);
        let changed = before.is_none_or(|c| c.status != status_text(update.status));
        let reason_changed = before.is_none_or(|c| c.reason != update.reason.as_str());
        if (reason_changed || changed)
            && let Some(note) = condition_event(&update, before)
        {
            decision.events.push(note);
        }
        decision.status.conditions.push(update.into_condition(
            previous,
            input.generation,
            input.now,
        ));
    }
}

fn condition_event(update: &ConditionUpdate, before: Option<&Condition>) -> Option<EventNote> {
    let note = |kind, reason: &str| EventNote {
        kind,
        reason: reason.to_owned(),
        note: update.message.clone(),
        node: None,
        on_node: None,
    };
    let reason = update.reason;
    match (update.type_, update.status, reason) {
        (rollout_condition::HALTED, true, _) => Some(note(EventKind::Warning, "Halted")),
        (rollout_condition::COMPLETE, true, _) => Some(note(EventKind::Normal, reason.as_str())),
        (
            rollout_condition::PROGRESSING,
            _,
            Reason::ReleaseNotFound
            | Reason::ReleaseInvalid
            | Reason::VersionSkewDenied
            | Reason::DowngradeDenied
            | Reason::InvalidRollout,
        ) => Some(note(EventKind::Warning, reason.as_str())),
        (rollout_condition::PROGRESSING, false, Reason::Paused) => {
            Some(note(EventKind::Normal, "Paused"))
        }
        (rollout_condition::PROGRESSING, false, Reason::OutsideMaintenanceWindow) => {
            Some(note(EventKind::Normal, reason.as_str()))
        }
        (
            rollout_condition::PROGRESSING,
            false,
            Reason::InvalidMaintenanceWindow
            | Reason::NodeNotReady
            | Reason::AlertFiring
            | Reason::GateUnavailable
            | Reason::RebootLockHeld,
        ) => Some(note(EventKind::Warning, reason.as_str())),
        (rollout_condition::PROGRESSING, true, Reason::RollingOut) => {
            let resumed = before.is_some_and(|c| c.reason == Reason::Paused.as_str());
            Some(note(
                EventKind::Normal,
                if resumed { "Resumed" } else { "RollingOut" },
            ))
        }
        (rollout_condition::NODES_REFUSED | rollout_condition::NODES_UNSUPPORTED, true, _) => {
            Some(note(EventKind::Warning, reason.as_str()))
        }
        _ => None,
    }
}
