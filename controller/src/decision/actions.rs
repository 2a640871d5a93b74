//! Phase 4 of the decision: turn each node's state and intent into writes, in activation
//! order — the cordon recorded on the plan before it is made, the uncordon once the node
//! is final (never after `RollbackFailed`), the plan applied when it differs, and staging
//! started for at most [`staging_batch`] nodes per round, and only while fewer than
//! `spec.staging.maxConcurrent` nodes are staging.

use std::borrow::Cow;

use inplace_proto::rollout_slots::staging_slots;
use inplace_proto::{DesiredState, Disruption, NodeRolloutSpec};

use super::classify::{Classified, keeps_cordon};
use super::grant::Grants;
use super::memo::DecisionMemo;
use super::steer::leaves_plan_alone;
use super::{
    Decision, EventKind, NodeAction, NodeState, NodeView, PlanIntent, PlanView, event, node_event,
    staging_batch,
};

/// Pushes every node's writes and their Events; returns whether staging was cut short
/// by the batch limit (the rollout should then be looked at again at once). Staging cut
/// short by `maxConcurrent` waits for the plan watch instead: a node reporting `Staged` (or
/// failing) frees its place.
pub(super) fn node_actions(
    spec: &NodeRolloutSpec,
    owned: &[&NodeView],
    classified: &mut Classified,
    grants: &Grants,
    decision: &mut Decision,
    memo: &mut DecisionMemo,
) -> bool {
    let batch = staging_batch(grants.slots);
    let staging_limit = batch.min(staging_room(spec, owned, classified));
    let mut staging_started = 0;
    let mut batch_full = false;
    for (i, node) in owned.iter().enumerate() {
        if grants.rank[i].is_none() && classified.reused[i] {
            continue;
        }
        let state = &classified.states[i];
        let intent = &mut classified.intents[i];
        let actions_before = decision.actions.len();
        let events_before = decision.events.len();
        let cordoned_before = intent.cordoned;
        let mut deferred = false;
        let written = cordon_actions(spec, node, state, intent, decision);
        if plan_differs(written.as_deref(), intent)
            && !leaves_plan_alone(node, state, &intent.revision)
        {
            // Only a plain "start staging" write waits for a later round; a node with
            // anything else to do this round (a cordon to undo) gets its plan written too.
            let starts_staging = *state == NodeState::Pending
                && decision.actions.len() == actions_before
                && written
                    .as_ref()
                    .is_none_or(|p| p.intent.revision != intent.revision);
            if starts_staging && staging_started == staging_limit {
                deferred = true;
                batch_full |= staging_started == batch;
            } else {
                staging_started += usize::from(starts_staging);
                decision.actions.push(NodeAction::ApplyPlan {
                    node: node.name.clone(),
                    intent: intent.clone(),
                });
            }
        }
        if let Some(rank) = grants.rank[i] {
            decision.events.push(
                event(
                    EventKind::Normal,
                    "ActivationStarted",
                    format!(
                        "node {} granted an activation slot ({} of {} in use)",
                        node.name,
                        grants.holders + rank,
                        grants.slots
                    ),
                    &node.name,
                )
                .on_node(node_event::ACTIVATED),
            );
        }
        let quiet = grants.rank[i].is_none()
            && decision.actions.len() == actions_before
            && decision.events.len() == events_before
            && intent.cordoned == cordoned_before
            && !deferred;
        if !quiet {
            memo.forget(i);
        }
    }
    batch_full
}

/// How many more nodes may start staging under `spec.staging.maxConcurrent` (unlimited
/// without it): its count of the owned nodes, less those staging now — their plan names
/// the revision and their agent has not reported it staged (nor failed).
fn staging_room(spec: &NodeRolloutSpec, owned: &[&NodeView], classified: &Classified) -> usize {
    let Some(staging) = &spec.staging else {
        return usize::MAX;
    };
    let allowed = staging_slots(&staging.max_concurrent, owned.len());
    let staging_now = owned
        .iter()
        .zip(classified.states.iter().zip(&classified.intents))
        .filter(|(node, (state, intent))| {
            **state == NodeState::Pending
                && node
                    .plan
                    .as_ref()
                    .is_some_and(|p| p.intent.revision == intent.revision)
        })
        .count();
    allowed.saturating_sub(staging_now)
}

/// The cordon (recorded first) or uncordon `node` needs this round, with their Events;
/// returns the plan as it stands after them (borrowed unless a cordon record rewrote it:
/// a round looks at every node, so the common case copies nothing).
fn cordon_actions<'a>(
    spec: &NodeRolloutSpec,
    node: &'a NodeView,
    state: &NodeState,
    intent: &mut PlanIntent,
    decision: &mut Decision,
) -> Option<Cow<'a, PlanView>> {
    let mut written = node.plan.as_ref().map(Cow::Borrowed);
    let wants_cordon = *state == NodeState::Updating
        && intent.granted_at.is_some()
        && spec.disruption != Disruption::None;
    if wants_cordon {
        if !intent.cordoned && !node.unschedulable {
            // Record the cordon before making it, so a crash in between can't leave a
            // node cordoned with nobody remembering why.
            intent.cordoned = true;
            let mut record = intent.clone();
            record.desired_state = DesiredState::Staged;
            if plan_differs(written.as_deref(), &record) {
                decision.actions.push(NodeAction::ApplyPlan {
                    node: node.name.clone(),
                    intent: record.clone(),
                });
                written = Some(Cow::Owned(PlanView::written(&record)));
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
    written
}

fn cordon(node: &NodeView) -> NodeAction {
    NodeAction::Cordon {
        node: node.name.clone(),
    }
}

/// Whether the plan as it stands differs from what the controller wants it to say.
fn plan_differs(plan: Option<&PlanView>, intent: &PlanIntent) -> bool {
    plan.is_none_or(|plan| plan.intent != *intent)
}
