//! How the decision reads an agent's report: proto's `Outcome` (see proto/src/outcome.rs
//! for every edge case). These are the cases the decision's own reading got wrong.

use super::*;

#[test]
fn a_degraded_node_that_runs_the_revision_is_failed_and_stays_cordoned() {
    // A rollback failed on the node, which still has the revision committed; the rollout
    // then names that revision (rolled back to the previous release). The agent does
    // nothing more until a person looks: not a success, and not to be uncordoned.
    let mut s = spec(IntOrString::Int(1), 5);
    s.disruption = Disruption::Cordon;
    let mut n = failed(node("a"), Phase::Failed, "RollbackFailed");
    n.unschedulable = true;
    let p = n.plan.as_mut().unwrap();
    p.intent.cordoned = true;
    p.report.current_revision = Some(REV.into());
    p.report.degraded = true;
    let d = decide(&input(&s, vec![n]));
    assert_eq!(d.status.nodes.failed, 1, "{:?}", d.status.nodes);
    assert_eq!(d.status.nodes.succeeded, 0);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

#[test]
fn a_node_swapping_away_from_the_revision_it_runs_holds_a_slot() {
    // The node runs REV, the agent is activating OLD (the plan was moved back to REV
    // meanwhile): it finishes its swap first, so it is not done and it holds a slot.
    let s = spec(IntOrString::Int(1), 0);
    let mut busy = node("a");
    busy.plan = Some(plan(
        DesiredState::Staged,
        report(Phase::Activating, OLD, Some(REV)),
    ));
    let d = decide(&input(&s, vec![busy, staged(node("b"))]));
    assert!(granted(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(d.status.nodes.updating, 1);
    assert_eq!(d.status.nodes.succeeded, 0);
}

#[test]
fn a_failure_reported_for_an_older_generation_of_the_plan_does_not_count() {
    // The agent refused the plan (DowngradeDenied); the rollout then allowed the
    // downgrade, a new generation of the same revision. Until the agent reports on it,
    // the refusal is not a failure: with maxFailures 0 it would halt the rollout.
    let s = spec(IntOrString::Int(1), 0);
    let mut n = failed(node("a"), Phase::Failed, "DowngradeDenied");
    let p = n.plan.as_mut().unwrap();
    p.intent.granted_at = None;
    p.intent.desired_state = DesiredState::Staged;
    p.report.observed_generation = Some(2);
    p.report.plan_generation = Some(3);
    let d = decide(&input(&s, vec![n]));
    assert_eq!(d.status.nodes.failed, 0, "{:?}", d.status.nodes);
    assert_eq!(d.status.nodes.pending, 1);
    assert_eq!(condition(&d, "Halted").status, "False");
}
