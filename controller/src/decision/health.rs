//! The health gates of the grant phase: whether the cluster is healthy enough for a new
//! activation to start. Two rules, both fail closed:
//!
//! - every owned node that already runs the rollout's revision must be `Ready` (its Node's
//!   condition True): a node the update left unhealthy stops the rollout before the next
//!   one is touched, whatever `maxFailures` says, because the agent's own health checks
//!   passed on it;
//! - no alert listed in `spec.gates.alerts` may fire. Prometheus is asked by the I/O side
//!   (`rollout/alert_gate.rs`); the decision gets its answer, or why there is none, and an answer
//!   it does not have (no Prometheus configured, down, too slow, not its JSON) blocks.

use std::collections::BTreeSet;

use inplace_proto::{NodeRolloutSpec, Reason};

use super::{NodeState, NodeView};

/// A node's `Ready` condition as the gate reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Readiness {
    /// The condition is True.
    #[default]
    Ready,
    /// The condition is False or Unknown, or the Node carries none; `why` says which
    /// (`Ready=False (KubeletNotReady)`, `no Ready condition`).
    NotReady {
        /// The condition as read, for the status message.
        why: String,
    },
}

/// What the controller learned from Prometheus this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlertObservation {
    /// Not asked: the rollout lists no alert.
    NotAsked,
    /// The names (`alertname`) of every alert in state `firing`.
    Firing(BTreeSet<String>),
    /// No usable answer; why, in words (naming the URL and the error).
    Unavailable(String),
}

/// How many nodes or alerts a message names before it says "and N more".
const NAMED_AT_MOST: usize = 5;

/// What the gates say: empty when new activations may start, else each gate that blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HealthVerdict {
    blockers: Vec<(Reason, String)>,
}

impl HealthVerdict {
    /// Whether new activations may start.
    pub(crate) fn allows_grants(&self) -> bool {
        self.blockers.is_empty()
    }

    /// Adds a gate outside the rollout's spec that blocks (kured's lock, `kured.rs`).
    pub(crate) fn block(&mut self, blocker: Option<(Reason, String)>) {
        self.blockers.extend(blocker);
    }

    /// The first blocking gate's reason, and every blocking gate's message joined.
    pub(crate) fn blocked(&self) -> Option<(Reason, String)> {
        let (reason, _) = self.blockers.first()?;
        let messages: Vec<&str> = self.blockers.iter().map(|(_, m)| m.as_str()).collect();
        Some((*reason, messages.join("; ")))
    }
}

/// The gates' verdict for the owned nodes (`owned` and `states` side by side).
pub(crate) fn health_verdict(
    spec: &NodeRolloutSpec,
    owned: &[&NodeView],
    states: &[NodeState],
    alerts: &AlertObservation,
) -> HealthVerdict {
    let mut blockers = Vec::new();
    let not_ready: Vec<String> = owned
        .iter()
        .zip(states)
        .filter(|(_, state)| **state == NodeState::Succeeded)
        .filter_map(|(node, _)| match &node.readiness {
            Readiness::Ready => None,
            Readiness::NotReady { why } => Some(format!("{} ({why})", node.name)),
        })
        .collect();
    if !not_ready.is_empty() {
        blockers.push((
            Reason::NodeNotReady,
            format!(
                "{} updated nodes are not Ready: {}",
                not_ready.len(),
                name_some(&not_ready)
            ),
        ));
    }
    if let Some(blocker) = alert_blocker(&spec.gates.alerts, alerts) {
        blockers.push(blocker);
    }
    HealthVerdict { blockers }
}

/// Whether the alerts gate blocks, and why.
fn alert_blocker(listed: &[String], alerts: &AlertObservation) -> Option<(Reason, String)> {
    if listed.is_empty() {
        return None;
    }
    match alerts {
        AlertObservation::Firing(firing) => {
            let blocking: Vec<String> = listed
                .iter()
                .filter(|name| firing.contains(*name))
                .cloned()
                .collect();
            (!blocking.is_empty()).then(|| {
                (
                    Reason::AlertFiring,
                    format!(
                        "alerts firing (spec.gates.alerts): {}",
                        name_some(&blocking)
                    ),
                )
            })
        }
        AlertObservation::Unavailable(why) => Some((
            Reason::GateUnavailable,
            format!("the alert gate fails closed, no answer from Prometheus: {why}"),
        )),
        AlertObservation::NotAsked => Some((
            Reason::GateUnavailable,
            "the alert gate fails closed: Prometheus was not asked".to_owned(),
        )),
    }
}

/// The first few names, and how many more.
fn name_some(names: &[String]) -> String {
    let mut text = names
        .iter()
        .take(NAMED_AT_MOST)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NAMED_AT_MOST {
        text.push_str(&format!(" and {} more", names.len() - NAMED_AT_MOST));
    }
    text
}
