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
    p.granted_at = Some(t(0));
    p.drain_timeout = Some(DrainTimedOut {
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
    a.plan.as_mut().unwrap().drain_timeout = Some(DrainTimedOut {
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
