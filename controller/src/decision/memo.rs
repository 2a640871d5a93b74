//! What one round's decision keeps for the next, so that a round re-decides only the nodes
//! whose inputs changed: every owned node's class (`classify.rs`: its state, its plan
//! intent before grants, its soak and its next deadline), in place, with the version of
//! the node's view it was found from ([`NodeView::version`]).
//!
//! A kept class is reused, and the node skipped by the write phase, while all of these
//! hold: the node's view has the same version (the rollout's kept view numbers every view
//! it builds and never reuses a number), it is at the same place among the owned nodes,
//! the rollout's spec and revision are the ones the class was found under, the time has
//! not reached its soak end or progress deadline, the class was found from the node and
//! the time alone (not from a drain pass or the last status, as a soak's start is), and
//! the round that found it asked nothing of the node (no write, no Event, no grant), so
//! the class was not changed after it was found. The fleet part of the decision (halt,
//! slots, status) still runs over every class; what is skipped is reading each node's plan
//! and agent report, and copying its class. `decision/tests/memo.rs` runs random rounds
//! with a memo and without and requires the same decision in every round, and so does
//! every simulated rollout of `decision/tests.rs`.

use std::sync::Arc;

use inplace_proto::NodeRolloutSpec;
use k8s_openapi::jiff::Timestamp;

use super::classify::{Classified, NodeClass};
use super::{NodeState, NodeView, PlanIntent};

/// The memo of one rollout, kept between its rounds (`rollout/view.rs`).
#[derive(Debug, Default)]
pub struct DecisionMemo {
    basis: Option<Basis>,
    /// The last round's states and intents, in the order of its owned nodes.
    states: Vec<NodeState>,
    intents: Vec<PlanIntent>,
    kept: Vec<Kept>,
}

/// What every kept class was found under.
#[derive(Debug, PartialEq)]
struct Basis {
    revision: Arc<str>,
    spec: NodeRolloutSpec,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Kept {
    /// The version of the view the class was found from; 0: not reusable.
    version: u64,
    /// When it was found: a clock that went back might un-pass a deadline.
    found_at: Timestamp,
    pub wake_at: Option<Timestamp>,
    pub soaking: bool,
}

impl Kept {
    const NOTHING: Kept = Kept {
        version: 0,
        found_at: Timestamp::UNIX_EPOCH,
        wake_at: None,
        soaking: false,
    };
}

impl DecisionMemo {
    /// Starts a round over `owned` nodes for `revision` under `spec`: the last round's
    /// classes, or none if the spec, the revision or the number of nodes changed.
    pub(super) fn begin(
        &mut self,
        revision: &Arc<str>,
        spec: &NodeRolloutSpec,
        owned: usize,
    ) -> Classified {
        let same = self
            .basis
            .as_ref()
            .is_some_and(|b| b.revision == *revision && b.spec == *spec);
        if !same || self.kept.len() != owned || self.states.len() != owned {
            self.basis = Some(Basis {
                revision: Arc::clone(revision),
                spec: spec.clone(),
            });
            self.states.clear();
            self.intents.clear();
            self.kept.clear();
            self.kept.resize(owned, Kept::NOTHING);
        }
        Classified {
            states: std::mem::take(&mut self.states),
            intents: std::mem::take(&mut self.intents),
            reused: vec![false; owned],
            drains_pending: Vec::new(),
            soaking: Vec::new(),
            wake_at: Vec::new(),
        }
    }

    /// What is kept of the class of the node at `index`, if it still holds at `now`.
    pub(super) fn reusable(&self, index: usize, node: &NodeView, now: Timestamp) -> Option<Kept> {
        let kept = *self.kept.get(index)?;
        let holds = kept.version != 0
            && kept.version == node.version
            && node.drain.is_none()
            && kept.found_at <= now
            && kept.wake_at.is_none_or(|at| now < at);
        holds.then_some(kept)
    }

    /// Records the class just found for the node at `index`: reusable unless volatile.
    pub(super) fn found(
        &mut self,
        index: usize,
        node: &NodeView,
        now: Timestamp,
        class: &NodeClass,
    ) {
        if let Some(kept) = self.kept.get_mut(index) {
            *kept = if class.volatile {
                Kept::NOTHING
            } else {
                Kept {
                    version: node.version,
                    found_at: now,
                    wake_at: class.wake_at,
                    soaking: class.soaking,
                }
            };
        }
    }

    /// The round asked something of the node at `index` (or changed its class): its class
    /// is found again next round.
    pub(super) fn forget(&mut self, index: usize) {
        if let Some(kept) = self.kept.get_mut(index) {
            *kept = Kept::NOTHING;
        }
    }

    /// Keeps the round's classes for the next.
    pub(super) fn end(&mut self, classified: Classified) {
        self.states = classified.states;
        self.intents = classified.intents;
    }
}
