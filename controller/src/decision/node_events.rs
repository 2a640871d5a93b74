//! The Events about single nodes that the status phase (`status.rs`) publishes: a node
//! that finished since the previous status (updated, or failed), and a node a person held,
//! released or skipped.

use std::collections::{BTreeMap, BTreeSet};

use inplace_proto::steering::{HOLD_ANNOTATION, SKIP_ANNOTATION};

use super::{
    Decision, EventKind, NODE_HELD, NODE_RELEASED, NODE_SKIPPED, NodeState, NodeView, RolloutInput,
    event, node_event,
};

/// Events for nodes that finished since the previous status: updated, or failed.
pub(super) fn transition_events(
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
                decision.events.push(
                    event(
                        EventKind::Normal,
                        "NodeUpdated",
                        format!("node {} runs the new revision", node.name),
                        &node.name,
                    )
                    .on_node(node_event::SUCCEEDED),
                );
            }
            NodeState::Failed { reason, message }
                if previous_failed.get(node.name.as_str()) != Some(&reason.as_str()) =>
            {
                let rolled_back = node
                    .plan
                    .as_ref()
                    .is_some_and(|p| p.report.phase == Some(inplace_proto::Phase::RolledBack));
                decision.events.push(
                    event(
                        EventKind::Warning,
                        reason,
                        format!("node {} failed: {message}", node.name),
                        &node.name,
                    )
                    .on_node(if rolled_back {
                        node_event::ROLLED_BACK
                    } else {
                        node_event::FAILED
                    }),
                );
            }
            _ => {}
        }
    }
}

/// Events for nodes a person has held, released or skipped since the previous status.
pub(super) fn steering_events(input: &RolloutInput<'_>, decision: &mut Decision) {
    let before = |list: fn(&inplace_proto::NodeRolloutStatus) -> &Vec<String>| -> BTreeSet<String> {
        input
            .previous
            .map(|p| list(p).iter().cloned().collect())
            .unwrap_or_default()
    };
    let held_before = before(|p| &p.held_nodes);
    let skipped_before = before(|p| &p.skipped_nodes);
    let held_now: BTreeSet<String> = decision.status.held_nodes.iter().cloned().collect();
    let mut notes = Vec::new();
    for name in held_now.difference(&held_before) {
        notes.push(
            event(
                EventKind::Normal,
                NODE_HELD,
                format!("node {name} held ({HOLD_ANNOTATION}): it is not activated until released"),
                name,
            )
            .on_node(node_event::HELD),
        );
    }
    for name in held_before.difference(&held_now) {
        if !decision.status.skipped_nodes.contains(name) {
            notes.push(
                event(
                    EventKind::Normal,
                    NODE_RELEASED,
                    format!("node {name} released: it may be activated again"),
                    name,
                )
                .on_node(node_event::RELEASED),
            );
        }
    }
    // A node skipped by its drain's `onTimeout: Skip` had its own Event (`drain.rs`).
    let person_skipped: BTreeSet<&str> = input
        .nodes
        .iter()
        .filter(|n| n.steering.skip)
        .map(|n| n.name.as_str())
        .collect();
    for name in &decision.status.skipped_nodes {
        if !skipped_before.contains(name) && person_skipped.contains(name.as_str()) {
            notes.push(
                event(
                    EventKind::Normal,
                    NODE_SKIPPED,
                    format!(
                        "node {name} skipped ({SKIP_ANNOTATION}): it keeps the revision it runs"
                    ),
                    name,
                )
                .on_node(node_event::SKIPPED),
            );
        }
    }
    decision.events.extend(notes);
}
