//! A person's steering of one node ([`inplace_proto::Steering`], the Node's `inplace.dev/hold`
//! and `inplace.dev/skip` annotations), applied to the node's state and plan intent right
//! after classification, before any grant:
//!
//! - hold: the node is never granted a slot while held (the grant phase passes it over). A
//!   node granted a slot whose plan still says `Staged` (its drain runs, activation not yet
//!   asked for) gives the slot back and is uncordoned; once the plan says `Active` the
//!   activation runs to its end, as it does when a rollout is paused.
//! - retry (`inplace.dev/retry` on the node's plan, see [`retry`]): a failed node whose
//!   plan carries a token its agent has not honoured yet counts as pending, not failed.
//! - skip: the node is left at the revision it runs and counted as skipped, not failed
//!   (a failed node that is skipped stops counting toward `maxFailures`). Its plan is not
//!   moved to the rollout's revision; a grant not yet acted on is given back as for hold; a
//!   node already activating finishes, and a node that already runs the revision stays
//!   counted as succeeded.

use std::sync::Arc;

use inplace_proto::DesiredState;

use super::{NodeState, NodeView, PlanIntent};

/// Applies `node`'s steering to its state and intent.
pub(super) fn steer(node: &NodeView, state: &mut NodeState, intent: &mut PlanIntent) {
    let steering = node.steering;
    if !steering.hold && !steering.skip {
        return;
    }
    let grant_not_acted_on = *state == NodeState::Updating
        && intent.granted_at.is_some()
        && intent.desired_state == DesiredState::Staged;
    if grant_not_acted_on {
        intent.granted_at = None;
        intent.drain_timeout = None;
        *state = NodeState::Staged;
    }
    if steering.skip
        && matches!(
            state,
            NodeState::Pending | NodeState::Staged | NodeState::Failed { .. }
        )
    {
        *state = NodeState::Skipped;
    }
}

/// A person's retry of a failed node: while the plan's token waits for its agent, the node
/// is pending (no longer failed: it stops counting toward `maxFailures`, a halt it caused
/// lifts) and its plan goes back to `Staged` without a grant, drain-timeout record or soak,
/// which is when the agent honours the token (forgets the revision's failure) and stages it
/// again; it is then granted a slot like any staged node. Once `status.retryHonoured`
/// shows the token, the node is whatever its new report says, so a token is acted on once
/// and a restarted controller finds all of this on the plan. A node that is not failed
/// (its token arrived late or early) is left as it is.
pub(super) fn retry(node: &NodeView, state: &mut NodeState, intent: &mut PlanIntent) {
    let pending = node.plan.as_ref().is_some_and(|p| p.retry_pending);
    if !pending || !matches!(state, NodeState::Failed { .. }) {
        return;
    }
    *state = NodeState::Pending;
    intent.desired_state = DesiredState::Staged;
    intent.granted_at = None;
    intent.drain_timeout = None;
    intent.ready_since = None;
}

/// Whether the plan of a skipped node is left as it is: it is not (yet) for the rollout's
/// revision, so writing the intent would start staging a revision the person wants kept
/// off the node.
pub(super) fn leaves_plan_alone(node: &NodeView, state: &NodeState, revision: &Arc<str>) -> bool {
    *state == NodeState::Skipped
        && node
            .plan
            .as_ref()
            .is_none_or(|p| p.intent.revision != *revision)
}
