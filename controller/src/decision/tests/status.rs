//! The rollout's status and the order of activation: condition times, reasons of agent
//! failures, control plane first then by name, the same decision whatever the input order.

use super::*;

#[test]
fn condition_times_are_kept_while_the_status_holds() {
    let s = spec(IntOrString::Int(1), 0);
    let first = decide(&input(
        &s,
        vec![activating(node("a")), staged(node("b")), node("c")],
    ));
    let previous = first.status.clone();
    let mut i = input(
        &s,
        vec![succeeded(node("a")), activating(node("b")), node("c")],
    );
    i.now = t(500);
    i.previous = Some(&previous);
    let second = decide(&i);
    let before = condition(&first, "Progressing");
    let after = condition(&second, "Progressing");
    assert_eq!(before.last_transition_time, after.last_transition_time);
    assert_ne!(before.message, after.message);
    assert!(!has_event(&second, "RollingOut"), "no transition, no event");
}

#[test]
fn an_agent_failure_without_a_condition_still_has_a_reason() {
    let s = spec(IntOrString::Int(1), 0);
    let mut n = node("a");
    let mut p = plan(
        DesiredState::Active,
        report(Phase::RolledBack, REV, Some(OLD)),
    );
    p.intent.granted_at = Some(t(0));
    n.plan = Some(p);
    let d = decide(&input(&s, vec![n]));
    assert_eq!(d.status.failed_nodes[0].reason, "RolledBack");
}

#[test]
fn activation_order_is_control_plane_then_name() {
    let mut nodes = [node("b"), cp("z"), node("a"), cp("c")];
    nodes.sort_by(activation_order);
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["c", "z", "a", "b"]);
}

#[test]
fn nodes_given_in_activation_order_are_decided_as_if_sorted_by_the_decision() {
    let s = spec(IntOrString::Int(1), 0);
    let shuffled = vec![
        staged(node("b")),
        staged(cp("z")),
        node("a"),
        staged(cp("c")),
    ];
    let mut sorted = shuffled.clone();
    sorted.sort_by(activation_order);
    let mut in_order = input(&s, sorted);
    in_order.order = NodeOrder::Activation;
    let d = decide(&in_order);
    assert_eq!(d, decide(&input(&s, shuffled)));
    assert_eq!(d.actions[0].node(), "c", "{:?}", d.actions);
}
