//! Phases 2 and 3 of the decision: the halt rule (more failed nodes than `maxFailures`)
//! and the activation slots (control-plane nodes first, one at a time and alone, then the
//! other nodes by name; only Staged nodes that no person holds; none while paused, halted,
//! outside every maintenance window or held by a health gate (`health.rs`); a node soaking
//! for `minReadySeconds` still holds its slot, and so does a node others took down
//! (`foreign.rs`); at most
//! `maxUnavailablePerTopology.max` holders per value of its label key).

use std::collections::BTreeMap;

use inplace_proto::{DesiredState, Disruption, NodeFailure, NodeRolloutSpec};
use k8s_openapi::jiff::Timestamp;

use super::{NodeState, NodeView, PlanIntent};

/// Every failed node, with its reason and message, in activation order.
pub(super) fn failures(owned: &[&NodeView], states: &[NodeState]) -> Vec<NodeFailure> {
    owned
        .iter()
        .zip(states)
        .filter_map(|(node, state)| match state {
            NodeState::Failed { reason, message } => Some(NodeFailure {
                node: node.name.clone(),
                reason: reason.clone(),
                message: message.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// Whether the rollout halts: more nodes failed than `maxFailures`.
pub(super) fn is_halted(spec: &NodeRolloutSpec, failures: &[NodeFailure]) -> bool {
    failures.len() > usize::try_from(spec.max_failures).unwrap_or(0)
}

/// What may be granted this round besides the free slots.
pub(super) struct Gate<'a> {
    /// Whether new activations may start: not paused, not halted, inside a maintenance
    /// window (or none set), no health gate closed.
    pub open: bool,
    /// Succeeded nodes still soaking, by index into the owned nodes: each holds its slot
    /// until its soak ends.
    pub soaking: &'a [usize],
    /// Nodes others took down, by index into the owned nodes (`foreign.rs`): each occupies
    /// a slot, and a place in its topology group.
    pub foreign: &'a [usize],
}

/// This round's grants.
pub(super) struct Grants {
    /// The activation slots.
    pub slots: usize,
    /// Slots in use before this round's grants: nodes holding one (soaking ones included)
    /// and nodes others took down (`foreign.rs`).
    pub holders: usize,
    /// For each owned node, its rank among this round's grants (1-based), if granted now.
    pub rank: Vec<Option<usize>>,
    /// Staged nodes (indexes into the owned nodes) passed over this round while slots were
    /// free, because their topology group already held `maxUnavailablePerTopology.max`.
    pub passed_over: Vec<usize>,
}

impl Grants {
    /// The nodes passed over for a full topology group, by group value, for the status.
    pub(super) fn topology_waits(&self, owned: &[&NodeView]) -> BTreeMap<String, Vec<String>> {
        let mut waits: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for &i in &self.passed_over {
            let node = owned[i];
            waits
                .entry(node.topology.clone())
                .or_default()
                .push(node.name.clone());
        }
        waits
    }
}

/// Grants free slots to Staged nodes, in the order of `owned` (activation order), and
/// records each grant in the node's state and intent.
pub(super) fn grant_slots(
    spec: &NodeRolloutSpec,
    gate: &Gate<'_>,
    now: Timestamp,
    owned: &[&NodeView],
    states: &mut [NodeState],
    intents: &mut [PlanIntent],
) -> Grants {
    let slots = inplace_proto::rollout_slots::activation_slots(&spec.max_unavailable, owned.len());
    let updating = states.iter().filter(|s| **s == NodeState::Updating).count();
    let holders = updating + gate.soaking.len() + gate.foreign.len();
    let (granted, passed_over) = if !gate.open || holders >= slots {
        (Vec::new(), Vec::new())
    } else {
        let taken = gate.soaking.iter().chain(gate.foreign).copied();
        let spread = Spread::of(spec, owned, states, taken);
        who_gets_a_slot(
            owned,
            states,
            gate.foreign,
            slots - holders,
            holders,
            spread,
        )
    };
    let mut rank = vec![None; owned.len()];
    for (r, &i) in granted.iter().enumerate() {
        rank[i] = Some(r + 1);
        states[i] = NodeState::Updating;
        let intent = &mut intents[i];
        intent.granted_at = Some(now);
        intent.desired_state = match spec.disruption {
            Disruption::None | Disruption::Cordon => DesiredState::Active,
            Disruption::Drain => DesiredState::Staged,
        };
    }
    Grants {
        slots,
        holders,
        rank,
        passed_over,
    }
}

/// The Staged nodes that get one of `free` slots: while a control-plane node is not final,
/// only that node, alone (no other holder, no node others took down) and one at a time; otherwise the first `free`
/// whose topology group has room. Also returns the Staged nodes passed over on the way
/// because their group was full (they wait, and the status says for what).
fn who_gets_a_slot<'a>(
    owned: &[&'a NodeView],
    states: &[NodeState],
    down: &[usize],
    free: usize,
    holders: usize,
    mut spread: Option<Spread<'a>>,
) -> (Vec<usize>, Vec<usize>) {
    let cp_unfinished = owned.iter().zip(states).any(|(n, s)| {
        n.control_plane
            && !matches!(
                s,
                NodeState::Succeeded | NodeState::Failed { .. } | NodeState::Skipped
            )
    });
    // A held node is passed over; a held control-plane node still keeps the other nodes
    // waiting (control-plane first is a safety rule, not an order of convenience). A node
    // others took down (`down`) waits until it is back: someone is rebooting or working on it.
    let staged = (0..owned.len()).filter(|&i| {
        states[i] == NodeState::Staged && !owned[i].steering.hold && !down.contains(&i)
    });
    if cp_unfinished {
        if holders > 0 {
            return (Vec::new(), Vec::new());
        }
        let first = staged.filter(|&i| owned[i].control_plane).take(1).collect();
        return (first, Vec::new());
    }
    let (mut granted, mut passed_over) = (Vec::new(), Vec::new());
    for i in staged {
        if granted.len() == free {
            break;
        }
        if spread.as_mut().is_none_or(|s| s.admit(&owned[i].topology)) {
            granted.push(i);
        } else {
            passed_over.push(i);
        }
    }
    (granted, passed_over)
}

/// The `maxUnavailablePerTopology` rule: how many slot holders each topology group has
/// (nodes activating for this revision, soaking, or taken down by others), and how many it
/// may have. A group is
/// one value of the label key; nodes without the label share the empty value's group, so
/// they are spread among themselves rather than left unbounded.
struct Spread<'a> {
    max: usize,
    held: BTreeMap<&'a str, usize>,
}

impl<'a> Spread<'a> {
    /// The holders per group before this round's grants (`taken`: the soaking nodes and
    /// those others took down, besides the activating ones); `None` when the rollout sets
    /// no spread.
    fn of(
        spec: &NodeRolloutSpec,
        owned: &[&'a NodeView],
        states: &[NodeState],
        taken: impl Iterator<Item = usize>,
    ) -> Option<Spread<'a>> {
        let max = usize::try_from(spec.max_unavailable_per_topology.as_ref()?.max).unwrap_or(0);
        let mut held = BTreeMap::new();
        let updating = (0..owned.len()).filter(|&i| states[i] == NodeState::Updating);
        for i in updating.chain(taken) {
            *held.entry(owned[i].topology.as_str()).or_insert(0) += 1;
        }
        Some(Spread { max, held })
    }

    /// Whether a node of `group` may take a slot now; if so, the slot is counted to it.
    fn admit(&mut self, group: &'a str) -> bool {
        let held = self.held.entry(group).or_insert(0);
        if *held >= self.max {
            return false;
        }
        *held += 1;
        true
    }
}
