//! The autoscaler's scale-down annotation (`autoscaler.rs`): set on a node while it holds a
//! slot, removed once it is final, and only when inplace set it.

use super::*;

fn scale_down_writes(d: &Decision) -> Vec<&NodeAction> {
    let others = without_scale_down(d);
    d.actions.iter().filter(|a| !others.contains(a)).collect()
}

fn disable(node: &str) -> NodeAction {
    NodeAction::DisableScaleDown { node: node.into() }
}

fn marked(mut n: NodeView, disabled: bool, ours: bool) -> NodeView {
    n.scale_down = ScaleDownMark { disabled, ours };
    n
}

#[test]
fn a_granted_node_gets_the_annotation_before_its_plan_turns_active() {
    let s = spec(IntOrString::Int(1), 0);
    let d = decide(&input(&s, vec![staged(node("a")), staged(node("b"))]));
    assert_eq!(granted(&d), ["a"]);
    assert_eq!(scale_down_writes(&d), [&disable("a")]);
    let mark = d.actions.iter().position(|a| *a == disable("a")).unwrap();
    let turns_active = |a: &NodeAction| {
        matches!(a, NodeAction::ApplyPlan { intent, .. }
            if intent.desired_state == DesiredState::Active)
    };
    let active = d.actions.iter().position(turns_active).unwrap();
    assert!(mark < active, "{:?}", d.actions);
}

#[test]
fn an_activating_node_keeps_it_and_a_final_one_loses_it() {
    let s = spec(IntOrString::Int(3), 1);
    let nodes = vec![
        marked(activating(node("a")), true, true),
        marked(succeeded(node("b")), true, true),
        marked(
            failed(node("c"), Phase::RolledBack, "RolledBack"),
            true,
            true,
        ),
        // Someone removed it mid-activation: set again.
        marked(activating(node("d")), false, true),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(
        scale_down_writes(&d),
        [
            &disable("d"),
            &NodeAction::RestoreScaleDown { node: "b".into() },
            &NodeAction::RestoreScaleDown { node: "c".into() },
        ]
    );
}

#[test]
fn someone_elses_annotation_is_left_alone_before_and_after() {
    let s = spec(IntOrString::Int(2), 0);
    let nodes = vec![
        marked(staged(node("a")), true, false),
        marked(activating(node("b")), true, false),
        marked(succeeded(node("c")), true, false),
    ];
    let d = decide(&input(&s, nodes));
    assert_eq!(granted(&d), ["a"]);
    assert!(scale_down_writes(&d).is_empty(), "{:?}", d.actions);
}

#[test]
fn the_mark_reads_the_node_annotations() {
    let of = |pairs: &[(&str, &str)]| {
        let a: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ScaleDownMark::of(Some(&a))
    };
    assert_eq!(ScaleDownMark::of(None), ScaleDownMark::default());
    assert_eq!(
        of(&[(SCALE_DOWN_DISABLED_ANNOTATION, "true")]),
        ScaleDownMark {
            disabled: true,
            ours: false
        }
    );
    assert!(!of(&[(SCALE_DOWN_DISABLED_ANNOTATION, "false")]).disabled);
    assert_eq!(
        of(&[
            (SCALE_DOWN_DISABLED_ANNOTATION, "true"),
            (SCALE_DOWN_MARK_ANNOTATION, "true")
        ]),
        ScaleDownMark {
            disabled: true,
            ours: true
        }
    );
}
