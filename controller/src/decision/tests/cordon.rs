//! The cordon of `disruption: Cordon`: recorded, made, then the plan activated; undone only
//! when inplace cordoned.

use super::*;

#[test]
fn cordon_is_recorded_then_made_then_the_plan_activated() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.disruption = Disruption::Cordon;
    let d = decide(&input(&s, vec![staged(node("a"))]));
    let actions = without_scale_down(&d);
    assert_eq!(actions.len(), 3, "{:?}", d.actions);
    let NodeAction::ApplyPlan { intent: first, .. } = actions[0] else {
        panic!("{:?}", d.actions)
    };
    assert!(first.cordoned && first.desired_state == DesiredState::Staged);
    assert_eq!(*actions[1], NodeAction::Cordon { node: "a".into() });
    let NodeAction::ApplyPlan { intent: last, .. } = actions[2] else {
        panic!("{:?}", d.actions)
    };
    assert!(last.cordoned && last.desired_state == DesiredState::Active);
    assert!(has_event(&d, "Cordoned"));
}

#[test]
fn uncordon_after_success_only_when_we_cordoned() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.disruption = Disruption::Cordon;
    let mut ours = succeeded(node("a"));
    ours.unschedulable = true;
    ours.plan.as_mut().unwrap().intent.cordoned = true;
    let mut theirs = succeeded(node("b"));
    theirs.unschedulable = true;
    let d = decide(&input(&s, vec![ours, theirs]));
    assert_eq!(d.actions[0], NodeAction::Uncordon { node: "a".into() });
    let a = applies(&d);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, "a");
    assert!(!a[0].1.cordoned);
    assert!(
        !d.actions
            .contains(&NodeAction::Uncordon { node: "b".into() })
    );
}

#[test]
fn a_person_cordoned_node_is_not_recorded_as_ours() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.disruption = Disruption::Cordon;
    // Counted, the cordon would keep the node waiting (`tests/foreign.rs`).
    s.count_foreign_disruption = false;
    let mut n = staged(node("a"));
    n.unschedulable = true;
    let d = decide(&input(&s, vec![n]));
    assert_eq!(without_scale_down(&d).len(), 1);
    let (_, intent) = applies(&d)[0];
    assert!(!intent.cordoned);
    assert_eq!(intent.desired_state, DesiredState::Active);
}

#[test]
fn rollback_failed_keeps_the_cordon() {
    let mut s = spec(IntOrString::Int(1), 5);
    s.disruption = Disruption::Cordon;
    let mut n = failed(node("a"), Phase::Failed, "RollbackFailed");
    n.unschedulable = true;
    n.plan.as_mut().unwrap().intent.cordoned = true;
    let d = decide(&input(&s, vec![n]));
    assert!(d.actions.is_empty(), "{:?}", d.actions);

    let mut n = failed(node("a"), Phase::RolledBack, "HealthCheckFailed");
    n.unschedulable = true;
    n.plan.as_mut().unwrap().intent.cordoned = true;
    let d = decide(&input(&s, vec![n]));
    assert_eq!(d.actions[0], NodeAction::Uncordon { node: "a".into() });
}
