//! A person's steering of one node: hold (`inplace.dev/hold`) and skip (`inplace.dev/skip`).

use super::*;

fn held(mut n: NodeView) -> NodeView {
    n.steering.hold = true;
    n
}

fn skipped(mut n: NodeView) -> NodeView {
    n.steering.skip = true;
    n
}

/// Granted under `disruption: Drain`, cordoned, the drain still running (plan `Staged`).
fn draining_granted(name: &str) -> NodeView {
    let mut n = staged(node(name));
    n.unschedulable = true;
    let p = n.plan.as_mut().unwrap();
    p.intent.granted_at = Some(t(0));
    p.intent.cordoned = true;
    n
}

fn drain_spec(max_unavailable: i32) -> NodeRolloutSpec {
    let mut s = spec(IntOrString::Int(max_unavailable), 0);
    s.disruption = Disruption::Drain;
    s.drain_timeout = Duration::from_secs(600);
    s
}

/// What each case expects: the grants, the counts (staged, updating, succeeded, failed,
/// skipped), the held and skipped lists, and whether the rollout is complete.
struct Case {
    name: &'static str,
    spec: NodeRolloutSpec,
    nodes: Vec<NodeView>,
    granted: &'static [&'static str],
    counts: [i32; 5],
    held: &'static [&'static str],
    skipped: &'static [&'static str],
    complete: bool,
}

#[test]
fn hold_and_skip_table() {
    let one = || spec(IntOrString::Int(1), 0);
    let cases = vec![
        Case {
            name: "a held node is passed over, the next by name takes the slot",
            spec: one(),
            nodes: vec![held(staged(node("a"))), staged(node("b"))],
            granted: &["b"],
            counts: [1, 1, 0, 0, 0],
            held: &["a"],
            skipped: &[],
            complete: false,
        },
        Case {
            name: "a held node keeps no slot: the slot goes to another node",
            spec: spec(IntOrString::Int(2), 0),
            nodes: vec![
                held(staged(node("a"))),
                staged(node("b")),
                staged(node("c")),
            ],
            granted: &["b", "c"],
            counts: [1, 2, 0, 0, 0],
            held: &["a"],
            skipped: &[],
            complete: false,
        },
        Case {
            name: "a held node already activating finishes",
            spec: one(),
            nodes: vec![held(activating(node("a"))), staged(node("b"))],
            granted: &[],
            counts: [1, 1, 0, 0, 0],
            held: &["a"],
            skipped: &[],
            complete: false,
        },
        Case {
            name: "a held node whose drain runs gives its slot back",
            spec: drain_spec(1),
            nodes: vec![held(draining_granted("a")), staged(node("b"))],
            granted: &["b"],
            counts: [1, 1, 0, 0, 0],
            held: &["a"],
            skipped: &[],
            complete: false,
        },
        Case {
            name: "a held control-plane node keeps the workers waiting",
            spec: one(),
            nodes: vec![held(staged(cp("cp"))), staged(node("a"))],
            granted: &[],
            counts: [2, 0, 0, 0, 0],
            held: &["cp"],
            skipped: &[],
            complete: false,
        },
        Case {
            name: "a skipped node is never granted and counts as skipped",
            spec: one(),
            nodes: vec![skipped(staged(node("a"))), staged(node("b"))],
            granted: &["b"],
            counts: [0, 1, 0, 0, 1],
            held: &[],
            skipped: &["a"],
            complete: false,
        },
        Case {
            name: "a skipped control-plane node lets the workers go",
            spec: one(),
            nodes: vec![skipped(staged(cp("cp"))), staged(node("a"))],
            granted: &["a"],
            counts: [0, 1, 0, 0, 1],
            held: &[],
            skipped: &["cp"],
            complete: false,
        },
        Case {
            name: "a skipped failed node no longer counts toward maxFailures",
            spec: one(),
            nodes: vec![
                skipped(failed(node("a"), Phase::RolledBack, "HealthCheckFailed")),
                staged(node("b")),
            ],
            granted: &["b"],
            counts: [0, 1, 0, 0, 1],
            held: &[],
            skipped: &["a"],
            complete: false,
        },
        Case {
            name: "skipped and succeeded nodes make the rollout complete",
            spec: one(),
            nodes: vec![skipped(node("a")), succeeded(node("b"))],
            granted: &[],
            counts: [0, 0, 1, 0, 1],
            held: &[],
            skipped: &["a"],
            complete: true,
        },
        Case {
            name: "a node skipped after it succeeded stays succeeded",
            spec: one(),
            nodes: vec![skipped(succeeded(node("a")))],
            granted: &[],
            counts: [0, 0, 1, 0, 0],
            held: &[],
            skipped: &[],
            complete: true,
        },
        Case {
            name: "a skipped node already activating finishes",
            spec: one(),
            nodes: vec![skipped(activating(node("a"))), staged(node("b"))],
            granted: &[],
            counts: [1, 1, 0, 0, 0],
            held: &[],
            skipped: &[],
            complete: false,
        },
        Case {
            name: "hold and skip together: skip wins, the node is not listed as held",
            spec: one(),
            nodes: vec![held(skipped(staged(node("a")))), staged(node("b"))],
            granted: &["b"],
            counts: [0, 1, 0, 0, 1],
            held: &[],
            skipped: &["a"],
            complete: false,
        },
    ];
    for case in cases {
        let d = decide(&input(&case.spec, case.nodes));
        let c = &d.status.nodes;
        assert_eq!(granted(&d), case.granted, "{}: grants", case.name);
        assert_eq!(
            [c.staged, c.updating, c.succeeded, c.failed, c.skipped],
            case.counts,
            "{}: counts {c:?}",
            case.name
        );
        assert_eq!(d.status.held_nodes, case.held, "{}: held", case.name);
        assert_eq!(
            d.status.skipped_nodes, case.skipped,
            "{}: skipped",
            case.name
        );
        let complete = condition(&d, "Complete").status == "True";
        assert_eq!(complete, case.complete, "{}: complete", case.name);
        assert_eq!(condition(&d, "Halted").status, "False", "{}", case.name);
    }
}

#[test]
fn a_held_node_whose_drain_runs_is_uncordoned_and_its_grant_forgotten() {
    let s = drain_spec(1);
    let d = decide(&input(&s, vec![held(draining_granted("a"))]));
    assert!(
        d.actions
            .contains(&NodeAction::Uncordon { node: "a".into() }),
        "{:?}",
        d.actions
    );
    let (_, intent) = applies(&d).into_iter().find(|(n, _)| *n == "a").unwrap();
    assert_eq!(intent.granted_at, None);
    assert!(!intent.cordoned);
    assert_eq!(intent.desired_state, DesiredState::Staged);
    assert!(!needs_drain_pass(
        &s,
        &ReleaseState::Valid {
            revision: REV.into()
        },
        &held(draining_granted("a"))
    ));
}

#[test]
fn a_skipped_node_keeps_its_plan_on_the_revision_it_runs() {
    let s = spec(IntOrString::Int(1), 0);
    let mut on_old = staged(node("a"));
    on_old.plan.as_mut().unwrap().intent.revision = OLD.into();
    let d = decide(&input(&s, vec![skipped(on_old), skipped(node("b"))]));
    assert!(applies(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(d.status.nodes.skipped, 2);
}

#[test]
fn hold_release_and_skip_are_announced_once() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = || vec![held(staged(node("a"))), skipped(staged(node("b")))];
    let first = decide(&input(&s, nodes()));
    for reason in [NODE_HELD, NODE_SKIPPED] {
        let note = first.events.iter().find(|e| e.reason == reason).unwrap();
        assert_eq!(
            note.node.as_deref(),
            Some(if reason == NODE_HELD { "a" } else { "b" })
        );
        let mirrored = if reason == NODE_HELD {
            node_event::HELD
        } else {
            node_event::SKIPPED
        };
        assert_eq!(
            note.on_node,
            Some(mirrored),
            "also on the Node and its plan"
        );
    }
    let mut again = input(&s, nodes());
    again.previous = Some(&first.status);
    let second = decide(&again);
    assert!(!has_event(&second, NODE_HELD) && !has_event(&second, NODE_SKIPPED));
    let mut released = input(&s, vec![staged(node("a")), skipped(staged(node("b")))]);
    released.previous = Some(&first.status);
    let third = decide(&released);
    assert!(has_event(&third, NODE_RELEASED), "{:?}", third.events);
    assert_eq!(granted(&third), ["a"]);
}

/// A person's token on the plan that its agent has not honoured yet.
fn retried(mut n: NodeView) -> NodeView {
    n.plan.as_mut().unwrap().retry_pending = true;
    n
}

/// A failed node with a drain that timed out (`inplace.dev/drain-timeout`), still cordoned.
fn drain_timed_out(name: &str) -> NodeView {
    let mut n = draining_granted(name);
    n.plan.as_mut().unwrap().intent.drain_timeout = Some(DrainTimedOut {
        message: "pod p left".into(),
        skipped: false,
    });
    n
}

/// (name, spec, nodes, grants, counts [staged, updating, succeeded, failed, skipped],
/// halted)
type RetryCase = (
    &'static str,
    NodeRolloutSpec,
    Vec<NodeView>,
    &'static [&'static str],
    [i32; 5],
    bool,
);

#[test]
fn retry_table() {
    let halting = || spec(IntOrString::Int(1), 0);
    let rolled_back = |name| failed(node(name), Phase::RolledBack, "HealthCheckFailed");
    let cases: Vec<RetryCase> = vec![
        (
            "without a token a failure halts the rollout",
            halting(),
            vec![rolled_back("a"), staged(node("b"))],
            &[],
            [1, 0, 0, 1, 0],
            true,
        ),
        (
            "a pending retry is not a failure: the halt lifts and the next node is granted",
            halting(),
            vec![retried(rolled_back("a")), staged(node("b"))],
            &["b"],
            [0, 1, 0, 0, 0],
            false,
        ),
        (
            "a node retried is not granted before its agent stages the revision again",
            halting(),
            vec![retried(rolled_back("a"))],
            &[],
            [0, 0, 0, 0, 0],
            false,
        ),
        (
            "a drain timeout is retried too",
            drain_spec(1),
            vec![retried(drain_timed_out("a"))],
            &[],
            [0, 0, 0, 0, 0],
            false,
        ),
        (
            "a token on a node that did not fail changes nothing",
            halting(),
            vec![retried(staged(node("a"))), retried(succeeded(node("b")))],
            &["a"],
            [0, 1, 1, 0, 0],
            false,
        ),
        (
            "skip wins over retry: the node counts as skipped",
            halting(),
            vec![skipped(retried(rolled_back("a")))],
            &[],
            [0, 0, 0, 0, 1],
            false,
        ),
    ];
    for (name, spec, nodes, grants, counts, halted) in cases {
        let d = decide(&input(&spec, nodes));
        let c = &d.status.nodes;
        assert_eq!(granted(&d), grants, "{name}: grants");
        assert_eq!(
            [c.staged, c.updating, c.succeeded, c.failed, c.skipped],
            counts,
            "{name}: counts {c:?}"
        );
        let is_halted = condition(&d, "Halted").status == "True";
        assert_eq!(is_halted, halted, "{name}: halted");
    }
}

#[test]
fn a_retried_node_goes_back_to_staged_without_its_grant_or_drain_record() {
    let cases = [
        (
            spec(IntOrString::Int(1), 0),
            retried(failed(node("a"), Phase::RolledBack, "HealthCheckFailed")),
        ),
        (drain_spec(1), retried(drain_timed_out("a"))),
    ];
    for (s, n) in cases {
        let d = decide(&input(&s, vec![n]));
        let (_, intent) = applies(&d).into_iter().find(|(n, _)| *n == "a").unwrap();
        assert_eq!(intent.desired_state, DesiredState::Staged);
        assert_eq!(intent.granted_at, None);
        assert_eq!(intent.drain_timeout, None);
    }
}

#[test]
fn once_the_agent_honoured_the_token_its_new_report_counts() {
    // `retry_pending` is false once status.retryHonoured shows the token: a failure
    // reported after it is a failure again.
    let s = spec(IntOrString::Int(1), 0);
    let again = failed(node("a"), Phase::RolledBack, "HealthCheckFailed");
    let d = decide(&input(&s, vec![again]));
    assert_eq!(d.status.nodes.failed, 1);
    let mut staged_again = staged(node("a"));
    staged_again.plan.as_mut().unwrap().retry_pending = false;
    let d = decide(&input(&s, vec![staged_again]));
    assert_eq!(granted(&d), ["a"]);
}
