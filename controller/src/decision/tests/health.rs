//! The health gates: updated nodes must be Ready, listed alerts must not fire, and an alert
//! gate without an answer blocks (fails closed).

use super::*;

fn not_ready(mut n: NodeView, why: &str) -> NodeView {
    n.readiness = Readiness::NotReady { why: why.into() };
    n
}

fn gated(alerts: &[&str]) -> NodeRolloutSpec {
    let mut s = spec(IntOrString::Int(2), 0);
    s.gates.alerts = alerts.iter().map(|a| (*a).to_owned()).collect();
    s
}

fn firing(names: &[&str]) -> AlertObservation {
    AlertObservation::Firing(names.iter().map(|n| (*n).to_owned()).collect())
}

fn progressing(d: &Decision) -> (String, String, String) {
    let p = condition(d, "Progressing");
    (p.status.clone(), p.reason.clone(), p.message.clone())
}

#[test]
fn an_updated_node_that_is_not_ready_blocks_new_grants() {
    let s = spec(IntOrString::Int(2), 0);
    let nodes = vec![
        not_ready(succeeded(node("a")), "Ready=False (KubeletNotReady)"),
        staged(node("b")),
        staged(node("c")),
    ];
    let d = decide(&input(&s, nodes));
    assert!(granted(&d).is_empty());
    let (status, reason, message) = progressing(&d);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NodeNotReady")
    );
    assert!(
        message.contains("1 updated nodes are not Ready: a (Ready=False (KubeletNotReady))"),
        "{message}"
    );
    assert!(has_event(&d, "NodeNotReady"));
}

#[test]
fn readiness_of_nodes_not_yet_updated_or_failed_does_not_matter() {
    // Only nodes that run the release vouch for it: a staged node that is not Ready is the
    // reason to update it, and a failed one already counts toward maxFailures. (Counted as
    // others' disruption, the staged one occupies a slot: `tests/foreign.rs`.)
    let mut s = spec(IntOrString::Int(2), 1);
    s.count_foreign_disruption = false;
    let nodes = vec![
        succeeded(node("a")),
        not_ready(staged(node("b")), "Ready=Unknown"),
        not_ready(
            failed(node("c"), Phase::RolledBack, "RolledBack"),
            "no Ready condition",
        ),
        not_ready(activating(node("d")), "Ready=False"),
        staged(node("e")),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["b"]);
    assert_eq!(progressing(&d).1, "RollingOut");
}

#[test]
fn a_not_ready_node_lets_activations_already_running_finish() {
    let s = spec(IntOrString::Int(3), 0);
    let nodes = vec![
        not_ready(succeeded(node("a")), "Ready=Unknown"),
        activating(node("b")),
        staged(node("c")),
    ];
    let d = decide(&input(&s, nodes));
    assert!(granted(&d).is_empty());
    assert_eq!(d.status.active_nodes, ["b"]);
    assert!(
        applies(&d)
            .iter()
            .all(|(node, intent)| *node != "b" || intent.desired_state == DesiredState::Active),
        "the activating node's plan is not taken back"
    );
}

#[test]
fn a_listed_alert_that_fires_blocks_and_is_named() {
    let s = gated(&["NodeDown", "HighErrorRate"]);
    let mut i = input(&s, vec![staged(node("a"))]);
    i.alerts = firing(&["HighErrorRate", "Watchdog"]);
    let d = decide(&i);
    assert!(granted(&d).is_empty());
    let (status, reason, message) = progressing(&d);
    assert_eq!((status.as_str(), reason.as_str()), ("False", "AlertFiring"));
    assert!(
        message.contains("alerts firing (spec.gates.alerts): HighErrorRate;"),
        "{message}"
    );
    assert!(!message.contains("Watchdog"), "{message}");
}

#[test]
fn alerts_the_rollout_does_not_list_do_not_block() {
    let s = gated(&["NodeDown"]);
    let mut i = input(&s, vec![staged(node("a"))]);
    i.alerts = firing(&["Watchdog", "nodedown"]);
    let d = decide(&i);
    assert_eq!(granted(&d), ["a"]);
    assert_eq!(progressing(&d).1, "RollingOut");
}

#[test]
fn an_alert_gate_without_an_answer_fails_closed() {
    let s = gated(&["NodeDown"]);
    for (observation, says) in [
        (
            AlertObservation::Unavailable("GET http://p/api/v1/alerts failed: refused".into()),
            "no answer from Prometheus: GET http://p/api/v1/alerts failed: refused",
        ),
        (AlertObservation::NotAsked, "Prometheus was not asked"),
    ] {
        let mut i = input(&s, vec![staged(node("a"))]);
        i.alerts = observation;
        let d = decide(&i);
        assert!(granted(&d).is_empty());
        let (status, reason, message) = progressing(&d);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "GateUnavailable")
        );
        assert!(message.contains(says), "{message}");
        assert!(has_event(&d, "GateUnavailable"));
    }
}

#[test]
fn without_listed_alerts_the_observation_is_not_read() {
    let s = spec(IntOrString::Int(1), 0);
    let mut i = input(&s, vec![staged(node("a"))]);
    i.alerts = AlertObservation::Unavailable("unused".into());
    assert_eq!(granted(&decide(&i)), ["a"]);
}

#[test]
fn every_blocking_gate_is_named_the_first_gives_the_reason() {
    let s = gated(&["NodeDown"]);
    let mut i = input(
        &s,
        vec![
            not_ready(succeeded(node("a")), "Ready=Unknown"),
            staged(node("b")),
        ],
    );
    i.alerts = firing(&["NodeDown"]);
    let d = decide(&i);
    let (_, reason, message) = progressing(&d);
    assert_eq!(reason, "NodeNotReady");
    assert!(message.contains("a (Ready=Unknown)"), "{message}");
    assert!(
        message.contains("alerts firing (spec.gates.alerts): NodeDown"),
        "{message}"
    );
}

#[test]
fn pause_and_windows_are_reported_before_the_gates() {
    let mut s = gated(&["NodeDown"]);
    s.paused = true;
    let mut i = input(&s, vec![staged(node("a"))]);
    i.alerts = firing(&["NodeDown"]);
    assert_eq!(progressing(&decide(&i)).1, "Paused");
}

#[test]
fn a_finished_rollout_is_complete_whatever_the_gates_say() {
    let s = gated(&["NodeDown"]);
    let mut i = input(&s, vec![not_ready(succeeded(node("a")), "Ready=False")]);
    i.alerts = AlertObservation::Unavailable("down".into());
    let d = decide(&i);
    assert_eq!(condition(&d, "Complete").status, "True");
}

#[test]
fn many_not_ready_nodes_are_counted_and_the_first_few_named() {
    let s = spec(IntOrString::Int(1), 0);
    let mut nodes: Vec<NodeView> = (0..8)
        .map(|i| not_ready(succeeded(node(&format!("n{i}"))), "Ready=False"))
        .collect();
    nodes.push(staged(node("z")));
    let d = decide(&input(&s, nodes));
    let message = progressing(&d).2;
    assert!(
        message.contains("8 updated nodes are not Ready"),
        "{message}"
    );
    assert!(message.contains("n4 (Ready=False) and 3 more"), "{message}");
}
