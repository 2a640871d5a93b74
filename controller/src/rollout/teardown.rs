//! What a deleted NodeRollout leaves behind: one pure function from the plans the rollout
//! owns (and whether their nodes are cordoned) to the writes that undo the rollout's own
//! cordons, and whether its finalizer may go.
//!
//! A rollout carries the finalizer [`UNCORDON_FINALIZER`] from its first reconcile, so its
//! deletion waits for this teardown. The rollout's memory of what it cordoned is the plan's
//! `inplace.dev/cordoned` annotation, written *before* the cordon is made
//! ([`crate::decision`]); a node a person cordoned never carries it and is never uncordoned.
//! A node whose agent is still swapping stays cordoned until the agent reports a final
//! phase, so a deletion never opens a node to pods mid-swap — or, when the rollout has a
//! `progressDeadline`, until that passes since its grant: then the node stays cordoned for
//! a person and the rollout goes. The autoscaler's scale-down annotation the rollout set
//! (`decision/autoscaler.rs`) is removed from every node not waited for.
//! `docs/design/controller.md` (§ Deleting a rollout) describes the rules.

use std::time::Duration;

use inplace_proto::reason::Reason;
use inplace_proto::{DesiredState, Duration as ApiDuration};
use k8s_openapi::jiff::Timestamp;

use crate::decision::{
    EventKind, EventNote, NodeState, PlanView, busy_elsewhere, classify, event, keeps_cordon,
    progress_deadline_at,
};

/// The finalizer every NodeRollout carries until the nodes it cordoned are uncordoned.
pub const UNCORDON_FINALIZER: &str = "inplace.dev/uncordon";

/// How often a deleted rollout that waits for a node's activation looks again (the plan
/// watch usually wakes it sooner).
pub const TEARDOWN_RETRY: Duration = Duration::from_secs(10);

/// A node whose plan the deleted rollout owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeardownNode {
    /// The node's (and plan's) name.
    pub name: String,
    /// The node's `spec.unschedulable`; `None` when the Node is gone (its plan goes with it).
    pub unschedulable: Option<bool>,
    /// The plan, as the controller last wrote it, with the agent's report.
    pub plan: PlanView,
    /// The Node carries inplace's mark that it disabled the autoscaler's scale-down
    /// (`decision/autoscaler.rs`).
    pub scale_down_ours: bool,
}

/// One write of the teardown, in order per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TeardownAction {
    /// Set `spec.unschedulable: false` on the node.
    Uncordon {
        /// The node.
        node: String,
    },
    /// Remove the `inplace.dev/cordoned` annotation from the node's plan: the cordon is
    /// undone (or was undone by someone else), so nobody should undo it again.
    ForgetCordon {
        /// The node (and plan).
        node: String,
    },
    /// Remove the autoscaler's scale-down annotation and inplace's mark of it from the
    /// Node (`decision/autoscaler.rs`).
    RestoreScaleDown {
        /// The node.
        node: String,
    },
}

impl TeardownAction {
    /// The node the action concerns.
    pub fn node(&self) -> &str {
        match self {
            TeardownAction::Uncordon { node }
            | TeardownAction::ForgetCordon { node }
            | TeardownAction::RestoreScaleDown { node } => node,
        }
    }
}

/// What the teardown decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Teardown {
    /// Writes to make; a node's writes come in the order given.
    pub actions: Vec<TeardownAction>,
    /// Nodes still activating: the finalizer stays until they report a final phase.
    pub waiting: Vec<String>,
    /// Events to publish on the rollout.
    pub events: Vec<EventNote>,
}

impl Teardown {
    /// Whether the finalizer may be removed once the actions are carried out.
    pub fn finished(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// Decides the teardown of a deleted rollout over the plans it owns, in any order, at
/// `now`, under the rollout's `progressDeadline`.
pub fn decide_teardown(
    nodes: &[TeardownNode],
    progress_deadline: Option<&ApiDuration>,
    now: Timestamp,
) -> Teardown {
    let mut nodes: Vec<&TeardownNode> = nodes.iter().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut teardown = Teardown::default();
    for node in nodes {
        let waiting = undo_cordon(node, progress_deadline, now, &mut teardown);
        // The autoscaler's annotation goes with the cordon: once the node is not activating.
        if node.scale_down_ours && node.unschedulable.is_some() && !waiting {
            teardown.actions.push(TeardownAction::RestoreScaleDown {
                node: node.name.clone(),
            });
        }
    }
    teardown
}

/// Undoes the rollout's cordon of `node`, if it made one; returns whether the node is
/// still activating (the teardown waits for it).
fn undo_cordon(
    node: &TeardownNode,
    progress_deadline: Option<&ApiDuration>,
    now: Timestamp,
    teardown: &mut Teardown,
) -> bool {
    let plan = &node.plan;
    if !plan.intent.cordoned {
        return false;
    }
    let Some(unschedulable) = node.unschedulable else {
        return false;
    };
    // A hand-written plan names no revision (empty): nothing to classify it by.
    let state = Some(&plan.intent.revision)
        .filter(|revision| !revision.is_empty())
        .and_then(|revision| classify(plan, revision))
        .map(|state| past_deadline(plan, state, progress_deadline, now));
    let past_deadline = state.as_ref().is_some_and(|s| {
        matches!(s, NodeState::Failed { reason, .. }
                if reason == Reason::ProgressDeadlineExceeded.as_str())
    });
    let activating = !past_deadline
        && (busy_elsewhere(plan)
            || (state == Some(NodeState::Updating)
                && plan.intent.desired_state == DesiredState::Active));
    if activating {
        teardown.waiting.push(node.name.clone());
        teardown.events.push(event(
            EventKind::Normal,
            "WaitingForActivation",
            format!(
                "node {} stays cordoned until its agent finishes the activation it started",
                node.name
            ),
            &node.name,
        ));
        return true;
    }
    if let Some(state) = state.as_ref().filter(|s| keeps_cordon(s)) {
        let why = match state {
            NodeState::Failed { reason, message } => format!("{reason}: {message}"),
            _ => String::new(),
        };
        teardown.events.push(event(
            EventKind::Warning,
            "KeptCordoned",
            format!(
                "node {} stays cordoned, it needs a person: {why}",
                node.name
            ),
            &node.name,
        ));
        return false;
    }
    if unschedulable {
        teardown.actions.push(TeardownAction::Uncordon {
            node: node.name.clone(),
        });
        teardown.events.push(event(
            EventKind::Normal,
            "Uncordoned",
            format!(
                "node {} uncordoned: the rollout that cordoned it was deleted",
                node.name
            ),
            &node.name,
        ));
    }
    // Forgotten only after the uncordon: a crash in between leaves the record, and the
    // next round finds the node schedulable and just forgets it.
    teardown.actions.push(TeardownAction::ForgetCordon {
        node: node.name.clone(),
    });
    false
}

/// A granted node still activating past `progressDeadline` is failed, as during the
/// rollout ([`crate::decision`]): it stays cordoned, and nobody waits for it any longer.
fn past_deadline(
    plan: &PlanView,
    state: NodeState,
    deadline: Option<&ApiDuration>,
    now: Timestamp,
) -> NodeState {
    let (Some(deadline), Some(granted_at)) = (deadline, plan.intent.granted_at) else {
        return state;
    };
    if state != NodeState::Updating || now < progress_deadline_at(deadline, granted_at) {
        return state;
    }
    NodeState::Failed {
        reason: Reason::ProgressDeadlineExceeded.as_str().to_owned(),
        message: format!(
            "not finished within progressDeadline {} of its grant at {granted_at}",
            deadline.as_str()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{PlanIntent, PlanReport};
    use inplace_proto::Phase;
    use inplace_proto::reason::Reason;

    const REV: &str = "aaaaaaaaaaaa";

    fn plan(desired: DesiredState, phase: Option<Phase>, cordoned: bool) -> PlanView {
        PlanView {
            intent: PlanIntent {
                revision: REV.into(),
                desired_state: desired,
                granted_at: Some("2026-11-25T09:00:00Z".parse().unwrap()),
                ready_since: None,
                cordoned,
                drain_timeout: None,
                allow_downgrade: false,
            },
            retry_pending: false,
            report: PlanReport {
                phase,
                target_revision: Some(REV.into()),
                ..PlanReport::default()
            },
        }
    }

    fn node(name: &str, unschedulable: Option<bool>, plan: PlanView) -> TeardownNode {
        TeardownNode {
            name: name.into(),
            unschedulable,
            plan,
            scale_down_ours: false,
        }
    }

    fn decide_teardown_now(nodes: &[TeardownNode]) -> Teardown {
        decide_teardown(nodes, None, Timestamp::now())
    }

    #[test]
    fn a_node_mid_activation_past_the_progress_deadline_stays_cordoned_and_is_not_waited_for() {
        let deadline = ApiDuration::from_secs(600);
        let granted: Timestamp = "2026-11-25T09:00:00Z".parse().unwrap();
        let nodes = [node(
            "w1",
            Some(true),
            plan(DesiredState::Active, Some(Phase::Activating), true),
        )];
        // (now, still waited for)
        for (now, waits) in [(599, true), (600, false)] {
            let now = granted
                .checked_add(jiff::SignedDuration::from_secs(now))
                .unwrap();
            let t = decide_teardown(&nodes, Some(&deadline), now);
            assert_eq!(t.finished(), !waits, "at {now}");
            assert!(t.actions.is_empty(), "never uncordoned mid-swap");
            if !waits {
                let kept = &t.events[0];
                assert_eq!(
                    (kept.kind, kept.reason.as_str()),
                    (EventKind::Warning, "KeptCordoned")
                );
                assert!(
                    kept.note.contains("ProgressDeadlineExceeded"),
                    "{}",
                    kept.note
                );
            }
        }
        // Without a deadline (today's behaviour) it is waited for, however long.
        let later = granted
            .checked_add(jiff::SignedDuration::from_hours(48))
            .unwrap();
        assert!(!decide_teardown(&nodes, None, later).finished());
    }

    fn uncordon_and_forget(node: &str) -> Vec<TeardownAction> {
        vec![
            TeardownAction::Uncordon { node: node.into() },
            TeardownAction::ForgetCordon { node: node.into() },
        ]
    }

    #[test]
    fn a_node_the_rollout_cordoned_is_uncordoned_once_final() {
        for phase in [Phase::Succeeded, Phase::RolledBack, Phase::Failed] {
            let t = decide_teardown_now(&[node(
                "w1",
                Some(true),
                plan(DesiredState::Active, Some(phase), true),
            )]);
            assert_eq!(t.actions, uncordon_and_forget("w1"), "{phase:?}");
            assert!(t.finished());
            assert_eq!(t.events[0].reason, "Uncordoned");
        }
    }

    #[test]
    fn the_autoscaler_annotation_goes_once_the_node_is_not_activating() {
        let marked = |name: &str, cordoned: bool, phase: Option<Phase>| TeardownNode {
            scale_down_ours: true,
            ..node(
                name,
                Some(cordoned),
                plan(DesiredState::Active, phase, cordoned),
            )
        };
        let t = decide_teardown_now(&[
            marked("w1", false, Some(Phase::Activating)),
            marked("w2", true, Some(Phase::Activating)),
            marked("w3", true, Some(Phase::Succeeded)),
        ]);
        let restore = |node: &str| TeardownAction::RestoreScaleDown { node: node.into() };
        let mut want = vec![restore("w1")];
        want.extend(uncordon_and_forget("w3"));
        want.push(restore("w3"));
        assert_eq!(t.actions, want, "w2 is waited for, its mark kept");
        assert_eq!(t.waiting, ["w2"]);
    }

    #[test]
    fn a_node_a_person_cordoned_is_never_touched() {
        let t = decide_teardown_now(&[node(
            "w1",
            Some(true),
            plan(DesiredState::Active, Some(Phase::Succeeded), false),
        )]);
        assert_eq!(t, Teardown::default());
    }

    #[test]
    fn a_node_mid_activation_keeps_the_finalizer_and_its_cordon() {
        for (desired, phase) in [
            // Granted, the agent has not picked it up yet.
            (DesiredState::Active, Some(Phase::Staged)),
            (DesiredState::Active, Some(Phase::Activating)),
            (DesiredState::Active, Some(Phase::Verifying)),
            (DesiredState::Active, Some(Phase::RollingBack)),
            // Busy with another revision's swap, whatever the plan says now.
            (DesiredState::Staged, Some(Phase::Activating)),
        ] {
            let t = decide_teardown_now(&[node("w1", Some(true), plan(desired, phase, true))]);
            assert!(t.actions.is_empty(), "{desired:?} {phase:?}");
            assert_eq!(t.waiting, ["w1"]);
            assert!(!t.finished());
            assert_eq!(t.events[0].reason, "WaitingForActivation");
        }
    }

    #[test]
    fn a_node_still_waiting_for_its_drain_is_uncordoned_at_once() {
        // Drain mode: granted and cordoned, the plan stays Staged until the node is drained;
        // without the rollout nobody drains it, and it was never activated.
        let t = decide_teardown_now(&[node(
            "w1",
            Some(true),
            plan(DesiredState::Staged, Some(Phase::Staged), true),
        )]);
        assert_eq!(t.actions, uncordon_and_forget("w1"));
        assert!(t.finished());
    }

    #[test]
    fn a_rollback_failure_stays_cordoned_for_a_person() {
        let mut p = plan(DesiredState::Active, Some(Phase::Failed), true);
        p.report.reason = Some(Reason::RollbackFailed.as_str().into());
        p.report.message = Some("kubelet.service did not come back".into());
        let t = decide_teardown_now(&[node("w1", Some(true), p)]);
        assert!(t.actions.is_empty());
        assert!(t.finished());
        assert_eq!(t.events[0].reason, "KeptCordoned");
        assert_eq!(t.events[0].kind, EventKind::Warning);
        assert!(
            t.events[0].note.contains("RollbackFailed"),
            "{:?}",
            t.events
        );
    }

    #[test]
    fn a_cordon_someone_else_undid_is_only_forgotten() {
        let t = decide_teardown_now(&[node(
            "w1",
            Some(false),
            plan(DesiredState::Active, Some(Phase::Succeeded), true),
        )]);
        assert_eq!(
            t.actions,
            [TeardownAction::ForgetCordon { node: "w1".into() }]
        );
        assert!(t.events.is_empty());
    }

    #[test]
    fn a_deleted_node_needs_nothing() {
        let t = decide_teardown_now(&[node(
            "w1",
            None,
            plan(DesiredState::Active, Some(Phase::Activating), true),
        )]);
        assert_eq!(t, Teardown::default());
    }

    #[test]
    fn a_fleet_is_torn_down_node_by_node_in_name_order() {
        let t = decide_teardown_now(&[
            node(
                "w3",
                Some(true),
                plan(DesiredState::Active, Some(Phase::Verifying), true),
            ),
            node(
                "w2",
                Some(true),
                plan(DesiredState::Active, Some(Phase::Succeeded), true),
            ),
            node(
                "w1",
                Some(true),
                plan(DesiredState::Staged, Some(Phase::Staged), false),
            ),
        ]);
        assert_eq!(t.actions, uncordon_and_forget("w2"));
        assert_eq!(t.waiting, ["w3"]);
        assert!(t.actions.iter().all(|a| a.node() == "w2"));
    }
}
