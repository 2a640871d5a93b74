//! `maxUnavailablePerTopology`: at most `max` slot holders per value of a node label.

use super::*;

fn spread_spec(max_unavailable: i32, per_zone: i32) -> NodeRolloutSpec {
    let mut s = spec(IntOrString::Int(max_unavailable), 0);
    s.max_unavailable_per_topology = Some(TopologySpread {
        key: "topology.kubernetes.io/zone".into(),
        max: per_zone,
    });
    s
}

fn in_zone(zone: &str, mut n: NodeView) -> NodeView {
    n.topology = zone.into();
    n
}

#[test]
fn grants_skip_a_node_whose_zone_is_full_and_take_the_next() {
    let s = spread_spec(2, 1);
    let nodes = vec![
        staged(in_zone("z1", node("a"))),
        staged(in_zone("z1", node("b"))),
        staged(in_zone("z2", node("c"))),
        staged(in_zone("z2", node("d"))),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["a", "c"], "one per zone, in name order");
}

#[test]
fn a_zone_with_an_activating_node_gets_no_second_slot() {
    let s = spread_spec(3, 1);
    let nodes = vec![
        activating(in_zone("z1", node("a"))),
        staged(in_zone("z1", node("b"))),
        staged(in_zone("z2", node("c"))),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["c"]);
}

#[test]
fn a_zone_may_hold_up_to_max() {
    let s = spread_spec(4, 2);
    let nodes = vec![
        activating(in_zone("z1", node("a"))),
        staged(in_zone("z1", node("b"))),
        staged(in_zone("z1", node("c"))),
        staged(in_zone("z2", node("d"))),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["b", "d"]);
}

#[test]
fn a_soaking_node_holds_its_zone() {
    let mut s = spread_spec(3, 1);
    s.min_ready_seconds = 30;
    let mut a = succeeded(in_zone("z1", node("a")));
    a.plan.as_mut().unwrap().intent.ready_since = Some(t(90));
    let previous = NodeRolloutStatus {
        active_nodes: vec!["a".into()],
        ..NodeRolloutStatus::default()
    };
    let nodes = vec![
        a,
        staged(in_zone("z1", node("b"))),
        staged(in_zone("z2", node("c"))),
    ];
    let mut i = input(&s, nodes);
    i.previous = Some(&previous);
    let d = decide(&i);
    assert_eq!(granted(&d), ["c"]);
}

#[test]
fn nodes_without_the_label_are_one_group() {
    let s = spread_spec(3, 1);
    let nodes = vec![
        staged(node("x")),
        staged(node("y")),
        staged(in_zone("z1", node("z"))),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["x", "z"]);
}

#[test]
fn a_finished_node_frees_its_zone() {
    let s = spread_spec(2, 1);
    let nodes = vec![
        succeeded(in_zone("z1", node("a"))),
        staged(in_zone("z1", node("b"))),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["b"]);
}

#[test]
fn a_node_passed_over_for_a_full_zone_is_named_in_the_status() {
    let s = spread_spec(3, 1);
    let nodes = vec![
        activating(in_zone("z1", node("a"))),
        staged(in_zone("z1", node("b"))),
        staged(in_zone("z1", node("c"))),
        staged(node("d")),
        staged(node("e")),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["d"]);
    let p = condition(&d, "Progressing");
    assert_eq!(
        (p.status.as_str(), p.reason.as_str()),
        ("True", "RollingOut")
    );
    assert!(
        p.message.contains(
            "waiting for room in topology.kubernetes.io/zone=z1 (maxUnavailablePerTopology.max 1): b, c"
        ),
        "{}",
        p.message
    );
    assert!(
        p.message.contains(
            "waiting for room in the group without topology.kubernetes.io/zone (maxUnavailablePerTopology.max 1): e"
        ),
        "{}",
        p.message
    );
}

#[test]
fn a_wait_for_maxunavailable_names_no_zone() {
    // Every slot is taken: the staged node waits for maxUnavailable, not for its zone.
    let s = spread_spec(1, 1);
    let nodes = vec![
        activating(in_zone("z1", node("a"))),
        staged(in_zone("z1", node("b"))),
    ];
    let d = decide(&input(&s, nodes));
    assert!(granted(&d).is_empty());
    let p = condition(&d, "Progressing");
    assert!(!p.message.contains("waiting for room"), "{}", p.message);
}
