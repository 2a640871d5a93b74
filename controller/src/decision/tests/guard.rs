//! What the decision's guard does before any phase: a missing or invalid release, an
//! invalid rollout, an empty selection.

use super::*;

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
