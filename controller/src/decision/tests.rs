use super::*;
use std::collections::BTreeMap;

use inplace_proto::{Duration, TopologySpread};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::SignedDuration;
use proptest::prelude::*;

const REV: &str = "aaaaaaaaaaaa";
const OLD: &str = "bbbbbbbbbbbb";

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn spec(max_unavailable: IntOrString, max_failures: i32) -> NodeRolloutSpec {
    NodeRolloutSpec {
        release: "rel".into(),
        node_selector: Default::default(),
        max_unavailable,
        max_failures,
        disruption: Disruption::None,
        drain_timeout: Duration::from_secs(60),
        drain: Default::default(),
        paused: false,
        allow_downgrade: false,
        allow_version_skew: false,
        maintenance_windows: Vec::new(),
        min_ready_seconds: 0,
        progress_deadline: None,
        max_unavailable_per_topology: None,
        gates: Default::default(),
        count_foreign_disruption: true,
    }
}

pub(super) fn node(name: &str) -> NodeView {
    NodeView {
        name: name.into(),
        control_plane: false,
        topology: String::new(),
        unschedulable: false,
        readiness: Readiness::Ready,
        ownership: Ownership::Ours,
        plan: None,
        drain: None,
        steering: Steering::default(),
        scale_down: Default::default(),
        kubelet_version: None,
        version: 0,
    }
}

pub(super) fn cp(name: &str) -> NodeView {
    NodeView {
        control_plane: true,
        ..node(name)
    }
}

fn report(phase: Phase, target: &str, current: Option<&str>) -> PlanReport {
    PlanReport {
        phase: Some(phase),
        target_revision: Some(target.into()),
        current_revision: current.map(Into::into),
        ..PlanReport::default()
    }
}

fn plan(desired: DesiredState, report: PlanReport) -> PlanView {
    PlanView {
        revision: Some(REV.into()),
        desired_state: desired,
        granted_at: None,
        ready_since: None,
        cordoned: false,
        drain_timeout: None,
        allow_downgrade: false,
        retry_pending: false,
        report,
    }
}

/// Plan staged, waiting for a slot.
fn staged(mut n: NodeView) -> NodeView {
    n.plan = Some(plan(
        DesiredState::Staged,
        report(Phase::Staged, REV, Some(OLD)),
    ));
    n
}

/// Holding a slot, agent activating.
fn activating(mut n: NodeView) -> NodeView {
    let mut p = plan(
        DesiredState::Active,
        report(Phase::Activating, REV, Some(OLD)),
    );
    p.granted_at = Some(t(0));
    n.plan = Some(p);
    n
}

fn succeeded(mut n: NodeView) -> NodeView {
    let mut p = plan(
        DesiredState::Active,
        report(Phase::Succeeded, REV, Some(REV)),
    );
    p.granted_at = Some(t(0));
    n.plan = Some(p);
    n
}

fn failed(mut n: NodeView, phase: Phase, reason: &str) -> NodeView {
    let mut r = report(phase, REV, Some(OLD));
    r.reason = Some(reason.into());
    r.message = Some(format!("{reason} on {}", n.name));
    let mut p = plan(DesiredState::Active, r);
    p.granted_at = Some(t(0));
    n.plan = Some(p);
    n
}

fn input<'a>(spec: &'a NodeRolloutSpec, nodes: Vec<NodeView>) -> RolloutInput<'a> {
    RolloutInput {
        name: "ro",
        generation: Some(3),
        spec,
        previous: None,
        release: ReleaseState::Valid {
            revision: REV.into(),
        },
        nodes,
        order: NodeOrder::Any,
        alerts: AlertObservation::NotAsked,
        versions: KubernetesVersions::default(),
        kured: None,
        now: t(100),
    }
}

fn condition<'a>(d: &'a Decision, type_: &str) -> &'a Condition {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

/// The nodes granted a slot by `d`, decided at `t(100)` as the table tests are.
fn granted(d: &Decision) -> Vec<String> {
    granted_at(d, t(100))
}

/// The nodes granted a slot by `d`, decided at `now`: plans written with `grantedAt` = now.
/// A plan rewritten later keeps its grant time (a failed node uncordoned, say), so only the
/// decision's own `now` tells a new grant.
fn granted_at(d: &Decision, now: Timestamp) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            NodeAction::ApplyPlan { node, intent } if intent.granted_at == Some(now) => {
                Some(node.clone())
            }
            _ => None,
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn applies(d: &Decision) -> Vec<(&str, &PlanIntent)> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            NodeAction::ApplyPlan { node, intent } => Some((node.as_str(), intent)),
            _ => None,
        })
        .collect()
}

/// The round's writes but the autoscaler's annotation (`tests/autoscaler.rs`).
fn without_scale_down(d: &Decision) -> Vec<&NodeAction> {
    d.actions
        .iter()
        .filter(|a| {
            !matches!(
                a,
                NodeAction::DisableScaleDown { .. } | NodeAction::RestoreScaleDown { .. }
            )
        })
        .collect()
}

fn has_event(d: &Decision, reason: &str) -> bool {
    d.events.iter().any(|e| e.reason == reason)
}

#[test]
fn missing_release_touches_nothing() {
    let s = spec(IntOrString::Int(1), 0);
    let mut i = input(&s, vec![node("a"), staged(node("b"))]);
    i.release = ReleaseState::Missing;
    let d = decide(&i);
    assert!(d.actions.is_empty());
    let p = condition(&d, "Progressing");
    assert_eq!(
        (p.status.as_str(), p.reason.as_str()),
        ("False", "ReleaseNotFound")
    );
    assert!(p.message.contains("\"rel\""), "{}", p.message);
    assert_eq!(condition(&d, "Complete").status, "False");
    assert_eq!(condition(&d, "Halted").status, "False");
    assert_eq!(d.status.nodes.total, 2);
    assert_eq!(d.status.observed_generation, Some(3));
    assert!(has_event(&d, "ReleaseNotFound"));
}

#[test]
fn invalid_release_touches_nothing() {
    let s = spec(IntOrString::Int(1), 0);
    let mut i = input(&s, vec![node("a")]);
    i.release = ReleaseState::Invalid {
        message: "spec.artifacts[0].sha256: not hex".into(),
    };
    let d = decide(&i);
    assert!(d.actions.is_empty());
    let p = condition(&d, "Progressing");
    assert_eq!(
        (p.status.as_str(), p.reason.as_str()),
        ("False", "ReleaseInvalid")
    );
    assert!(p.message.contains("sha256"));
}

/// A rollout the CRD schema let through but `NodeRolloutSpec::validate` refuses (stored
/// before a CEL rule, or by a server without it): at 2befd6e the decision acted on it
/// (applied both plans, activating `a`).
#[test]
fn an_invalid_rollout_touches_nothing_and_names_every_field() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.drain.on_timeout = inplace_proto::OnDrainTimeout::Force;
    s.min_ready_seconds = -5;
    let d = decide(&input(&s, vec![staged(node("a")), node("b")]));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    let p = condition(&d, "Progressing");
    assert_eq!(
        (p.status.as_str(), p.reason.as_str()),
        ("False", "InvalidRollout")
    );
    assert!(
        p.message.contains("spec.drain.onTimeout") && p.message.contains("spec.minReadySeconds"),
        "{}",
        p.message
    );
    assert_eq!(condition(&d, "Complete").status, "False");
    assert_eq!(condition(&d, "Halted").status, "False");
    assert_eq!((d.status.nodes.total, d.status.nodes.pending), (2, 2));
    assert!(has_event(&d, "InvalidRollout"));
}

#[test]
fn empty_selection_is_complete_and_says_so() {
    let s = spec(IntOrString::Int(1), 0);
    let d = decide(&input(&s, vec![]));
    let c = condition(&d, "Complete");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NoNodesSelected")
    );
    assert!(c.message.contains("matches no node"));
    assert_eq!(d.status.nodes, NodeCounts::default());
    assert!(d.actions.is_empty());
}

#[test]
fn new_nodes_get_a_staged_plan_and_no_slot() {
    let s = spec(IntOrString::Int(3), 0);
    let d = decide(&input(&s, vec![node("b"), node("a")]));
    let a = applies(&d);
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].0, "a", "activation order: by name");
    for (_, intent) in a {
        assert_eq!(intent.desired_state, DesiredState::Staged);
        assert_eq!(&*intent.revision, REV);
        assert_eq!(intent.granted_at, None);
    }
    assert_eq!(d.status.nodes.pending, 2);
    let p = condition(&d, "Progressing");
    assert_eq!(
        (p.status.as_str(), p.reason.as_str()),
        ("True", "RollingOut")
    );
}

#[test]
fn staged_nodes_get_slots_in_name_order_up_to_max_unavailable() {
    let s = spec(IntOrString::Int(2), 0);
    let nodes = ["d", "b", "a", "c"].map(|n| staged(node(n))).to_vec();
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["a", "b"]);
    for (_, intent) in applies(&d) {
        assert_eq!(intent.desired_state, DesiredState::Active);
    }
    assert_eq!(d.status.nodes.updating, 2);
    assert_eq!(d.status.nodes.staged, 2);
    assert_eq!(d.status.active_nodes, ["a", "b"]);
    assert!(has_event(&d, "ActivationStarted"));
}

#[test]
fn holders_use_up_slots() {
    let s = spec(IntOrString::Int(2), 0);
    let nodes = vec![activating(node("z")), staged(node("a")), staged(node("b"))];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["a"]);
    // The holder's plan already says what it should: no write.
    assert!(applies(&d).iter().all(|(n, _)| *n != "z"));
}

#[test]
fn percent_slots_round_down_with_a_floor_of_one() {
    let nodes: Vec<NodeView> = (0..10).map(|i| staged(node(&format!("n{i:02}")))).collect();
    let s = spec(IntOrString::String("25%".into()), 0);
    assert_eq!(granted(&decide(&input(&s, nodes.clone()))).len(), 2);
    let s = spec(IntOrString::String("5%".into()), 0);
    assert_eq!(granted(&decide(&input(&s, nodes))).len(), 1);
}

#[test]
fn control_plane_first_one_at_a_time() {
    let s = spec(IntOrString::Int(5), 0);
    let nodes = vec![
        staged(node("a-worker")),
        staged(cp("cp-b")),
        staged(cp("cp-a")),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["cp-a"]);

    // While it activates, nothing else is granted.
    let nodes = vec![
        staged(node("a-worker")),
        staged(cp("cp-b")),
        activating(cp("cp-a")),
    ];
    assert!(granted(&decide(&input(&s, nodes))).is_empty());

    // Then the next control-plane node, alone.
    let nodes = vec![
        staged(node("a-worker")),
        staged(cp("cp-b")),
        succeeded(cp("cp-a")),
    ];
    assert_eq!(granted(&decide(&input(&s, nodes))), ["cp-b"]);

    // Then the workers, as many as slots allow.
    let nodes = vec![
        staged(node("a-worker")),
        staged(node("b-worker")),
        failed(cp("cp-b"), Phase::RolledBack, "HealthCheckFailed"),
        succeeded(cp("cp-a")),
    ];
    let s = spec(IntOrString::Int(5), 1);
    assert_eq!(
        granted(&decide(&input(&s, nodes))),
        ["a-worker", "b-worker"]
    );
}

#[test]
fn workers_wait_for_an_unstaged_control_plane_node() {
    let s = spec(IntOrString::Int(5), 0);
    let nodes = vec![staged(node("w1")), cp("cp-a")];
    let d = decide(&input(&s, nodes));
    assert!(granted(&d).is_empty());
}

#[test]
fn control_plane_waits_for_other_holders() {
    let s = spec(IntOrString::Int(5), 0);
    let mut busy = staged(node("w1"));
    busy.plan.as_mut().unwrap().report.phase = Some(Phase::Verifying);
    busy.plan.as_mut().unwrap().report.target_revision = Some(OLD.into());
    let d = decide(&input(&s, vec![busy, staged(cp("cp-a"))]));
    assert!(granted(&d).is_empty());
    assert_eq!(d.status.nodes.updating, 1);
}

#[test]
fn paused_grants_nothing_but_stages_and_lets_holders_finish() {
    let mut s = spec(IntOrString::Int(3), 0);
    s.paused = true;
    let nodes = vec![activating(node("a")), staged(node("b")), node("c")];
    let d = decide(&input(&s, nodes));
    assert!(granted(&d).is_empty());
    let a = applies(&d);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, "c");
    assert_eq!(a[0].1.desired_state, DesiredState::Staged);
    let p = condition(&d, "Progressing");
    assert_eq!((p.status.as_str(), p.reason.as_str()), ("False", "Paused"));
    assert!(has_event(&d, "Paused"));

    // Resume: the staged node is granted; the event says resumed.
    let previous = d.status.clone();
    s.paused = false;
    let nodes = vec![succeeded(node("a")), staged(node("b")), staged(node("c"))];
    let mut i = input(&s, nodes);
    i.previous = Some(&previous);
    let d = decide(&i);
    assert_eq!(granted(&d), ["b", "c"]);
    assert!(has_event(&d, "Resumed"));
    assert!(
        has_event(&d, "NodeUpdated"),
        "a was active and now runs the revision"
    );
}

#[test]
fn halts_past_max_failures_and_names_the_nodes() {
    let s = spec(IntOrString::Int(3), 1);
    let nodes = vec![
        failed(node("a"), Phase::RolledBack, "HealthCheckFailed"),
        staged(node("b")),
    ];
    // One failure is allowed.
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["b"]);
    assert_eq!(condition(&d, "Halted").status, "False");
    assert_eq!(d.status.failed_nodes.len(), 1);
    assert!(has_event(&d, "HealthCheckFailed"));

    let nodes = vec![
        failed(node("a"), Phase::RolledBack, "HealthCheckFailed"),
        failed(node("b"), Phase::Failed, "DownloadFailed"),
        activating(node("c")),
        staged(node("d")),
    ];
    let d = decide(&input(&s, nodes));
    assert!(granted(&d).is_empty());
    let h = condition(&d, "Halted");
    assert_eq!(
        (h.status.as_str(), h.reason.as_str()),
        ("True", "TooManyFailures")
    );
    assert!(h.message.contains("a (HealthCheckFailed"), "{}", h.message);
    assert!(h.message.contains("b (DownloadFailed"), "{}", h.message);
    assert_eq!(condition(&d, "Progressing").status, "False");
    assert_eq!(d.status.nodes.failed, 2);
    assert_eq!(d.status.nodes.updating, 1, "c keeps its slot and finishes");
    assert!(has_event(&d, "Halted"));
}

#[test]
fn max_failures_zero_halts_on_the_first_failure() {
    let s = spec(IntOrString::Int(3), 0);
    let nodes = vec![
        failed(node("a"), Phase::RolledBack, "UnitFailed"),
        staged(node("b")),
    ];
    let d = decide(&input(&s, nodes));
    assert!(granted(&d).is_empty());
    assert_eq!(condition(&d, "Halted").status, "True");
}

#[test]
fn complete_when_every_node_runs_the_revision() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = vec![succeeded(node("a")), succeeded(cp("b"))];
    let d = decide(&input(&s, nodes));
    assert!(d.actions.is_empty());
    let c = condition(&d, "Complete");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "AllNodesUpdated")
    );
    assert_eq!(condition(&d, "Progressing").status, "False");
    assert!(has_event(&d, "AllNodesUpdated"));
    assert_eq!(d.status.nodes.succeeded, 2);
}

#[test]
fn a_node_already_running_the_revision_needs_no_slot() {
    let s = spec(IntOrString::Int(1), 0);
    let mut n = node("a");
    n.plan = Some(plan(
        DesiredState::Staged,
        report(Phase::Succeeded, REV, Some(REV)),
    ));
    let d = decide(&input(&s, vec![n]));
    assert!(d.actions.is_empty());
    assert_eq!(condition(&d, "Complete").status, "True");
}

#[test]
fn all_final_with_tolerated_failures_is_not_complete_and_not_progressing() {
    let s = spec(IntOrString::Int(1), 1);
    let nodes = vec![
        succeeded(node("a")),
        failed(node("b"), Phase::RolledBack, "UnitFailed"),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(condition(&d, "Complete").status, "False");
    assert_eq!(condition(&d, "Progressing").status, "False");
    assert_eq!(condition(&d, "Halted").status, "False");
    assert!(
        condition(&d, "Progressing")
            .message
            .contains("nothing left")
    );
}

#[test]
fn a_node_that_joins_later_is_staged() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = vec![succeeded(node("a")), node("late")];
    let d = decide(&input(&s, nodes));
    let a = applies(&d);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, "late");
    assert_eq!(condition(&d, "Complete").status, "False");
    assert_eq!(d.status.nodes.total, 2);
}

#[test]
fn staging_goes_in_batches_and_grants_do_not_wait_for_it() {
    let s = spec(IntOrString::Int(10), 0);
    let mut nodes: Vec<NodeView> = (0..STAGING_BATCH + 7)
        .map(|i| node(&format!("new-{i:05}")))
        .collect();
    nodes.extend((0..3).map(|i| staged(node(&format!("old-{i}")))));
    let d = decide(&input(&s, nodes));
    let staging: Vec<&str> = applies(&d)
        .into_iter()
        .filter(|(_, intent)| intent.granted_at.is_none())
        .map(|(node, _)| node)
        .collect();
    assert_eq!(staging.len(), STAGING_BATCH);
    assert_eq!(staging[0], "new-00000", "staged in activation order");
    assert_eq!(granted(&d), ["old-0", "old-1", "old-2"]);
    assert_eq!(
        d.requeue_after,
        Some(STAGING_REQUEUE),
        "the rest next round"
    );
    assert_eq!(d.status.nodes.pending, count(STAGING_BATCH + 7));

    // Once the first batch is written, the next round stages the remainder.
    let mut nodes: Vec<NodeView> = (0..STAGING_BATCH + 7)
        .map(|i| node(&format!("new-{i:05}")))
        .collect();
    for n in &mut nodes[..STAGING_BATCH] {
        n.plan = Some(plan(DesiredState::Staged, PlanReport::default()));
    }
    let d = decide(&input(&s, nodes));
    assert_eq!(applies(&d).len(), 7);
    assert_eq!(d.requeue_after, None);
}

#[test]
fn a_rollout_with_many_slots_stages_a_wave_per_round() {
    assert_eq!(staging_batch(10), STAGING_BATCH);
    assert_eq!(staging_batch(3_000), 3_000);
    let s = spec(IntOrString::String("10%".into()), 0);
    let nodes: Vec<NodeView> = (0..6_000).map(|i| node(&format!("n-{i:05}"))).collect();
    let d = decide(&input(&s, nodes));
    assert_eq!(applies(&d).len(), 600, "10% of 6,000 nodes");
    assert_eq!(d.requeue_after, Some(STAGING_REQUEUE));
}

#[test]
fn a_deleted_node_drops_out_of_the_counts_and_frees_its_slot() {
    let s = spec(IntOrString::Int(1), 0);
    // "a" held the slot and was deleted: it is not in the input any more.
    let d = decide(&input(&s, vec![staged(node("b")), succeeded(node("c"))]));
    assert_eq!(d.status.nodes.total, 2);
    assert_eq!(granted(&d), ["b"]);
}

#[test]
fn a_node_owned_by_another_rollout_is_refused() {
    let s = spec(IntOrString::Int(3), 0);
    let mut other = staged(node("x"));
    other.ownership = Ownership::Other {
        owner: "rollout \"first\"".into(),
    };
    let d = decide(&input(&s, vec![other, staged(node("a"))]));
    assert_eq!(granted(&d), ["a"]);
    assert!(applies(&d).iter().all(|(n, _)| *n != "x"));
    let r = condition(&d, NODES_REFUSED_CONDITION);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("True", "NodeOwnedByOtherRollout")
    );
    assert!(
        r.message.contains("x (owned by rollout \"first\")"),
        "{}",
        r.message
    );
    assert_eq!(d.status.nodes.total, 1);
    assert!(has_event(&d, "NodeOwnedByOtherRollout"));
}

#[test]
fn ownership_resolution() {
    let existing: BTreeSet<String> = ["old", "new"].map(String::from).into();
    // The label wins while its rollout exists.
    assert_eq!(
        resolve_ownership("new", true, Some("old"), &existing, &["new", "old"]),
        Ownership::Other {
            owner: "rollout \"old\"".into()
        }
    );
    assert_eq!(
        resolve_ownership("old", true, Some("old"), &existing, &["new", "old"]),
        Ownership::Ours
    );
    // A label naming a deleted rollout: the oldest claimant takes over.
    assert_eq!(
        resolve_ownership("new", true, Some("gone"), &existing, &["new"]),
        Ownership::Ours
    );
    // No plan: the oldest claimant, so two rollouts never both write.
    assert_eq!(
        resolve_ownership("new", false, None, &existing, &["old", "new"]),
        Ownership::Other {
            owner: "rollout \"old\"".into()
        }
    );
    assert_eq!(
        resolve_ownership("old", false, None, &existing, &["old", "new"]),
        Ownership::Ours
    );
    // A plan a person wrote is left alone.
    assert!(matches!(
        resolve_ownership("old", true, None, &existing, &["old"]),
        Ownership::Other { .. }
    ));
}

#[test]
fn a_new_revision_restages_and_drops_the_old_grant() {
    let s = spec(IntOrString::Int(1), 0);
    let mut n = succeeded(node("a"));
    n.plan.as_mut().unwrap().revision = Some(OLD.into());
    n.plan.as_mut().unwrap().report = report(Phase::Succeeded, OLD, Some(OLD));
    let d = decide(&input(&s, vec![n]));
    let a = applies(&d);
    assert_eq!(a.len(), 1);
    assert_eq!(
        a[0].1,
        &PlanIntent {
            revision: REV.into(),
            desired_state: DesiredState::Staged,
            granted_at: None,
            ready_since: None,
            cordoned: false,
            drain_timeout: None,
            allow_downgrade: false,
        }
    );
}

#[test]
fn a_node_busy_with_an_old_revision_holds_a_slot() {
    let s = spec(IntOrString::Int(1), 0);
    let mut busy = node("a");
    let mut p = plan(
        DesiredState::Staged,
        report(Phase::RollingBack, OLD, Some(OLD)),
    );
    p.revision = Some(REV.into());
    busy.plan = Some(p);
    let d = decide(&input(&s, vec![busy, staged(node("b"))]));
    assert!(granted(&d).is_empty());
    assert_eq!(d.status.nodes.updating, 1);
}

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
    ours.plan.as_mut().unwrap().cordoned = true;
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
    n.plan.as_mut().unwrap().cordoned = true;
    let d = decide(&input(&s, vec![n]));
    assert!(d.actions.is_empty(), "{:?}", d.actions);

    let mut n = failed(node("a"), Phase::RolledBack, "HealthCheckFailed");
    n.unschedulable = true;
    n.plan.as_mut().unwrap().cordoned = true;
    let d = decide(&input(&s, vec![n]));
    assert_eq!(d.actions[0], NodeAction::Uncordon { node: "a".into() });
}

fn draining(name: &str, granted_at: i64) -> NodeView {
    let mut n = staged(node(name));
    n.unschedulable = true;
    // Marked with its grant (`autoscaler.rs`).
    n.scale_down = ScaleDownMark {
        disabled: true,
        ours: true,
    };
    let p = n.plan.as_mut().unwrap();
    p.granted_at = Some(t(granted_at));
    p.cordoned = true;
    n
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
    p.granted_at = Some(t(0));
    p.drain_timeout = Some(DrainTimedOut {
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
    active.plan.as_mut().unwrap().desired_state = DesiredState::Active;
    assert!(!needs_drain_pass(&s, &valid, &active));
    assert!(!needs_drain_pass(&s, &valid, &staged(node("b"))), "no slot");
    let mut theirs = n.clone();
    theirs.ownership = Ownership::Other { owner: "x".into() };
    assert!(!needs_drain_pass(&s, &valid, &theirs));
}

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
    p.granted_at = Some(t(0));
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

/// What a write does to the simulated node.
fn carry_out(v: &mut NodeView, action: &NodeAction) {
    match action {
        NodeAction::ApplyPlan { intent, .. } => {
            let p = v.plan.get_or_insert_with(PlanView::default);
            p.revision = Some(std::sync::Arc::clone(&intent.revision));
            p.desired_state = intent.desired_state;
            p.granted_at = intent.granted_at;
            p.ready_since = intent.ready_since;
            p.cordoned = intent.cordoned;
            p.drain_timeout = intent.drain_timeout.clone();
        }
        NodeAction::Cordon { .. } => v.unschedulable = true,
        NodeAction::Uncordon { .. } => v.unschedulable = false,
        NodeAction::DisableScaleDown { .. } => {
            v.scale_down = ScaleDownMark {
                disabled: true,
                ours: true,
            }
        }
        NodeAction::RestoreScaleDown { .. } => v.scale_down = ScaleDownMark::default(),
    }
}

// A whole rollout, simulated: agents follow the status protocol, the decision runs after
// every step, and the invariants are checked at every step.

#[derive(Clone, Debug)]
struct SimNode {
    view: NodeView,
    /// Steps left in the current agent phase.
    timer: u32,
    fails: bool,
    /// The agent never gets past `Activating` (a node that died mid-swap).
    stalls: bool,
}

/// How a simulated rollout disrupts and times its nodes (a round is one second).
#[derive(Clone, Debug, Default)]
struct SimPolicy {
    disruption: Disruption,
    min_ready_seconds: i32,
    /// `progressDeadline` in seconds.
    deadline: Option<u64>,
    /// Nodes whose agent stalls (a stalled node needs a deadline to free its slot).
    stalled: BTreeSet<usize>,
    /// `maxUnavailablePerTopology`: node `i` is in zone `i % (zones + 1)`, the last of
    /// which is unlabeled; at most `max` holders per zone.
    spread: Option<(usize, i32)>,
}

impl SimPolicy {
    fn disrupting(disruption: Disruption) -> SimPolicy {
        SimPolicy {
            disruption,
            ..SimPolicy::default()
        }
    }

    /// Whether `plan` holds a slot at `now` by the timing rules: granted and not past its
    /// deadline while not final, or soaking after success.
    fn holds_slot(&self, plan: &PlanView, now: Timestamp) -> bool {
        let Some(granted) = plan.granted_at else {
            return false;
        };
        let within = |secs: u64, since: Timestamp| {
            now < since
                .checked_add(SignedDuration::from_secs(i64::try_from(secs).unwrap()))
                .unwrap()
        };
        if plan.report.phase == Some(Phase::Succeeded) {
            let soak = u64::try_from(self.min_ready_seconds).unwrap();
            return plan.ready_since.is_some_and(|since| within(soak, since));
        }
        plan.desired_state == DesiredState::Active
            && !plan.report.phase.is_some_and(Phase::is_final)
            && self.deadline.is_none_or(|d| within(d, granted))
    }
}

fn simulate(
    n_workers: usize,
    n_cp: usize,
    max_unavailable: IntOrString,
    max_failures: i32,
    failing: &BTreeSet<usize>,
    policy: &SimPolicy,
    step_time: u32,
) -> NodeCounts {
    let mut s = spec(max_unavailable.clone(), max_failures);
    s.disruption = policy.disruption;
    s.min_ready_seconds = policy.min_ready_seconds;
    s.progress_deadline = policy.deadline.map(Duration::from_secs);
    if policy.deadline.is_some() {
        // Shorter than every deadline simulated (20 s and more), as a valid rollout's is.
        s.drain_timeout = Duration::from_secs(10);
    }
    s.max_unavailable_per_topology = policy.spread.map(|(_, max)| TopologySpread {
        key: "zone".into(),
        max,
    });
    let zone_of = |i: usize| match policy.spread {
        Some((zones, _)) if i % (zones + 1) < zones => format!("z{}", i % (zones + 1)),
        _ => String::new(),
    };
    let mut nodes: Vec<SimNode> = (0..n_workers + n_cp)
        .map(|i| SimNode {
            view: NodeView {
                topology: zone_of(i),
                ..if i < n_cp {
                    cp(&format!("cp{i:03}"))
                } else {
                    node(&format!("w{i:03}"))
                }
            },
            timer: 0,
            fails: failing.contains(&i),
            stalls: policy.stalled.contains(&i),
        })
        .collect();
    let total = nodes.len();
    let slots = activation_slots(&max_unavailable, total);
    let mut previous: Option<NodeRolloutStatus> = None;
    let mut cp_done_before_worker_start = true;
    let mut memo = DecisionMemo::default();
    let mut numbered = memo::Numbered::default();
    for round in 0..10_000i64 {
        // Agents move one step.
        for n in &mut nodes {
            let Some(plan) = n.view.plan.as_mut() else {
                continue;
            };
            if n.timer > 0 {
                n.timer -= 1;
                continue;
            }
            let r = &mut plan.report;
            if n.stalls && r.phase == Some(Phase::Activating) {
                continue;
            }
            let next = match (r.phase, plan.desired_state) {
                (None, _) => Some(Phase::Downloading),
                (Some(Phase::Downloading), _) => Some(Phase::Staged),
                (Some(Phase::Staged), DesiredState::Active) => Some(Phase::Activating),
                (Some(Phase::Activating), _) => Some(Phase::Verifying),
                (Some(Phase::Verifying), _) if n.fails => Some(Phase::RolledBack),
                (Some(Phase::Verifying), _) => Some(Phase::Succeeded),
                _ => None,
            };
            if let Some(phase) = next {
                r.phase = Some(phase);
                r.target_revision = plan.revision.clone();
                if phase == Phase::Succeeded {
                    r.current_revision = plan.revision.clone();
                }
                if phase == Phase::RolledBack {
                    r.reason = Some("HealthCheckFailed".into());
                }
                n.timer = step_time;
            }
        }
        // Drain passes finish at once (no pods).
        let release = ReleaseState::Valid {
            revision: REV.into(),
        };
        for n in &mut nodes {
            n.view.drain = needs_drain_pass(&s, &release, &n.view).then(DrainProgress::default);
        }
        let views: Vec<NodeView> = nodes.iter().map(|n| n.view.clone()).collect();
        let mut i = input(&s, numbered.number(&views));
        i.now = t(round);
        i.previous = previous.as_ref();
        let d = decide(&i);
        // The memo changes nothing: every round's decision is the one found from scratch.
        assert_eq!(
            decide_with_memo(&i, &mut memo),
            d,
            "round {round}: the decision with the last rounds' memo differs"
        );
        for action in &d.actions {
            let name = action.node();
            let n = nodes.iter_mut().find(|n| n.view.name == name).unwrap();
            carry_out(&mut n.view, action);
        }
        // Invariants after the round's writes: the slot holders (activating within their
        // deadline, or soaking) never outnumber the slots.
        let holders: Vec<&SimNode> = nodes
            .iter()
            .filter(|n| {
                n.view
                    .plan
                    .as_ref()
                    .is_some_and(|p| policy.holds_slot(p, t(round)))
            })
            .collect();
        assert!(
            holders.len() <= slots,
            "round {round}: {} > {slots}",
            holders.len()
        );
        if let Some((_, max)) = policy.spread {
            let mut per_zone = BTreeMap::<&str, i32>::new();
            for n in &holders {
                *per_zone.entry(n.view.topology.as_str()).or_default() += 1;
            }
            assert!(
                per_zone.values().all(|&held| held <= max),
                "round {round}: holders per zone {per_zone:?} past {max}"
            );
        }
        let activating: Vec<&&SimNode> = holders
            .iter()
            .filter(|n| {
                n.view
                    .plan
                    .as_ref()
                    .is_some_and(|p| p.report.phase != Some(Phase::Succeeded))
            })
            .collect();
        let cp_active = activating.iter().filter(|n| n.view.control_plane).count();
        assert!(cp_active <= 1);
        if cp_active == 1 {
            assert_eq!(activating.len(), 1, "a control-plane node activates alone");
        }
        let workers_started = nodes.iter().any(|n| {
            !n.view.control_plane && n.view.plan.as_ref().is_some_and(|p| p.granted_at.is_some())
        });
        let past_deadline = failed_past_deadline(Some(&d.status));
        let cp_unfinished = nodes.iter().any(|n| {
            n.view.control_plane
                && !past_deadline.contains(n.view.name.as_str())
                && !n
                    .view
                    .plan
                    .as_ref()
                    .is_some_and(|p| p.report.phase.is_some_and(Phase::is_final))
        });
        if workers_started && cp_unfinished {
            cp_done_before_worker_start = false;
        }
        let failed = d.status.nodes.failed;
        if failed > max_failures {
            assert!(granted_at(&d, t(round)).is_empty(), "no grants once halted");
        }
        let c = d.status.nodes.clone();
        assert_eq!(
            c.pending + c.staged + c.updating + c.succeeded + c.failed,
            c.total
        );
        let done = condition(&d, "Complete").status == "True"
            || condition(&d, "Halted").status == "True" && c.updating == 0
            || c.succeeded + c.failed == c.total && c.total > 0;
        previous = Some(d.status);
        if done {
            assert!(cp_done_before_worker_start);
            if (failing.len() + policy.stalled.len()) as i32 <= max_failures {
                assert_eq!(c.succeeded + c.failed, c.total, "all nodes final");
            }
            let past_deadline: BTreeSet<&str> = failed_past_deadline(previous.as_ref());
            for n in &nodes {
                assert!(
                    !n.view.unschedulable || past_deadline.contains(n.view.name.as_str()),
                    "{} left cordoned",
                    n.view.name
                );
                assert!(
                    !n.view.scale_down.ours,
                    "{} left with scale-down disabled",
                    n.view.name
                );
            }
            return c;
        }
    }
    panic!("rollout did not finish");
}

/// The nodes a status reports failed past their progress deadline (they stay cordoned).
fn failed_past_deadline(status: Option<&NodeRolloutStatus>) -> BTreeSet<&str> {
    status
        .map(|s| {
            s.failed_nodes
                .iter()
                .filter(|f| f.reason == "ProgressDeadlineExceeded")
                .map(|f| f.node.as_str())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn simulated_rollout_without_failures_completes() {
    let counts = simulate(
        12,
        3,
        IntOrString::Int(4),
        0,
        &BTreeSet::new(),
        &SimPolicy::disrupting(Disruption::Drain),
        1,
    );
    assert_eq!(counts.succeeded, 15);
    let failing = BTreeSet::from([5, 9]);
    let counts = simulate(
        12,
        3,
        IntOrString::Int(2),
        1,
        &failing,
        &SimPolicy::disrupting(Disruption::Cordon),
        0,
    );
    assert_eq!(counts.failed, 2);
    assert!(counts.succeeded < 13, "halted before every node was tried");
}

// How the decision reads an agent's report: proto's `Outcome` (see proto/src/outcome.rs
// for every edge case). These are the cases the decision's own reading got wrong.

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
    p.cordoned = true;
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
    p.granted_at = None;
    p.desired_state = DesiredState::Staged;
    p.report.observed_generation = Some(2);
    p.report.plan_generation = Some(3);
    let d = decide(&input(&s, vec![n]));
    assert_eq!(d.status.nodes.failed, 0, "{:?}", d.status.nodes);
    assert_eq!(d.status.nodes.pending, 1);
    assert_eq!(condition(&d, "Halted").status, "False");
}

#[test]
fn a_failed_node_uncordoned_after_its_grant_is_no_grant_once_halted() {
    // w021 is granted at t(100) and rolls back; at round 104 the rollout is halted and
    // uncordons it, rewriting its plan with its grant time kept. The simulation read that
    // as a new grant (its check compared with the table tests' t(100), not the round's
    // time): proptest found this case and failed at b0a9543.
    let policy = SimPolicy {
        min_ready_seconds: 5,
        ..SimPolicy::disrupting(Disruption::Drain)
    };
    let failing = BTreeSet::from([2, 21]);
    let counts = simulate(20, 2, IntOrString::Int(2), 1, &failing, &policy, 0);
    assert_eq!(counts.failed, 2);
}

#[test]
fn a_simulated_stalled_node_fails_at_its_deadline_and_the_rest_soak_and_finish() {
    let policy = SimPolicy {
        disruption: Disruption::Cordon,
        min_ready_seconds: 3,
        deadline: Some(25),
        stalled: BTreeSet::from([4]),
        spread: None,
    };
    let counts = simulate(8, 1, IntOrString::Int(2), 1, &BTreeSet::new(), &policy, 1);
    assert_eq!((counts.succeeded, counts.failed), (8, 1));
}

#[test]
fn a_simulated_rollout_over_two_zones_and_unlabeled_nodes_completes_one_per_zone() {
    let policy = SimPolicy {
        min_ready_seconds: 2,
        spread: Some((2, 1)),
        ..SimPolicy::default()
    };
    let counts = simulate(9, 0, IntOrString::Int(3), 0, &BTreeSet::new(), &policy, 1);
    assert_eq!(counts.succeeded, 9);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]
    #[test]
    fn simulated_rollouts_keep_every_invariant(
        workers in 0usize..25,
        cps in 0usize..4,
        max_unavailable in prop_oneof![
            (1i32..6).prop_map(IntOrString::Int),
            (1u32..101).prop_map(|p| IntOrString::String(format!("{p}%"))),
        ],
        max_failures in 0i32..4,
        failing in proptest::collection::btree_set(0usize..30, 0..5),
        disruption in prop_oneof![Just(Disruption::None), Just(Disruption::Cordon), Just(Disruption::Drain)],
        step_time in 0u32..3,
        min_ready_seconds in prop_oneof![Just(0i32), 1i32..6],
        // Longer than any healthy activation here (about 3 × (step_time + 1) rounds), so
        // only stalled nodes pass it.
        deadline in proptest::option::of(20u64..40),
        stalled in proptest::collection::btree_set(0usize..30, 0..3),
        spread in proptest::option::of((1usize..4, 1i32..3)),
    ) {
        let policy = SimPolicy {
            disruption,
            min_ready_seconds,
            deadline,
            // A stalled node without a deadline holds its slot for ever, as it should.
            stalled: if deadline.is_some() { stalled } else { BTreeSet::new() },
            spread,
        };
        let counts = simulate(workers, cps, max_unavailable, max_failures, &failing, &policy, step_time);
        prop_assert_eq!(counts.total as usize, workers + cps);
    }
}

mod autoscaler;
mod drain;
mod foreign;
mod health;
mod kured;
mod memo;
mod steering;
mod timing;
mod topology;
mod version_skew;
