//! Others' disruption (`foreign.rs`): a selected node someone else cordoned, or one that is
//! not Ready, occupies an activation slot and a place in its topology group.

use super::*;

fn cordoned_by_a_person(mut n: NodeView) -> NodeView {
    n.unschedulable = true;
    n
}

fn not_ready(mut n: NodeView) -> NodeView {
    n.readiness = Readiness::NotReady {
        why: "Ready=Unknown".into(),
    };
    n
}

fn message(d: &Decision) -> &str {
    &condition(d, "Progressing").message
}

fn foreign(d: &Decision) -> Vec<(&str, &str)> {
    d.status
        .foreign_disruptions
        .iter()
        .map(|f| (f.node.as_str(), f.why.as_str()))
        .collect()
}

#[test]
fn a_node_a_person_cordoned_takes_the_only_slot_until_uncordoned() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = vec![
        cordoned_by_a_person(staged(node("worker-1"))),
        staged(node("worker-2")),
    ];
    let d = decide(&input(&s, nodes.clone()));
    assert!(granted(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(foreign(&d), [("worker-1", "cordoned")]);
    assert!(
        message(&d).contains("1 slot used by others: worker-1 cordoned"),
        "{}",
        message(&d)
    );

    let uncordoned: Vec<NodeView> = nodes
        .into_iter()
        .map(|mut n| {
            n.unschedulable = false;
            n
        })
        .collect();
    let d = decide(&input(&s, uncordoned));
    assert_eq!(granted(&d), ["worker-1"]);
    assert!(d.status.foreign_disruptions.is_empty());
}

#[test]
fn cordoned_and_not_ready_nodes_use_slots_and_the_status_names_them() {
    let s = spec(IntOrString::Int(3), 0);
    let nodes = vec![
        staged(node("worker-1")),
        staged(node("worker-2")),
        cordoned_by_a_person(succeeded(node("worker-4"))),
        not_ready(node("worker-9")),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["worker-1"], "3 slots, 2 used by others");
    assert_eq!(
        foreign(&d),
        [
            ("worker-4", "cordoned"),
            ("worker-9", "NotReady (Ready=Unknown)")
        ]
    );
    assert!(
        message(&d).contains(
            "2 slots used by others: worker-4 cordoned, worker-9 NotReady (Ready=Unknown)"
        ),
        "{}",
        message(&d)
    );
    let event = d.events.iter().find(|e| e.reason == "ActivationStarted");
    assert!(
        event.is_some_and(|e| e.note.contains("(3 of 3 in use)")),
        "{:?}",
        d.events
    );
}

#[test]
fn inplace_own_cordon_and_a_not_ready_node_it_activates_are_its_own_slots() {
    // worker-1 is draining under inplace's cordon (recorded on its plan); worker-2 is
    // activating and its kubelet restarts: neither is someone else's.
    let mut s = spec(IntOrString::Int(3), 0);
    s.disruption = Disruption::Drain;
    let nodes = vec![
        draining("worker-1", 50),
        not_ready(activating(node("worker-2"))),
        staged(node("worker-3")),
        staged(node("worker-4")),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["worker-3"]);
    assert!(d.status.foreign_disruptions.is_empty());
    assert!(!message(&d).contains("used by others"), "{}", message(&d));
}

#[test]
fn a_cordon_both_inplace_and_a_person_want_is_counted_once() {
    // Cordoned by inplace for an activation that succeeded, not yet uncordoned: the plan
    // still carries the record, so it is inplace's, not someone else's.
    let mut s = spec(IntOrString::Int(1), 0);
    s.disruption = Disruption::Cordon;
    let mut done = cordoned_by_a_person(succeeded(node("worker-1")));
    done.plan.as_mut().unwrap().intent.cordoned = true;
    let d = decide(&input(&s, vec![done, staged(node("worker-2"))]));
    assert!(d.status.foreign_disruptions.is_empty());
    assert_eq!(granted(&d), ["worker-2"]);
}

#[test]
fn a_failed_node_is_the_rollouts_own_trouble() {
    let s = spec(IntOrString::Int(1), 1);
    let nodes = vec![
        not_ready(failed(node("worker-1"), Phase::RolledBack, "RolledBack")),
        staged(node("worker-2")),
    ];
    let d = decide(&input(&s, nodes));
    assert!(d.status.foreign_disruptions.is_empty());
    assert_eq!(granted(&d), ["worker-2"]);
}

#[test]
fn a_node_others_took_down_fills_its_topology_group() {
    let mut s = spec(IntOrString::Int(3), 0);
    s.max_unavailable_per_topology = Some(TopologySpread {
        key: "topology.kubernetes.io/zone".into(),
        max: 1,
    });
    let zone = |z: &str, mut n: NodeView| {
        n.topology = z.into();
        n
    };
    let nodes = vec![
        zone("a", cordoned_by_a_person(succeeded(node("a-1")))),
        zone("a", staged(node("a-2"))),
        zone("b", staged(node("b-1"))),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["b-1"], "zone a has a node down already");
}

#[test]
fn a_control_plane_node_waits_while_others_have_a_node_down() {
    let s = spec(IntOrString::Int(3), 0);
    let nodes = vec![staged(cp("cp-1")), not_ready(staged(node("worker-1")))];
    let d = decide(&input(&s, nodes));
    assert!(granted(&d).is_empty(), "control-plane nodes go alone");
}

#[test]
fn not_counted_when_the_rollout_says_so() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.count_foreign_disruption = false;
    let nodes = vec![
        cordoned_by_a_person(succeeded(node("worker-1"))),
        staged(node("worker-2")),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["worker-2"]);
    assert!(d.status.foreign_disruptions.is_empty());
}

#[test]
fn counted_unless_the_spec_says_otherwise_and_the_message_names_five() {
    let s: NodeRolloutSpec = serde_json::from_value(serde_json::json!({"release": "r"})).unwrap();
    assert!(s.count_foreign_disruption, "the default");
    let back = serde_json::to_value(&s).unwrap();
    assert!(back.get("countForeignDisruption").is_none(), "{back}");

    let s = spec(IntOrString::Int(1), 0);
    let mut nodes: Vec<NodeView> = (1..=7)
        .map(|i| cordoned_by_a_person(succeeded(node(&format!("worker-{i}")))))
        .collect();
    nodes.push(staged(node("worker-8")));
    let d = decide(&input(&s, nodes));
    assert_eq!(d.status.foreign_disruptions.len(), 7);
    assert!(
        message(&d).contains(
            "7 slots used by others: worker-1 cordoned, worker-2 cordoned, worker-3 cordoned, \
             worker-4 cordoned, worker-5 cordoned, and 2 more"
        ),
        "{}",
        message(&d)
    );
}

/// A node Flatcar's update operator is rebooting (`fluo.rs`) takes the only slot, even
/// when the rollout does not count others' cordons and readiness.
#[test]
fn a_node_flatcars_update_operator_reboots_takes_the_only_slot() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.count_foreign_disruption = false;
    let mut rebooting = staged(node("worker-1"));
    rebooting.rebooted_by = Some(super::super::fluo::FLUO);
    let nodes = vec![rebooting, staged(node("worker-2"))];
    let d = decide(&input(&s, nodes.clone()));
    assert!(granted(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(
        foreign(&d),
        [("worker-1", "rebooting under Flatcar's update operator")]
    );
    let mut back = nodes;
    back[0].rebooted_by = None;
    assert_eq!(granted(&decide(&input(&s, back))), ["worker-1"]);
}

/// A node others took down waits until it is back, even with slots to spare: a node a
/// reboot tool (kured, FLUO, a FleetLock client) holds may be Ready and schedulable while
/// its reboot is being prepared.
#[test]
fn a_node_others_took_down_is_not_granted_while_it_is_down() {
    let mut s = spec(IntOrString::Int(3), 0);
    s.count_foreign_disruption = false;
    let mut rebooting = staged(node("worker-1"));
    rebooting.rebooted_by = Some(super::super::fluo::FLUO);
    let mut counted = spec(IntOrString::Int(3), 0);
    counted.count_foreign_disruption = true;
    let nodes = vec![rebooting, staged(node("worker-2"))];
    assert_eq!(granted(&decide(&input(&s, nodes))), ["worker-2"]);
    let nodes = vec![
        cordoned_by_a_person(staged(node("worker-1"))),
        staged(node("worker-2")),
    ];
    assert_eq!(granted(&decide(&input(&counted, nodes))), ["worker-2"]);
}
