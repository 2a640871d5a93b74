//! Whose node it is and which revision it is busy with: another rollout's nodes, a new
//! revision that restages.

use super::*;

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
    n.plan.as_mut().unwrap().intent.revision = OLD.into();
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
    p.intent.revision = REV.into();
    busy.plan = Some(p);
    let d = decide(&input(&s, vec![busy, staged(node("b"))]));
    assert!(granted(&d).is_empty());
    assert_eq!(d.status.nodes.updating, 1);
}
