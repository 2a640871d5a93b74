//! A phase of the decision: a node being updated in place is no reason for the cluster
//! autoscaler to remove it. While a node holds an activation slot (Updating: draining,
//! activating, verifying) the controller sets the autoscaler's
//! [`SCALE_DOWN_DISABLED_ANNOTATION`] on the Node, and removes it once the node's plan is
//! final — only when it set it itself: a Node that already carried the annotation (someone
//! else's) is left alone, before and after.
//!
//! Whose annotation it is is recorded on the Node beside it, in the same merge patch
//! ([`SCALE_DOWN_MARK_ANNOTATION`]): one write sets both and one removes both, so a crash
//! never leaves the autoscaler's annotation with nobody remembering who set it.
//! MachineHealthCheck needs nothing here: it reads the Node's `Ready` condition, which a
//! kubelet restart does not normally lose (docs/usage/standalone-rollouts.md § Sharing the
//! fleet).

use std::collections::BTreeMap;

use super::{NodeAction, NodeState, NodeView};

/// The Node annotation the cluster autoscaler reads: `"true"` keeps it from scaling the
/// node down.
pub const SCALE_DOWN_DISABLED_ANNOTATION: &str =
    "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// The Node annotation that says inplace set [`SCALE_DOWN_DISABLED_ANNOTATION`] (and will
/// remove it once the node's update is final).
pub const SCALE_DOWN_MARK_ANNOTATION: &str = "inplace.dev/scale-down-disabled";

/// What a Node's annotations say about the autoscaler's scale-down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScaleDownMark {
    /// [`SCALE_DOWN_DISABLED_ANNOTATION`] is `"true"`.
    pub disabled: bool,
    /// [`SCALE_DOWN_MARK_ANNOTATION`] is present: inplace set it.
    pub ours: bool,
}

impl ScaleDownMark {
    /// Reads a Node's annotations.
    pub fn of(annotations: Option<&BTreeMap<String, String>>) -> ScaleDownMark {
        let get = |key: &str| annotations.and_then(|a| a.get(key));
        ScaleDownMark {
            disabled: get(SCALE_DOWN_DISABLED_ANNOTATION).is_some_and(|v| v.trim() == "true"),
            ours: get(SCALE_DOWN_MARK_ANNOTATION).is_some(),
        }
    }
}

/// Pushes the mark for each owned node that holds a slot while nobody disabled its
/// scale-down. Run before the round's plan writes, so the mark is on the Node before its
/// plan turns Active.
pub(super) fn disable_scale_down(
    owned: &[&NodeView],
    states: &[NodeState],
    actions: &mut Vec<NodeAction>,
) {
    for (node, state) in owned.iter().zip(states) {
        if *state == NodeState::Updating && !node.scale_down.disabled {
            actions.push(NodeAction::DisableScaleDown {
                node: node.name.clone(),
            });
        }
    }
}

/// Pushes the mark's removal for each owned node that no longer holds a slot and carries
/// inplace's mark. Run after the round's plan writes and uncordons.
pub(super) fn restore_scale_down(
    owned: &[&NodeView],
    states: &[NodeState],
    actions: &mut Vec<NodeAction>,
) {
    for (node, state) in owned.iter().zip(states) {
        if *state != NodeState::Updating && node.scale_down.ours {
            actions.push(NodeAction::RestoreScaleDown {
                node: node.name.clone(),
            });
        }
    }
}
