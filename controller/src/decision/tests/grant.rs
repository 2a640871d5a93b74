//! Grants: slots in activation order up to `maxUnavailable`, control-plane nodes first and
//! one at a time, pause, halting past `maxFailures`, completion, staging in waves, nodes that
//! join or leave.

use super::*;

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
