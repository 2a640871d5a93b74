//! The Events about single nodes that the status phase (`status.rs`) publishes: a node
//! that finished since the previous status (updated, or failed), and a node a person held,
//! released or skipped.

use std::collections::BTreeSet;

use inplace_proto::steering::{HOLD_ANNOTATION, SKIP_ANNOTATION};
use inplace_proto::{NodeFailure, NodeRolloutStatus};

use super::{
    Decision, EventKind, NODE_HELD, NODE_RELEASED, NODE_SKIPPED, NodeState, NodeView, RolloutInput,
    event, node_event,
};

/// Events for nodes that finished since the previous status: updated, or failed.
pub(super) fn transition_events(
    input: &RolloutInput<'_>,
    owned: &[&NodeView],
    states: &[NodeState],
    failures: &[NodeFailure],
    decision: &mut Decision,
) {
    for i in finished_nodes(input.previous, owned, states, failures) {
        let node = owned[i];
        match &states[i] {
            NodeState::Succeeded => decision.events.push(
                event(
                    EventKind::Normal,
                    "NodeUpdated",
                    format!("node {} runs the new revision", node.name),
                    &node.name,
                )
                .on_node(node_event::SUCCEEDED),
            ),
            NodeState::Failed { reason, message } => {
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

/// The owned nodes (indexes, in activation order) that finished since the previous status:
/// the ones it showed active that now succeeded, and the failed ones (`failures`, every
/// failed node) whose failure it did not show. Only these nodes (at most the slots and the
/// failures) are looked up, by name, in the activation order of `owned`: asking every
/// succeeded node whether it was active compared names across the whole fleet every round
/// (the largest part of the decision's time at 30,000 nodes, `docs/design/scale-history.md`
/// § What the runs found).
fn finished_nodes(
    previous: Option<&NodeRolloutStatus>,
    owned: &[&NodeView],
    states: &[NodeState],
    failures: &[NodeFailure],
) -> Vec<usize> {
    let (active_before, failed_before) = previous
        .map(|p| (p.active_nodes.as_slice(), p.failed_nodes.as_slice()))
        .unwrap_or_default();
    // (node, reason) pairs: a status written by hand may list a node twice.
    let failed_before: BTreeSet<(&str, &str)> = failed_before
        .iter()
        .map(|f| (f.node.as_str(), f.reason.as_str()))
        .collect();
    let updated = active_before
        .iter()
        .filter_map(|name| position_in_activation_order(owned, name))
        .filter(|&i| states[i] == NodeState::Succeeded);
    let failed = failures
        .iter()
        .filter(|f| !failed_before.contains(&(f.node.as_str(), f.reason.as_str())))
        .filter_map(|f| position_in_activation_order(owned, &f.node));
    let mut finished: Vec<usize> = updated.chain(failed).collect();
    finished.sort_unstable();
    finished.dedup();
    finished
}

/// Where the node named `name` is in `owned`, which is in activation order (control-plane
/// nodes first, each part by name): a binary search in each part.
fn position_in_activation_order(owned: &[&NodeView], name: &str) -> Option<usize> {
    let workers = owned.partition_point(|n| n.control_plane);
    let by_name = |n: &&NodeView| n.name.as_str().cmp(name);
    owned[..workers].binary_search_by(by_name).ok().or_else(|| {
        owned[workers..]
            .binary_search_by(by_name)
            .ok()
            .map(|i| workers + i)
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::activation_order;
    use crate::decision::tests::{cp, node};
    use proptest::prelude::*;

    fn view(name: usize, control_plane: bool) -> NodeView {
        let name = format!("n{name:02}");
        if control_plane {
            cp(&name)
        } else {
            node(&name)
        }
    }

    fn state(kind: u8, reason: u8) -> NodeState {
        match kind {
            0 => NodeState::Pending,
            1 => NodeState::Staged,
            2 => NodeState::Updating,
            3 => NodeState::Succeeded,
            4 => NodeState::Skipped,
            _ => NodeState::Failed {
                reason: format!("R{reason}"),
                message: String::new(),
            },
        }
    }

    proptest! {
        /// Looking up only the previously active nodes finds the same nodes as asking
        /// every node whether it finished (the rule as written before: a succeeded node the
        /// previous status showed active, a failed node whose failure it did not show),
        /// with control-plane nodes, names the fleet no longer has, and no previous status.
        #[test]
        fn only_the_previously_active_nodes_are_looked_up_and_none_is_missed(
            fleet in proptest::collection::btree_map(0usize..40, (any::<bool>(), 0u8..6, 0u8..2), 0..30),
            active in proptest::collection::vec(0usize..45, 0..12),
            failed in proptest::collection::vec((0usize..45, 0u8..2), 0..8),
            has_previous in any::<bool>(),
        ) {
            let mut views: Vec<NodeView> = fleet.iter().map(|(&n, &(cp, _, _))| view(n, cp)).collect();
            views.sort_by(activation_order);
            let owned: Vec<&NodeView> = views.iter().collect();
            let states: Vec<NodeState> = owned
                .iter()
                .map(|v| {
                    let n: usize = v.name[1..].parse().unwrap();
                    let (_, kind, reason) = fleet[&n];
                    state(kind, reason)
                })
                .collect();
            let previous = NodeRolloutStatus {
                active_nodes: active.iter().map(|n| format!("n{n:02}")).collect(),
                failed_nodes: failed
                    .iter()
                    .map(|(n, r)| NodeFailure {
                        node: format!("n{n:02}"),
                        reason: format!("R{r}"),
                        message: String::new(),
                    })
                    .collect(),
                ..NodeRolloutStatus::default()
            };
            let previous = has_previous.then_some(&previous);
            let expected: Vec<usize> = (0..owned.len())
                .filter(|&i| match &states[i] {
                    NodeState::Succeeded => previous
                        .is_some_and(|p| p.active_nodes.contains(&owned[i].name)),
                    NodeState::Failed { reason, .. } => !previous.is_some_and(|p| {
                        p.failed_nodes
                            .iter()
                            .any(|f| f.node == owned[i].name && f.reason == *reason)
                    }),
                    _ => false,
                })
                .collect();
            let failures = crate::decision::grant::failures(&owned, &states);
            prop_assert_eq!(finished_nodes(previous, &owned, &states, &failures), expected);
        }
    }
}
