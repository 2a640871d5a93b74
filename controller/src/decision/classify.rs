//! Phase 1 of the decision: where each owned node stands for the rollout's revision
//! ([`NodeState`]), what its plan should say before any grant ([`PlanIntent`]), and, for a
//! granted node waiting for its drain, what the drain's verdict (`drain.rs`) makes of it.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use inplace_proto::reason::Reason;
use inplace_proto::{DesiredState, Disruption, Duration, Outcome, Phase};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::drain::{DrainStep, drain_step};
use super::memo::DecisionMemo;
use super::{EventNote, NodeState, NodeView, PlanIntent, PlanView, RolloutInput};

/// Classifies a plan that carries `revision` by the agent's report (proto's one reading of
/// it, [`Outcome`]) and the controller's own annotations. `None` when the plan is for
/// another revision.
pub(crate) fn classify(plan: &PlanView, revision: &Arc<str>) -> Option<NodeState> {
    if plan.intent.revision != *revision {
        return None;
    }
    let report = &plan.report;
    let outcome = report.outcome_for(revision);
    if outcome == Outcome::Reached {
        return Some(NodeState::Succeeded);
    }
    if let Some(timed_out) = &plan.intent.drain_timeout {
        return Some(timed_out.state());
    }
    if let Outcome::Failed(phase) = outcome {
        let fallback = if phase == Phase::RolledBack {
            Reason::RolledBack
        } else {
            Reason::RevisionDenied
        };
        return Some(NodeState::Failed {
            reason: report
                .reason
                .clone()
                .unwrap_or_else(|| fallback.as_str().to_owned()),
            message: report
                .message
                .clone()
                .unwrap_or_else(|| format!("the agent reports {phase:?}")),
        });
    }
    if plan.intent.granted_at.is_some() {
        return Some(NodeState::Updating);
    }
    if outcome == Outcome::Working(Phase::Staged) {
        return Some(NodeState::Staged);
    }
    Some(NodeState::Pending)
}

/// Whether the agent is in the middle of a disruptive step, whatever revision: such a node
/// takes a slot even if its plan has moved on (it finishes its atomic step first).
pub(crate) fn busy_elsewhere(plan: &PlanView) -> bool {
    plan.report.phase.is_some_and(Phase::is_disruptive)
}

/// Whether a failure leaves the node needing a person, in which case it stays cordoned: a
/// failed rollback, or a node past its progress deadline (it may be mid-swap or gone).
pub(crate) fn keeps_cordon(state: &NodeState) -> bool {
    matches!(state, NodeState::Failed { reason, .. }
        if reason == Reason::RollbackFailed.as_str()
            || reason == Reason::ProgressDeadlineExceeded.as_str())
}

/// Every owned node's state and plan intent, in the order of the owned nodes.
pub(super) struct Classified {
    /// Where each node stands.
    pub states: Vec<NodeState>,
    /// What each node's plan should say.
    pub intents: Vec<PlanIntent>,
    /// Whether each node kept its class from the last round (`memo.rs`), in which case the
    /// last round asked nothing of it.
    pub reused: Vec<bool>,
    /// How soon each drain still in progress wants to be looked at again.
    pub drains_pending: Vec<StdDuration>,
    /// Succeeded nodes still soaking (`minReadySeconds`), by index: they keep their slot.
    pub soaking: Vec<usize>,
    /// When a soak ends or a progress deadline passes: the rollout is looked at again then.
    pub wake_at: Vec<Timestamp>,
}

/// One node's classification: what [`classify_nodes`] finds for it alone.
#[derive(Debug)]
pub(super) struct NodeClass {
    pub state: NodeState,
    pub intent: PlanIntent,
    /// Succeeded and still soaking.
    pub soaking: bool,
    /// When its soak ends or its progress deadline passes; until then the class holds.
    pub wake_at: Option<Timestamp>,
    /// Its drain is in progress: look again this soon.
    pub drain_pending: Option<StdDuration>,
    /// It was found from more than the node and the time: its drain pass, or the last
    /// status (a soak's start). Such a class is not kept for the next round (`memo.rs`).
    pub volatile: bool,
}

/// Classifies every owned node for `revision` and settles the drains of granted nodes
/// (Events `Drained` and `EvictionBlocked` go to `events`). A node whose class `memo` kept
/// from the last round, still holding, keeps it in place.
pub(super) fn classify_nodes(
    input: &RolloutInput<'_>,
    owned: &[&NodeView],
    revision: &Arc<str>,
    events: &mut Vec<EventNote>,
    memo: &mut DecisionMemo,
) -> Classified {
    let mut classified = memo.begin(revision, input.spec, owned.len());
    let in_place = classified.states.len() == owned.len();
    for (index, node) in owned.iter().enumerate() {
        if in_place && let Some(kept) = memo.reusable(index, node, input.now) {
            classified.reused[index] = true;
            if kept.soaking {
                classified.soaking.push(index);
            }
            classified.wake_at.extend(kept.wake_at);
            continue;
        }
        let class = classify_node(input, node, revision, events);
        memo.found(index, node, input.now, &class);
        if class.soaking {
            classified.soaking.push(index);
        }
        classified.wake_at.extend(class.wake_at);
        classified.drains_pending.extend(class.drain_pending);
        if in_place {
            classified.states[index] = class.state;
            classified.intents[index] = class.intent;
        } else {
            classified.states.push(class.state);
            classified.intents.push(class.intent);
        }
    }
    classified
}

/// Where one node stands, what its plan should say, and when to look at it again.
fn classify_node(
    input: &RolloutInput<'_>,
    node: &NodeView,
    revision: &Arc<str>,
    events: &mut Vec<EventNote>,
) -> NodeClass {
    let plan = node.plan.as_ref();
    let mut state = plan
        .and_then(|p| classify(p, revision))
        .unwrap_or(NodeState::Pending);
    if state == NodeState::Pending && plan.is_some_and(busy_elsewhere) {
        state = NodeState::Updating;
    }
    let intent = intent_for(input, plan, revision);
    let mut class = NodeClass {
        state,
        intent,
        soaking: false,
        wake_at: None,
        drain_pending: None,
        volatile: false,
    };
    if let Some(failed) = past_progress_deadline(input, node, &mut class) {
        class.state = failed;
    }
    super::steer::retry(node, &mut class.state, &mut class.intent);
    super::steer::steer(node, &mut class.state, &mut class.intent);
    super::architecture::pass_over(input, node, &mut class.state);
    if class.state == NodeState::Succeeded {
        class.soaking = soaks(input, node, &mut class);
    }
    if class.state == NodeState::Updating
        && let Some(granted_at) = class.intent.granted_at
        && class.intent.desired_state == DesiredState::Staged
        && input.spec.disruption == Disruption::Drain
    {
        class.volatile = true;
        match drain_step(input, node, granted_at, events) {
            DrainStep::Activate => class.intent.desired_state = DesiredState::Active,
            DrainStep::GiveUp(timed_out) => {
                class.state = timed_out.state();
                class.intent.drain_timeout = Some(timed_out);
            }
            DrainStep::LookAgain(retry) => class.drain_pending = Some(retry),
        }
    }
    class
}

/// What the controller's part of a plan says before this round's grants: the revision and
/// the rollout's `allowDowngrade`, the grant, drain timeout and desired state kept while
/// the plan is for this revision, the cordon record kept whatever the revision (the cordon
/// is undone before it is forgotten).
fn intent_for(
    input: &RolloutInput<'_>,
    plan: Option<&PlanView>,
    revision: &Arc<str>,
) -> PlanIntent {
    let current = plan.filter(|p| p.intent.revision == *revision);
    PlanIntent {
        revision: Arc::clone(revision),
        desired_state: current.map_or(DesiredState::Staged, |p| p.intent.desired_state),
        granted_at: current.and_then(|p| p.intent.granted_at),
        ready_since: current.and_then(|p| p.intent.ready_since),
        cordoned: plan.is_some_and(|p| p.intent.cordoned),
        drain_timeout: current.and_then(|p| p.intent.drain_timeout.clone()),
        allow_downgrade: input.spec.allow_downgrade,
    }
}

/// The failure of a node that holds a slot for this revision past `progressDeadline`,
/// counted from its grant ([`super::GRANTED_ANNOTATION`], which survives restarts). A
/// node before its deadline asks to be looked at again when it passes.
fn past_progress_deadline(
    input: &RolloutInput<'_>,
    node: &NodeView,
    class: &mut NodeClass,
) -> Option<NodeState> {
    let deadline = input.spec.progress_deadline.as_ref()?;
    let granted_at = class
        .intent
        .granted_at
        .filter(|_| class.state == NodeState::Updating)?;
    let passes_at = progress_deadline_at(deadline, granted_at);
    if input.now < passes_at {
        class.wake_at = Some(passes_at);
        return None;
    }
    let phase = node
        .plan
        .as_ref()
        .and_then(|p| p.report.phase)
        .map_or_else(|| "no report".to_owned(), |p| format!("phase {p:?}"));
    Some(NodeState::Failed {
        reason: Reason::ProgressDeadlineExceeded.as_str().to_owned(),
        message: format!(
            "node {} did not finish within progressDeadline {} of its grant at {granted_at} \
             (agent: {phase}); its slot is released and it stays cordoned",
            node.name,
            deadline.as_str()
        ),
    })
}

/// When a node granted at `granted_at` passes `deadline` (`spec.progressDeadline`); the
/// rollout's rule above and the teardown of a deleted rollout both count so.
pub(crate) fn progress_deadline_at(deadline: &Duration, granted_at: Timestamp) -> Timestamp {
    let length = SignedDuration::try_from(deadline.get()).unwrap_or(SignedDuration::MAX);
    granted_at.saturating_add(length).unwrap_or(granted_at)
}

/// Whether a node that runs the revision after a grant is still soaking
/// (`minReadySeconds` from when the controller first saw it so, recorded on the plan as
/// [`super::READY_SINCE_ANNOTATION`]); a soak that has yet to end asks for a look then.
fn soaks(input: &RolloutInput<'_>, node: &NodeView, class: &mut NodeClass) -> bool {
    let min_ready = i64::from(input.spec.min_ready_seconds);
    if min_ready <= 0 || class.intent.granted_at.is_none() {
        return false;
    }
    // A soak starts only for a node the last status showed holding a slot (it has just
    // finished): turning minReadySeconds on mid-rollout neither soaks nor rewrites every
    // node that finished long ago.
    let just_finished = input
        .previous
        .is_some_and(|p| p.active_nodes.contains(&node.name));
    if class.intent.ready_since.is_none() {
        // Whether it starts a soak now depends on the last status, not the node alone.
        class.volatile = true;
        if !just_finished {
            return false;
        }
    }
    let since = *class.intent.ready_since.get_or_insert(input.now);
    let ends_at = since
        .saturating_add(SignedDuration::from_secs(min_ready))
        .unwrap_or(since);
    if input.now < ends_at {
        class.wake_at = Some(ends_at);
        return true;
    }
    false
}
