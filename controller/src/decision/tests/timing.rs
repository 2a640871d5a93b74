//! The rules that depend on the clock: maintenance windows, `minReadySeconds` and
//! `progressDeadline`. `now` is `t(100)`, Friday 2027-01-15 08:01:40 UTC.

use inplace_proto::reason::Reason;
use inplace_proto::{MaintenanceWindow, Weekday};

use super::*;

/// A rollout's `progressDeadline` must be longer than its `drainTimeout` (else it is
/// `InvalidRollout`); these rollouts do not drain, so any shorter timeout does.
fn shorter_than_every_deadline() -> Duration {
    Duration::from_secs(10)
}

fn utc_window(day: Weekday, start: &str, duration: &str) -> MaintenanceWindow {
    MaintenanceWindow {
        days: vec![day],
        start: start.into(),
        duration: Duration::parse(duration).unwrap(),
        time_zone: "UTC".into(),
    }
}

fn progressing(d: &Decision) -> &Condition {
    condition(d, rollout_condition::PROGRESSING)
}

fn grants_at(d: &Decision) -> usize {
    granted(d).len()
}

#[test]
fn outside_every_window_nothing_is_granted_but_staging_and_running_activations_go_on() {
    let mut s = spec(IntOrString::Int(3), 0);
    s.maintenance_windows = vec![utc_window(Weekday::Saturday, "08:00", "2h")];
    let d = decide(&input(
        &s,
        vec![activating(node("a")), staged(node("b")), node("c")],
    ));
    assert_eq!(grants_at(&d), 0, "no new activation outside the window");
    let staging: Vec<&str> = applies(&d).iter().map(|(n, _)| *n).collect();
    assert_eq!(staging, vec!["c"], "staging goes on");
    assert_eq!(d.status.active_nodes, vec!["a".to_owned()]);
    let p = progressing(&d);
    assert_eq!(p.status, "False");
    assert_eq!(p.reason, "OutsideMaintenanceWindow");
    assert!(
        p.message
            .contains("until 2027-01-16T08:00:00Z (Sat 2027-01-16 08:00 UTC)"),
        "{}",
        p.message
    );
    assert_eq!(
        d.status
            .next_window_opens_at
            .as_ref()
            .map(|t| t.0.to_string()),
        Some("2027-01-16T08:00:00Z".to_owned()),
        "the status says when the next window opens"
    );
    assert_eq!(
        d.requeue_after,
        Some(StdDuration::from_secs(86_400 - 100)),
        "looked at again when the window opens"
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.reason == "OutsideMaintenanceWindow" && e.kind == EventKind::Normal)
    );
}

#[test]
fn inside_a_window_slots_are_granted_and_the_rollout_is_looked_at_again_when_it_closes() {
    let mut s = spec(IntOrString::Int(2), 0);
    s.maintenance_windows = vec![
        utc_window(Weekday::Saturday, "08:00", "2h"),
        utc_window(Weekday::Friday, "08:00", "1h"),
    ];
    let d = decide(&input(&s, vec![staged(node("a")), staged(node("b"))]));
    assert_eq!(granted(&d), vec!["a", "b"]);
    assert_eq!(progressing(&d).reason, "RollingOut");
    assert_eq!(d.requeue_after, Some(StdDuration::from_secs(3_600 - 100)));
    assert_eq!(
        d.status.next_window_opens_at, None,
        "open: no next opening to report"
    );
}

#[test]
fn an_unknown_time_zone_grants_nothing_and_names_the_field() {
    let mut s = spec(IntOrString::Int(1), 0);
    let mut w = utc_window(Weekday::Friday, "08:00", "1h");
    w.time_zone = "Mars/Olympus_Mons".into();
    s.maintenance_windows = vec![w];
    let d = decide(&input(&s, vec![staged(node("a"))]));
    assert_eq!(grants_at(&d), 0);
    let p = progressing(&d);
    assert_eq!(p.reason, "InvalidMaintenanceWindow");
    assert!(
        p.message
            .starts_with("spec.maintenanceWindows[0].timeZone: unknown time zone"),
        "{}",
        p.message
    );
    assert!(
        d.events.iter().any(|e| e.kind == EventKind::Warning
            && e.reason == Reason::InvalidMaintenanceWindow.as_str())
    );
}

#[test]
fn pause_is_reported_before_a_closed_window() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.paused = true;
    s.maintenance_windows = vec![utc_window(Weekday::Saturday, "08:00", "2h")];
    let d = decide(&input(&s, vec![staged(node("a"))]));
    assert_eq!(progressing(&d).reason, "Paused");
}

/// (what, progressDeadline, the node's agent phase, state: failed?)
#[test]
fn a_node_past_its_progress_deadline_is_failed_and_its_slot_released() {
    let rows: Vec<(&str, Option<&str>, Phase, bool)> = vec![
        (
            "no deadline: today's behaviour",
            None,
            Phase::Activating,
            false,
        ),
        (
            "before the deadline",
            Some("101s"),
            Phase::Activating,
            false,
        ),
        ("at the deadline", Some("100s"), Phase::Activating, true),
        (
            "past it while verifying",
            Some("1m"),
            Phase::Verifying,
            true,
        ),
        (
            "past it but the agent reached the revision",
            Some("1m"),
            Phase::Succeeded,
            false,
        ),
    ];
    for (what, deadline, phase, fails) in rows {
        let mut s = spec(IntOrString::Int(1), 1);
        s.disruption = Disruption::Cordon;
        s.progress_deadline = deadline.map(|d| Duration::parse(d).unwrap());
        s.drain_timeout = shorter_than_every_deadline();
        let mut a = activating(node("a"));
        a.unschedulable = true;
        let plan = a.plan.as_mut().unwrap();
        plan.intent.cordoned = true;
        let current = (phase == Phase::Succeeded).then_some(REV).or(Some(OLD));
        plan.report = report(phase, REV, current);
        let d = decide(&input(&s, vec![a, staged(node("b"))]));
        let failed: Vec<(&str, &str)> = d
            .status
            .failed_nodes
            .iter()
            .map(|f| (f.node.as_str(), f.reason.as_str()))
            .collect();
        if fails {
            assert_eq!(failed, vec![("a", "ProgressDeadlineExceeded")], "{what}");
            assert_eq!(
                granted(&d),
                vec!["b"],
                "{what}: the slot goes to the next node"
            );
            assert!(
                !d.actions
                    .iter()
                    .any(|x| matches!(x, NodeAction::Uncordon { node } if node == "a")),
                "{what}: the node stays cordoned"
            );
            assert!(
                d.events
                    .iter()
                    .any(|e| e.reason == "ProgressDeadlineExceeded"
                        && e.node.as_deref() == Some("a")),
                "{what}"
            );
        } else {
            assert!(failed.is_empty(), "{what}: {failed:?}");
            let slot_free = phase == Phase::Succeeded;
            assert_eq!(grants_at(&d) == 1, slot_free, "{what}");
        }
        if what == "before the deadline" {
            assert_eq!(d.requeue_after, Some(StdDuration::from_secs(1)), "{what}");
        }
    }
}

#[test]
fn progress_deadline_failures_count_toward_max_failures() {
    let mut s = spec(IntOrString::Int(2), 0);
    s.progress_deadline = Some(Duration::from_secs(60));
    s.drain_timeout = shorter_than_every_deadline();
    let d = decide(&input(&s, vec![activating(node("a")), staged(node("b"))]));
    assert_eq!(grants_at(&d), 0);
    let halted = condition(&d, rollout_condition::HALTED);
    assert_eq!(
        (halted.status.as_str(), halted.reason.as_str()),
        ("True", "TooManyFailures")
    );
    assert!(halted.message.contains(
        "a (ProgressDeadlineExceeded: node a did not finish within progressDeadline 60s"
    ));
}

/// The deadline counts from the grant recorded on the plan, so a restarted controller (a
/// fresh decision over the same plans) reaches the same verdict.
#[test]
fn the_deadline_counts_from_the_grant_annotation() {
    let mut s = spec(IntOrString::Int(1), 1);
    s.progress_deadline = Some(Duration::from_secs(60));
    s.drain_timeout = shorter_than_every_deadline();
    let mut a = activating(node("a"));
    a.plan.as_mut().unwrap().intent.granted_at = Some(t(50));
    let d = decide(&input(&s, vec![a.clone(), staged(node("b"))]));
    assert!(d.status.failed_nodes.is_empty());
    assert_eq!(d.requeue_after, Some(StdDuration::from_secs(10)));
    let mut later = input(&s, vec![a, staged(node("b"))]);
    later.now = t(110);
    let d = decide(&later);
    assert_eq!(d.status.failed_nodes.len(), 1);
}

/// Node "a" succeeded after its grant (the last status showed it holding its slot), "b"
/// waits for one.
fn soaked_input(s: &NodeRolloutSpec, ready_since: Option<i64>) -> Decision {
    let mut a = succeeded(node("a"));
    a.plan.as_mut().unwrap().intent.ready_since = ready_since.map(t);
    let previous = NodeRolloutStatus {
        active_nodes: vec!["a".into()],
        ..NodeRolloutStatus::default()
    };
    let mut i = input(s, vec![a, staged(node("b"))]);
    i.previous = Some(&previous);
    decide(&i)
}

#[test]
fn a_succeeded_node_holds_its_slot_for_min_ready_seconds() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.min_ready_seconds = 30;

    // First seen succeeded now: the soak starts and is recorded on the plan.
    let d = soaked_input(&s, None);
    assert_eq!(grants_at(&d), 0);
    let a = applies(&d);
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].0, a[0].1.ready_since), ("a", Some(t(100))));
    assert_eq!(d.requeue_after, Some(StdDuration::from_secs(30)));
    assert!(
        progressing(&d)
            .message
            .ends_with("1 soaking for minReadySeconds 30"),
        "{}",
        progressing(&d).message
    );

    // Mid-soak (recorded at t(80)): still held, looked at again when it ends.
    let d = soaked_input(&s, Some(80));
    assert_eq!(grants_at(&d), 0);
    assert!(applies(&d).is_empty(), "nothing to write mid-soak");
    assert_eq!(d.requeue_after, Some(StdDuration::from_secs(10)));

    // Soaked (recorded at t(70)): the slot goes to the next node.
    let d = soaked_input(&s, Some(70));
    assert_eq!(granted(&d), vec!["b"]);
}

#[test]
fn without_min_ready_seconds_nothing_is_recorded_and_the_slot_is_free_at_once() {
    let s = spec(IntOrString::Int(1), 0);
    let d = soaked_input(&s, None);
    assert_eq!(granted(&d), vec!["b"]);
    assert!(applies(&d).iter().all(|(n, _)| *n == "b"));
}

#[test]
fn turning_min_ready_seconds_on_mid_rollout_soaks_no_node_that_finished_before() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.min_ready_seconds = 30;
    // "a" succeeded rounds ago: the last status no longer shows it holding a slot.
    let d = decide(&input(&s, vec![succeeded(node("a")), staged(node("b"))]));
    assert_eq!(granted(&d), vec!["b"]);
    assert!(
        applies(&d).iter().all(|(n, _)| *n == "b"),
        "nothing written to a"
    );
}

#[test]
fn a_node_that_ran_the_revision_without_a_grant_does_not_soak() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.min_ready_seconds = 30;
    let mut a = succeeded(node("a"));
    a.plan.as_mut().unwrap().intent.granted_at = None;
    let d = decide(&input(&s, vec![a, staged(node("b"))]));
    assert_eq!(granted(&d), vec!["b"]);
}

#[test]
fn a_soaking_control_plane_node_keeps_the_next_one_waiting() {
    let mut s = spec(IntOrString::Int(3), 0);
    s.min_ready_seconds = 30;
    let mut a = succeeded(cp("cp-a"));
    a.plan.as_mut().unwrap().intent.ready_since = Some(t(90));
    let d = decide(&input(&s, vec![a, staged(cp("cp-b")), staged(node("w"))]));
    assert_eq!(
        grants_at(&d),
        0,
        "control-plane nodes one at a time, soak included"
    );
}
