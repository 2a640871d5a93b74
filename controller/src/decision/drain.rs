//! The drain's part of the decision (`disruption: Drain`): which nodes get a drain pass
//! this round and with which options ([`needs_drain_pass`], [`drain_pass_options`]), and,
//! after the pass, what the decision does with a granted node ([`drain_step`]). When the
//! drain times out is the one drain clock's ([`DrainClock`], shared with the Cluster API
//! extension): `spec.drain.onTimeout` `Halt` fails the node, `Skip` leaves it at its
//! revision (skipped, not failed), `Force` deletes what is left without eviction and waits
//! up to another `drainTimeout` for it to go.

use std::time::Duration as StdDuration;

use inplace_drain::{DrainClock, DrainOptions, DrainVerdict};
use inplace_proto::reason::Reason;
use inplace_proto::{DesiredState, Disruption, NodeRolloutSpec, OnDrainTimeout};
use k8s_openapi::jiff::Timestamp;
use kube::core::Selector;

use super::classify::classify;
use super::{
    DRAIN_RETRY, DrainTimedOut, EventKind, EventNote, NODE_SKIPPED, NodeState, NodeView, Ownership,
    ReleaseState, RolloutInput, event, node_event,
};

impl DrainTimedOut {
    /// Where a node whose drain timed out stands for the revision: failed, or skipped.
    pub(super) fn state(&self) -> NodeState {
        if self.skipped {
            NodeState::Skipped
        } else {
            NodeState::Failed {
                reason: Reason::DrainTimeout.as_str().to_owned(),
                message: self.message.clone(),
            }
        }
    }
}

/// Whether the rollout drains its nodes at all (`disruption: Drain`): if not, no node ever
/// needs a drain pass and the controller skips the walk that looks for one.
pub fn rollout_drains(spec: &NodeRolloutSpec) -> bool {
    spec.disruption == Disruption::Drain
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
    rollout_drains(spec)
        && node.ownership == Ownership::Ours
        && node.unschedulable
        && plan.intent.revision == *revision
        && plan.intent.granted_at.is_some()
        && plan.intent.drain_timeout.is_none()
        && plan.intent.desired_state == DesiredState::Staged
        && !node.steering.hold
        && !node.steering.skip
        && !matches!(classify(plan, revision), Some(NodeState::Failed { .. }))
}

/// How this round's pass over `node` drains: the rollout's `drain.podSelector` and
/// `gracePeriodSeconds`, and forced (deletions, no eviction) once `drainTimeout` has passed
/// under `onTimeout: Force`. An unreadable selector is an error naming the field.
pub fn drain_pass_options(
    spec: &NodeRolloutSpec,
    node: &NodeView,
    now: Timestamp,
) -> Result<DrainOptions, String> {
    let keep = spec
        .drain
        .pod_selector
        .clone()
        .map(Selector::try_from)
        .transpose()
        .map_err(|e| format!("spec.drain.podSelector: {e}"))?;
    let granted_at = node.plan.as_ref().and_then(|p| p.intent.granted_at);
    Ok(DrainOptions {
        keep,
        grace_period_seconds: spec
            .drain
            .grace_period_seconds
            .and_then(|s| u32::try_from(s).ok()),
        force: granted_at.is_some_and(|at| drain_clock(spec, at).forces(now)),
    })
}

/// The node's drain clock: it starts at the grant (`drainTimeout`, `onTimeout`). `Force`
/// without `allowForce` (which the API server refuses, but an object may predate the rule)
/// is `Halt`.
fn drain_clock(spec: &NodeRolloutSpec, granted_at: Timestamp) -> DrainClock {
    DrainClock {
        started: granted_at,
        timeout: spec.drain_timeout.get(),
        on_timeout: match spec.drain.on_timeout {
            OnDrainTimeout::Force if !spec.drain.allow_force => OnDrainTimeout::Halt,
            other => other,
        },
    }
}

/// What the decision does with a granted node after this round's pass.
pub(super) enum DrainStep {
    /// No pod left: activate.
    Activate,
    /// Out of time (`drainTimeout`, or twice that when forced): final for this revision.
    GiveUp(DrainTimedOut),
    /// Still draining: look again after this long.
    LookAgain(StdDuration),
}

/// The step for a granted node after this round's pass, from its [`DrainClock`]'s verdict
/// (Events `Drained`, `EvictionBlocked`, `DrainForced` and the skip go to `events`).
pub(super) fn drain_step(
    input: &RolloutInput<'_>,
    node: &NodeView,
    granted_at: Timestamp,
    events: &mut Vec<EventNote>,
) -> DrainStep {
    let spec = input.spec;
    let drain = node.drain.as_ref();
    let blocked = drain
        .filter(|d| !d.blocked.is_empty())
        .map(|d| d.blocked.join("; "));
    let drained = drain.is_some_and(|d| d.remaining == 0);
    let timeout = spec.drain_timeout.as_str();
    let timed_out = || {
        let what = blocked
            .as_ref()
            .map(|b| format!(": {b}"))
            .unwrap_or_default();
        format!("node {} not drained within {timeout}{what}", node.name)
    };
    let left = drain.map_or(0, |d| d.remaining);
    let until = match drain_clock(spec, granted_at).verdict(input.now, drained) {
        DrainVerdict::Drained => {
            events.push(event(
                EventKind::Normal,
                "Drained",
                format!("node {} drained; activating", node.name),
                &node.name,
            ));
            return DrainStep::Activate;
        }
        DrainVerdict::Evicting { until } => {
            if let Some(blocked) = &blocked {
                events.push(event(
                    EventKind::Warning,
                    "EvictionBlocked",
                    format!("draining node {}: {blocked}", node.name),
                    &node.name,
                ));
            }
            until
        }
        DrainVerdict::TimedOut { forced: false } => {
            return DrainStep::GiveUp(DrainTimedOut {
                message: timed_out(),
                skipped: false,
            });
        }
        DrainVerdict::TimedOut { forced: true } => {
            return DrainStep::GiveUp(DrainTimedOut {
                message: format!(
                    "node {} not drained within {timeout}, nor {timeout} after its {left} \
                     remaining pods were deleted (onTimeout: Force)",
                    node.name
                ),
                skipped: false,
            });
        }
        DrainVerdict::Skipped => {
            let message = format!(
                "{}; left at the revision it runs (onTimeout: Skip)",
                timed_out()
            );
            // Once: from the next round the plan's record makes the node Skipped without
            // a step.
            events.push(
                event(
                    EventKind::Warning,
                    NODE_SKIPPED,
                    format!(
                        "node {} skipped ({}): {message}",
                        node.name,
                        Reason::DrainTimeout.as_str()
                    ),
                    &node.name,
                )
                .on_node(node_event::SKIPPED),
            );
            return DrainStep::GiveUp(DrainTimedOut {
                message,
                skipped: true,
            });
        }
        DrainVerdict::Forcing { until } => {
            events.push(event(
                EventKind::Warning,
                "DrainForced",
                format!(
                    "node {} not drained within {timeout}: its {left} remaining pods are \
                     deleted without eviction, PodDisruptionBudgets ignored (onTimeout: Force)",
                    node.name
                ),
                &node.name,
            ));
            until
        }
    };
    let left = until.duration_since(input.now).unsigned_abs();
    DrainStep::LookAgain(left.min(DRAIN_RETRY).max(StdDuration::from_millis(100)))
}
