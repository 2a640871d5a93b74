//! The revision hash is a function of the content, not of how it was written; and no input
//! makes parsing or validation panic.

use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan, Unusable, revision_of};
use inplace_strict_yaml::object_from_yaml;
use proptest::prelude::*;

const RELEASE_A: &str = r#"
apiVersion: inplace.dev/v1alpha1
kind: NodeRelease
metadata: {name: r}
spec:
  version: v1
  artifacts:
  - {name: kubernetes, type: Sysext, url: "https://x.example/k.raw", sha256: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}
  healthChecks: {window: 10s, timeout: 1m, units: [kubelet.service]}
"#;

// The same content with every map written in another order, and another version label.
const RELEASE_B: &str = r#"
kind: NodeRelease
apiVersion: inplace.dev/v1alpha1
metadata: {name: other-name}
spec:
  healthChecks: {units: [kubelet.service], timeout: 1m, window: 10s}
  artifacts:
  - {sha256: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", url: "https://x.example/k.raw", type: Sysext, name: kubernetes}
  version: v1-relabelled
"#;

#[test]
fn revision_ignores_field_order_names_and_labels() {
    let a: NodeRelease = object_from_yaml(RELEASE_A).unwrap();
    let b: NodeRelease = object_from_yaml(RELEASE_B).unwrap();
    assert_eq!(revision_of(&a.spec.content), revision_of(&b.spec.content));
    assert_eq!(revision_of(&a.spec.content).len(), 12);
}

#[test]
fn revision_changes_with_the_content() {
    let a: NodeRelease = object_from_yaml(RELEASE_A).unwrap();
    let mut changed = a.clone();
    changed.spec.content.artifacts[0].sha256 = "b".repeat(64);
    assert_ne!(
        revision_of(&a.spec.content),
        revision_of(&changed.spec.content)
    );
    let mut changed = a.clone();
    changed.spec.content.health_checks.window = "11s".parse().unwrap();
    assert_ne!(
        revision_of(&a.spec.content),
        revision_of(&changed.spec.content)
    );
}

/// `nodeReady` came after releases were written: leaving it out and setting it false is the
/// same revision (no node updates again because the field appeared), setting it is another.
#[test]
fn node_ready_false_keeps_the_revision_of_a_release_without_it() {
    let a: NodeRelease = object_from_yaml(RELEASE_A).unwrap();
    let explicit: NodeRelease = object_from_yaml(&RELEASE_A.replace(
        "units: [kubelet.service]}",
        "units: [kubelet.service], nodeReady: false}",
    ))
    .unwrap();
    assert!(!explicit.spec.content.health_checks.node_ready);
    assert_eq!(
        revision_of(&a.spec.content),
        revision_of(&explicit.spec.content)
    );
    let ready: NodeRelease = object_from_yaml(&RELEASE_A.replace(
        "units: [kubelet.service]}",
        "units: [kubelet.service], nodeReady: true}",
    ))
    .unwrap();
    assert!(ready.spec.content.health_checks.node_ready);
    assert_ne!(
        revision_of(&a.spec.content),
        revision_of(&ready.spec.content)
    );
}

/// One judgement of a usable release for the rollouts and the Cluster API extension: it
/// validates, and this generation is not marked `Valid=False`.
#[test]
fn a_release_is_usable_unless_invalid_or_marked_invalid_for_its_generation() {
    let mut release: NodeRelease = object_from_yaml(RELEASE_A).unwrap();
    release.metadata.generation = Some(2);
    assert_eq!(release.usable(), Ok(revision_of(&release.spec.content)));

    let mark = |generation: Option<i64>, status: &str| {
        serde_json::from_value(serde_json::json!({"conditions": [{"type": "Valid",
            "status": status, "reason": "InvalidRelease", "message": "sha256 is not hex",
            "lastTransitionTime": "2026-11-28T00:00:00Z", "observedGeneration": generation}]}))
        .unwrap()
    };
    release.status = Some(mark(Some(2), "False"));
    assert_eq!(
        release.usable(),
        Err(Unusable::MarkedInvalid("sha256 is not hex".into()))
    );
    release.status = Some(mark(None, "False"));
    assert!(
        release.usable().is_err(),
        "a mark without a generation counts"
    );
    release.status = Some(mark(Some(1), "False"));
    assert!(
        release.usable().is_ok(),
        "a mark on an earlier generation does not"
    );
    release.status = Some(mark(Some(2), "True"));
    assert!(release.usable().is_ok());

    release.spec.version = " ".into();
    match release.usable() {
        Err(Unusable::Invalid(problems)) => assert!(problems.has("spec.version"), "{problems}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn releases_and_rollouts_validate() {
    let release: NodeRelease = object_from_yaml(RELEASE_A).unwrap();
    release.validate().unwrap();

    let rollout = |extra: &str| {
        object_from_yaml::<NodeRollout>(&format!(
            "apiVersion: inplace.dev/v1alpha1\nkind: NodeRollout\nmetadata: {{name: r}}\nspec:\n  release: kubernetes-v1\n{extra}"
        ))
        .unwrap()
    };
    rollout("").validate().unwrap();
    rollout("  maxUnavailable: 25%\n").validate().unwrap();
    let problems = rollout("  maxUnavailable: 0\n").validate().unwrap_err();
    assert!(problems.has("spec.maxUnavailable"), "{problems}");
    let problems = rollout("  maxUnavailable: 150%\n").validate().unwrap_err();
    assert!(problems.has("spec.maxUnavailable"), "{problems}");
    let problems = rollout("  maxFailures: -1\n").validate().unwrap_err();
    assert!(problems.has("spec.maxFailures"), "{problems}");
    let problems =
        rollout("  nodeSelector: {matchExpressions: [{key: role, operator: Near, values: [a]}]}\n")
            .validate()
            .unwrap_err();
    assert!(
        problems.has("spec.nodeSelector.matchExpressions[0].operator"),
        "{problems}"
    );
    let window = |start: &str, duration: &str, days: &str| {
        format!(
            "  maintenanceWindows: [{{days: {days}, start: \"{start}\", duration: {duration}, timeZone: Europe/Berlin}}]\n"
        )
    };
    rollout(&window("02:30", "4h", "[Sunday]"))
        .validate()
        .unwrap();
    for (extra, field) in [
        (
            window("24:00", "4h", "[Sunday]"),
            "spec.maintenanceWindows[0].start",
        ),
        (
            window("2:30", "4h", "[Sunday]"),
            "spec.maintenanceWindows[0].start",
        ),
        (
            window("02:30", "30s", "[Sunday]"),
            "spec.maintenanceWindows[0].duration",
        ),
        (
            window("02:30", "169h", "[Sunday]"),
            "spec.maintenanceWindows[0].duration",
        ),
        (
            window("02:30", "4h", "[]"),
            "spec.maintenanceWindows[0].days",
        ),
        ("  minReadySeconds: -1\n".to_owned(), "spec.minReadySeconds"),
        (
            "  progressDeadline: 10m\n".to_owned(),
            "spec.progressDeadline",
        ),
    ] {
        let problems = rollout(&extra).validate().unwrap_err();
        assert!(problems.has(field), "{extra}: {problems}");
    }
    rollout("  minReadySeconds: 60\n  drainTimeout: 1m\n  progressDeadline: 30m\n")
        .validate()
        .unwrap();
    let spread = |key: &str, max: i32| {
        format!("  maxUnavailablePerTopology: {{key: \"{key}\", max: {max}}}\n")
    };
    rollout(&spread("topology.kubernetes.io/zone", 1))
        .validate()
        .unwrap();
    rollout(&spread("rack", 3)).validate().unwrap();
    for (key, max, field) in [
        ("", 1, "spec.maxUnavailablePerTopology.key"),
        ("-zone", 1, "spec.maxUnavailablePerTopology.key"),
        ("Bad_Prefix/zone", 1, "spec.maxUnavailablePerTopology.key"),
        (
            "topology.kubernetes.io/zone",
            0,
            "spec.maxUnavailablePerTopology.max",
        ),
    ] {
        let problems = rollout(&spread(key, max)).validate().unwrap_err();
        assert!(problems.has(field), "{key} {max}: {problems}");
    }
    let mut bad_release = rollout("");
    bad_release.spec.release = "Not_A_Name".into();
    assert!(bad_release.validate().unwrap_err().has("spec.release"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,400}") {
        let _ = object_from_yaml::<NodeUpdatePlan>(&text);
        let _ = object_from_yaml::<NodeRelease>(&text);
    }

    #[test]
    fn arbitrary_field_values_never_panic(
        name in "\\PC{0,80}",
        url in "\\PC{0,120}",
        sha in "[0-9a-fA-Fg]{0,70}",
        path in "\\PC{0,80}",
        unit in "\\PC{0,40}",
        window in "[0-9]{1,3}(ms|s|m|h)",
    ) {
        let text = format!(
            "apiVersion: inplace.dev/v1alpha1\nkind: NodeUpdatePlan\nmetadata: {{name: n}}\nspec:\n  nodeName: n\n  artifacts:\n  - {{name: {name:?}, type: Binary, url: {url:?}, sha256: {sha:?}, path: {path:?}}}\n  activation: {{restartUnits: [{unit:?}]}}\n  healthChecks: {{window: {window}, timeout: 5m}}\n"
        );
        if let Ok(plan) = object_from_yaml::<NodeUpdatePlan>(&text) {
            let _ = plan.validate();
            let _ = revision_of(&plan.spec.content);
        }
    }
}

#[test]
fn a_plan_built_from_a_release_is_valid_and_states_its_revision() {
    use inplace_proto::{DesiredState, NodeUpdatePlanSpec};
    let release: NodeRelease = object_from_yaml(RELEASE_A).unwrap();
    let spec =
        NodeUpdatePlanSpec::for_release("worker-1", "r", &release.spec, DesiredState::Active);
    assert_eq!(
        spec.revision.as_deref(),
        Some(revision_of(&release.spec.content).as_str())
    );
    let plan = NodeUpdatePlan::new("worker-1", spec);
    plan.validate().unwrap();
}

#[test]
fn a_signature_changes_the_revision_and_its_absence_changes_nothing() {
    let a: NodeRelease = object_from_yaml(RELEASE_A).unwrap();
    // An absent signatureUrl is not serialized, so it is not hashed: revisions of content
    // written before signatures existed stay what they were.
    let hashed = serde_json::to_value(&a.spec.content).unwrap();
    assert!(hashed["artifacts"][0].get("signatureUrl").is_none());
    let mut signed = a.clone();
    signed.spec.content.artifacts[0].signature_url = Some("https://x.example/k.raw.minisig".into());
    assert_ne!(
        revision_of(&a.spec.content),
        revision_of(&signed.spec.content)
    );
}

// `artifacts` is a list of type map keyed by name: kube-apiserver compares such lists without
// regard to order when it evaluates the release's `self == oldSelf` rule, so a reordered
// release is accepted as unchanged and must keep its revision (else the fleet re-rolls).
#[test]
fn reordering_the_artifacts_keeps_the_revision() {
    let a: NodeRelease = object_from_yaml(RELEASE_A).unwrap();
    let mut two = a.clone();
    let mut kubelet = two.spec.content.artifacts[0].clone();
    kubelet.name = "kubelet".into();
    two.spec.content.artifacts.push(kubelet);
    let mut reordered = two.clone();
    reordered.spec.content.artifacts.reverse();
    assert_eq!(
        revision_of(&two.spec.content),
        revision_of(&reordered.spec.content)
    );
}
