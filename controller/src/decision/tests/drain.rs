//! `spec.drain`: the options of each pass (podSelector, gracePeriodSeconds, forced after
//! the timeout) and what `onTimeout` makes of a node not drained within `drainTimeout`.

use super::*;
use inplace_proto::{DrainSpec, OnDrainTimeout};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::core::SelectorExt;

fn drain_spec(on_timeout: OnDrainTimeout, allow_force: bool, max_failures: i32) -> NodeRolloutSpec {
    let mut s = spec(IntOrString::Int(1), max_failures);
    s.disruption = Disruption::Drain;
    s.drain = DrainSpec {
        on_timeout,
        allow_force,
        ..DrainSpec::default()
    };
    s
}

/// A node granted at `granted_at` (now is 100, `drainTimeout` 60 s) with `remaining` pods
/// left after this round's pass, one of them held by a PodDisruptionBudget.
fn left_with(granted_at: i64, remaining: usize) -> NodeView {
    let mut n = draining("a", granted_at);
    n.drain = Some(DrainProgress {
        remaining,
        blocked: vec!["default/db-0: Cannot evict pod (budget db)".into()],
    });
    n
}

/// What the round did with node "a", in words the table compares.
#[derive(Debug, PartialEq)]
enum Outcome {
    Failed,
    Skipped,
    Forcing,
    Waiting,
    Activated,
}

fn outcome(d: &Decision) -> Outcome {
    let a = d.actions.iter().find_map(|a| match a {
        NodeAction::ApplyPlan { node, intent } if node == "a" => Some(intent),
        _ => None,
    });
    if a.is_some_and(|i| i.desired_state == DesiredState::Active) {
        return Outcome::Activated;
    }
    match (d.status.nodes.failed, d.status.nodes.skipped) {
        (1, 0) => Outcome::Failed,
        (0, 1) => Outcome::Skipped,
        _ if has_event(d, "DrainForced") => Outcome::Forcing,
        _ => Outcome::Waiting,
    }
}

#[test]
fn on_timeout_decides_what_a_node_not_drained_in_time_becomes() {
    use OnDrainTimeout::{Force, Halt, Skip};
    // (onTimeout, allowForce, granted at, pods left, what happens, forced pass)
    let rows = [
        (Halt, false, 90, 1, Outcome::Waiting, false),
        (Halt, false, 30, 1, Outcome::Failed, false),
        (Skip, false, 90, 1, Outcome::Waiting, false),
        (Skip, false, 30, 1, Outcome::Skipped, false),
        (Force, true, 90, 1, Outcome::Waiting, false),
        // Past drainTimeout: this round's pass deleted the pods; wait for them to go.
        (Force, true, 30, 1, Outcome::Forcing, true),
        (Force, true, 30, 0, Outcome::Activated, true),
        // Past twice drainTimeout with pods still there: failed after all.
        (Force, true, -30, 1, Outcome::Failed, true),
        // Force without the opt-in (the API server refuses it; an older object): the
        // rollout is invalid and touches nothing (`InvalidRollout`, issue 35).
        (Force, false, 30, 1, Outcome::Waiting, false),
    ];
    for (on_timeout, allow_force, granted_at, left, want, forced) in rows {
        let s = drain_spec(on_timeout, allow_force, 1);
        let n = left_with(granted_at, left);
        let options = drain_pass_options(&s, &n, t(100)).unwrap();
        let row =
            format!("{on_timeout:?} allowForce={allow_force} granted {granted_at} left {left}");
        assert_eq!(options.force, forced, "{row}: forced pass");
        let d = decide(&input(&s, vec![n]));
        assert_eq!(outcome(&d), want, "{row}: {:?}", d.actions);
    }
}

#[test]
fn skip_uncordons_counts_the_node_skipped_and_the_rollout_goes_on() {
    // maxFailures 0: a failure would halt; a skip does not.
    let s = drain_spec(OnDrainTimeout::Skip, false, 0);
    let d = decide(&input(&s, vec![left_with(30, 1), staged(node("b"))]));
    assert_eq!(
        *without_scale_down(&d)[0],
        NodeAction::Uncordon { node: "a".into() }
    );
    let a = applies(&d);
    let (_, intent) = a.iter().find(|(n, _)| *n == "a").unwrap();
    let timed_out = intent.drain_timeout.as_ref().unwrap();
    assert!(timed_out.skipped);
    assert!(
        timed_out.message.contains("budget db"),
        "{}",
        timed_out.message
    );
    assert_eq!(
        intent.desired_state,
        DesiredState::Staged,
        "never activated"
    );
    assert!(!intent.cordoned);
    assert_eq!(d.status.nodes.skipped, 1);
    assert_eq!(d.status.nodes.failed, 0);
    assert!(d.status.failed_nodes.is_empty());
    assert_eq!(d.status.skipped_nodes, ["a"]);
    assert_eq!(condition(&d, "Halted").status, "False");
    assert_eq!(granted(&d), ["b"], "the slot goes to the next node");
    let skipped = d.events.iter().find(|e| e.reason == NODE_SKIPPED).unwrap();
    assert!(skipped.note.contains("(DrainTimeout)"), "{}", skipped.note);
    assert!(skipped.note.contains("onTimeout: Skip"), "{}", skipped.note);
    // Also on the Node and its plan, as a person's skip is.
    assert_eq!(skipped.on_node, Some(node_event::SKIPPED));
    assert!(!has_event(&d, "DrainTimeout"), "not a failure");
}

#[test]
fn a_recorded_skip_stays_skipped_and_the_rollout_completes_around_it() {
    let s = drain_spec(OnDrainTimeout::Skip, false, 0);
    let mut a = staged(node("a"));
    let p = a.plan.as_mut().unwrap();
    p.intent.granted_at = Some(t(0));
    p.intent.drain_timeout = Some(DrainTimedOut {
        message: "node a not drained within 60s".into(),
        skipped: true,
    });
    let valid = ReleaseState::Valid {
        revision: REV.into(),
    };
    assert!(!needs_drain_pass(&s, &valid, &a));
    let d = decide(&input(&s, vec![a, succeeded(node("b"))]));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.status.nodes.skipped, 1);
    let complete = condition(&d, "Complete");
    assert_eq!(complete.status, "True");
    assert_eq!(complete.reason, "AllNodesUpdated");
    assert!(
        complete.message.contains("1 skipped"),
        "{}",
        complete.message
    );

    // Once reported, the skip is not announced again.
    let previous = d.status.clone();
    let mut i = input(&s, vec![]);
    i.previous = Some(&previous);
    let mut a = staged(node("a"));
    a.plan.as_mut().unwrap().intent.drain_timeout = Some(DrainTimedOut {
        message: "m".into(),
        skipped: true,
    });
    i.nodes = vec![a, succeeded(node("b"))];
    assert!(!has_event(&decide(&i), NODE_SKIPPED));
}

#[test]
fn a_skipped_control_plane_node_lets_the_workers_start() {
    let s = drain_spec(OnDrainTimeout::Skip, false, 0);
    let mut c = left_with(30, 1);
    c.control_plane = true;
    let d = decide(&input(&s, vec![c, staged(node("w"))]));
    assert_eq!(d.status.nodes.skipped, 1);
    assert_eq!(granted(&d), ["w"]);
}

#[test]
fn each_pass_carries_the_pod_selector_and_the_grace_period() {
    let mut s = drain_spec(OnDrainTimeout::Halt, false, 0);
    let n = left_with(90, 1);
    let options = drain_pass_options(&s, &n, t(100)).unwrap();
    assert!(options.keep.is_none() && options.grace_period_seconds.is_none());
    assert!(!options.force);

    s.drain.grace_period_seconds = Some(7);
    s.drain.pod_selector = Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("inplace.dev/skip".into(), "true".into())])),
        ..LabelSelector::default()
    });
    let options = drain_pass_options(&s, &n, t(100)).unwrap();
    assert_eq!(options.grace_period_seconds, Some(7));
    let keep = options.keep.unwrap();
    assert!(keep.matches(&BTreeMap::from([(
        "inplace.dev/skip".into(),
        "true".into()
    )])));
    assert!(!keep.matches(&BTreeMap::new()));

    // A selector the API server should have refused: an error naming the field.
    s.drain.pod_selector = Some(LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "k".into(),
            operator: "Near".into(),
            values: None,
        }]),
        ..LabelSelector::default()
    });
    let error = drain_pass_options(&s, &n, t(100)).unwrap_err();
    assert!(error.starts_with("spec.drain.podSelector"), "{error}");
}

#[test]
fn drain_grant_cordons_first_and_keeps_the_plan_staged() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.disruption = Disruption::Drain;
    let d = decide(&input(&s, vec![staged(node("a"))]));
    let actions = without_scale_down(&d);
    assert_eq!(actions.len(), 2, "{:?}", d.actions);
    let NodeAction::ApplyPlan { intent, .. } = actions[0] else {
        panic!()
    };
    assert!(intent.cordoned && intent.granted_at.is_some());
    assert_eq!(intent.desired_state, DesiredState::Staged);
    assert_eq!(*actions[1], NodeAction::Cordon { node: "a".into() });
    assert_eq!(d.status.nodes.updating, 1);
}

#[test]
fn drain_in_progress_waits_and_asks_to_be_looked_at_again() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.disruption = Disruption::Drain;
    let mut n = draining("a", 90);
    n.drain = Some(DrainProgress {
        remaining: 2,
        blocked: vec![
            "default/web-0: Cannot evict pod as it would violate the pod's disruption budget"
                .into(),
        ],
    });
    let d = decide(&input(&s, vec![n, staged(node("b"))]));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(d.requeue_after, Some(DRAIN_RETRY));
    assert!(has_event(&d, "EvictionBlocked"));
    assert_eq!(d.status.nodes.updating, 1);
}

#[test]
fn drained_node_is_activated() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.disruption = Disruption::Drain;
    let mut n = draining("a", 90);
    n.drain = Some(DrainProgress::default());
    let d = decide(&input(&s, vec![n]));
    let a = applies(&d);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].1.desired_state, DesiredState::Active);
    assert!(a[0].1.cordoned);
    assert!(has_event(&d, "Drained"));
}

#[test]
fn drain_timeout_fails_the_node_uncordons_it_and_counts_against_max_failures() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.disruption = Disruption::Drain;
    let mut n = draining("a", 30); // 70 s ago, timeout 60 s
    n.drain = Some(DrainProgress {
        remaining: 1,
        blocked: vec!["default/web-0: blocked by PodDisruptionBudget web".into()],
    });
    let d = decide(&input(&s, vec![n, staged(node("b"))]));
    assert_eq!(d.actions[0], NodeAction::Uncordon { node: "a".into() });
    let a = applies(&d);
    assert_eq!(a.len(), 1);
    let timed_out = a[0].1.drain_timeout.as_ref().unwrap();
    assert!(!timed_out.skipped, "onTimeout: Halt is the default");
    let message = &timed_out.message;
    assert!(message.contains("PodDisruptionBudget web"), "{message}");
    assert!(!a[0].1.cordoned);
    assert_eq!(d.status.failed_nodes[0].reason, "DrainTimeout");
    assert_eq!(condition(&d, "Halted").status, "True", "maxFailures 0");
    assert!(granted(&d).is_empty());
    assert!(has_event(&d, "DrainTimeout"));

    // With room for one failure, the slot goes to the next node.
    s.max_failures = 1;
    let mut n = draining("a", 30);
    n.drain = Some(DrainProgress {
        remaining: 1,
        blocked: vec![],
    });
    let d = decide(&input(&s, vec![n, staged(node("b"))]));
    assert_eq!(granted(&d), ["b"]);
}

#[test]
fn a_recorded_drain_timeout_stays_a_failure() {
    let mut s = spec(IntOrString::Int(1), 1);
    s.disruption = Disruption::Drain;
    let mut n = staged(node("a"));
    let p = n.plan.as_mut().unwrap();
    p.intent.granted_at = Some(t(0));
    p.intent.drain_timeout = Some(DrainTimedOut {
        message: "not drained".into(),
        skipped: false,
    });
    assert!(!needs_drain_pass(
        &s,
        &ReleaseState::Valid {
            revision: REV.into()
        },
        &n
    ));
    let d = decide(&input(&s, vec![n]));
    assert!(d.actions.is_empty());
    assert_eq!(d.status.nodes.failed, 1);
}

#[test]
fn drain_pass_only_for_cordoned_slot_holders_waiting_to_activate() {
    let mut s = spec(IntOrString::Int(1), 0);
    let valid = ReleaseState::Valid {
        revision: REV.into(),
    };
    let n = draining("a", 0);
    assert!(!needs_drain_pass(&s, &valid, &n), "disruption None");
    s.disruption = Disruption::Drain;
    assert!(needs_drain_pass(&s, &valid, &n));
    assert!(!needs_drain_pass(&s, &ReleaseState::Missing, &n));
    let mut uncordoned = n.clone();
    uncordoned.unschedulable = false;
    assert!(!needs_drain_pass(&s, &valid, &uncordoned));
    let mut active = n.clone();
    active.plan.as_mut().unwrap().intent.desired_state = DesiredState::Active;
    assert!(!needs_drain_pass(&s, &valid, &active));
    assert!(!needs_drain_pass(&s, &valid, &staged(node("b"))), "no slot");
    let mut theirs = n.clone();
    theirs.ownership = Ownership::Other { owner: "x".into() };
    assert!(!needs_drain_pass(&s, &valid, &theirs));
}
