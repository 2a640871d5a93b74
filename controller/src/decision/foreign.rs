//! Phase 2a of the decision: the disruption others caused (`spec.countForeignDisruption`).
//! inplace is not alone on a fleet: people cordon nodes, kubelets stop reporting, other
//! tools drain and reboot. A selected node that someone else took down occupies an
//! activation slot (and a place in its topology group) exactly as one of the rollout's own
//! activations does, so the rollout never takes more of the fleet down than
//! `maxUnavailable` allows.
//!
//! Someone else's disruption is a node that is not one of this rollout's slot holders
//! (activating, or soaking for `minReadySeconds`) nor failed (a failure is the rollout's
//! own, bounded by `maxFailures`) and is
//! - cordoned (`spec.unschedulable`) without inplace's cordon record on its plan
//!   ([`CORDONED_ANNOTATION`](super::CORDONED_ANNOTATION)): a cordon inplace made is its
//!   own, never counted twice;
//! - or not `Ready` (the condition False, Unknown or missing);
//! - or a node kured's reboot lock is held for (`kured.rs`), or Flatcar's update
//!   operator is rebooting (`fluo.rs`), whether or not the rollout counts the others above:
//!   a node being rebooted is down.
//!
//! A node this rollout is activating is its own slot whatever its condition says: a kubelet
//! restarting under the update is not someone else's disruption. A Staged node others took
//! down is not granted a slot until it is back: someone is working on it (a person's
//! cordon, a reboot), and an agent on a node that is not Ready may not be running.

use inplace_proto::{ForeignDisruption, NodeRolloutSpec};

use super::{NodeState, NodeView, Readiness};

/// The owned nodes (indexes into `owned`) that others took down, with what was seen, in
/// activation order; empty when the rollout does not count them.
pub(super) fn foreign_disruptions(
    spec: &NodeRolloutSpec,
    owned: &[&NodeView],
    states: &[NodeState],
    soaking: &[usize],
    kured_holders: &[&str],
) -> Vec<(usize, ForeignDisruption)> {
    let reboots = owned.iter().any(|n| n.rebooted_by.is_some());
    if !spec.count_foreign_disruption && kured_holders.is_empty() && !reboots {
        return Vec::new();
    }
    // A failed node's trouble is the rollout's own, bounded by maxFailures and the halt.
    let mut ours: Vec<bool> = states
        .iter()
        .map(|s| matches!(s, NodeState::Updating | NodeState::Failed { .. }))
        .collect();
    for &i in soaking {
        ours[i] = true;
    }
    owned
        .iter()
        .zip(ours)
        .enumerate()
        .filter(|(_, (_, ours))| !ours)
        .filter_map(|(i, (node, _))| {
            let seen = disrupted_by_others(node, spec.count_foreign_disruption, kured_holders)?;
            Some((i, seen))
        })
        .collect()
}

/// What someone else did to `node`, if anything: cordon and readiness only when the rollout
/// counts them (`count`), kured's lock and another tool's reboot always.
fn disrupted_by_others(
    node: &NodeView,
    count: bool,
    kured_holders: &[&str],
) -> Option<ForeignDisruption> {
    let our_cordon = node.plan.as_ref().is_some_and(|p| p.intent.cordoned);
    let cordoned = (count && node.unschedulable && !our_cordon).then_some("cordoned".to_owned());
    let not_ready = match &node.readiness {
        Readiness::NotReady { why } if count => Some(format!("NotReady ({why})")),
        _ => None,
    };
    let kured = kured_holders
        .contains(&node.name.as_str())
        .then_some("held by kured's lock".to_owned());
    let rebooting = node.rebooted_by.map(|who| format!("rebooting under {who}"));
    let seen: Vec<String> = [cordoned, not_ready, kured, rebooting]
        .into_iter()
        .flatten()
        .collect();
    if seen.is_empty() {
        return None;
    }
    Some(ForeignDisruption {
        node: node.name.clone(),
        why: seen.join(", "),
    })
}

/// How many disruptions a message names before it says "and N more".
const NAMED_AT_MOST: usize = 5;

/// The summary's note, e.g. `, 2 slots used by others: worker-4 cordoned, worker-9
/// NotReady (Ready=Unknown)`; empty when there are none.
pub(super) fn summary_note(found: &[ForeignDisruption]) -> String {
    if found.is_empty() {
        return String::new();
    }
    let mut named: Vec<String> = found
        .iter()
        .take(NAMED_AT_MOST)
        .map(|d| format!("{} {}", d.node, d.why))
        .collect();
    if found.len() > NAMED_AT_MOST {
        named.push(format!("and {} more", found.len() - NAMED_AT_MOST));
    }
    let slots = if found.len() == 1 { "slot" } else { "slots" };
    format!(
        ", {} {slots} used by others: {}",
        found.len(),
        named.join(", ")
    )
}
