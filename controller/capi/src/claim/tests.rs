use super::*;
use crate::catalog::select_release;
use crate::catalog::tests::release;

fn machine(version: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {"name": "w-1", "namespace": "default",
                     "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "spec": {
            "clusterName": "c1",
            "version": version,
            "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfig", "name": "w-1"}},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "w-1"},
            "providerID": "docker:////w-1"
        }
    })
}

fn infra(memory: u64) -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DevMachine",
           "metadata": {"name": "w-1"}, "spec": {"memoryMiB": memory, "cpus": 2}})
}

fn found() -> ReleaseLookup {
    select_release(&[release("kubernetes-v1.31.2", "v1.31.2")], "v1.31.2")
}

fn pairs<'a>(
    current: &'a Value,
    desired: &'a Value,
    infra_current: &'a Value,
    infra_desired: &'a Value,
) -> (ObjectPair<'a>, [ObjectPair<'a>; 1]) {
    (
        ObjectPair {
            label: "machine",
            current,
            desired,
            compared: MACHINE_SPEC,
        },
        [ObjectPair {
            label: "infrastructureMachine",
            current: infra_current,
            desired: infra_desired,
            compared: MACHINE_SPEC,
        }],
    )
}

#[test]
fn a_version_bump_with_a_release_is_claimed_as_a_replace_of_spec_version() {
    let (current, desired) = (machine("v1.31.1"), machine("v1.31.2"));
    let (i1, i2) = (infra(4096), infra(4096));
    let (main, others) = pairs(&current, &desired, &i1, &i2);
    let claim = claim(main, &others, MACHINE_VERSION, Some(&found()));
    assert_eq!(
        claim.operations,
        vec![json!({"op": "replace", "path": "/spec/version", "value": "v1.31.2"})]
    );
    assert!(claim.covers_everything);
    assert!(
        claim.message.contains("kubernetes-v1.31.2"),
        "{}",
        claim.message
    );
    let bytes = claim.patch_bytes().unwrap();
    assert_eq!(
        String::from_utf8(bytes).unwrap(),
        r#"[{"op":"replace","path":"/spec/version","value":"v1.31.2"}]"#
    );
}

#[test]
fn the_patch_turns_current_into_desired_for_the_version() {
    let (current, desired) = (machine("v1.31.1"), machine("v1.31.2"));
    let (i1, i2) = (infra(1), infra(1));
    let (main, others) = pairs(&current, &desired, &i1, &i2);
    let claim = claim(main, &others, MACHINE_VERSION, Some(&found()));
    let patch: json_patch::Patch = serde_json::from_slice(&claim.patch_bytes().unwrap()).unwrap();
    let mut patched = current.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    assert_eq!(patched, desired);
}

#[test]
fn an_unrelated_change_is_not_claimed() {
    let (current, desired) = (machine("v1.31.1"), machine("v1.31.1"));
    let (i1, i2) = (infra(4096), infra(8192));
    let (main, others) = pairs(&current, &desired, &i1, &i2);
    let claim = claim(main, &others, MACHINE_VERSION, None);
    assert!(claim.operations.is_empty());
    assert!(claim.patch_bytes().is_none());
    assert!(!claim.covers_everything);
    assert!(
        claim
            .message
            .contains("infrastructureMachine spec.memoryMiB"),
        "{}",
        claim.message
    );
}

#[test]
fn a_mixed_change_claims_only_the_version() {
    let (current, desired) = (machine("v1.31.1"), machine("v1.31.2"));
    let (i1, i2) = (infra(4096), infra(8192));
    let (main, others) = pairs(&current, &desired, &i1, &i2);
    let claim = claim(main, &others, MACHINE_VERSION, Some(&found()));
    assert_eq!(claim.operations.len(), 1);
    assert_eq!(claim.operations[0]["path"], "/spec/version");
    assert!(!claim.covers_everything);
    assert!(claim.message.contains("memoryMiB"), "{}", claim.message);
}

#[test]
fn a_version_without_a_usable_release_is_not_claimed_and_says_why() {
    let (current, desired) = (machine("v1.31.1"), machine("v1.33.0"));
    let (i1, i2) = (infra(1), infra(1));
    let (main, others) = pairs(&current, &desired, &i1, &i2);
    for lookup in [
        ReleaseLookup::NotFound,
        ReleaseLookup::Invalid(vec![("r".into(), "bad".into())]),
        ReleaseLookup::Ambiguous(vec!["a".into(), "b".into()]),
        ReleaseLookup::ClusterNotReady(
            "workload cluster ns/c1 serves no NodeUpdatePlans for v1.33.0".into(),
        ),
    ] {
        let claim = claim(main, &others, MACHINE_VERSION, Some(&lookup));
        assert!(claim.operations.is_empty(), "{lookup:?}");
        assert!(!claim.covers_everything);
        assert!(claim.message.contains("not claimed"), "{}", claim.message);
        assert!(claim.message.contains("v1.33.0"), "{}", claim.message);
    }
}

#[test]
fn other_machine_fields_are_never_claimed() {
    let current = machine("v1.31.1");
    let mut desired = machine("v1.31.2");
    desired["spec"]["failureDomain"] = json!("zone-b");
    let (i1, i2) = (infra(1), infra(1));
    let (main, others) = pairs(&current, &desired, &i1, &i2);
    let claim = claim(main, &others, MACHINE_VERSION, Some(&found()));
    assert_eq!(claim.operations.len(), 1);
    assert!(!claim.covers_everything);
    assert!(
        claim.message.contains("machine spec.failureDomain"),
        "{}",
        claim.message
    );
}

#[test]
fn a_missing_current_version_is_added_not_replaced() {
    let mut current = machine("v1.31.1");
    current["spec"].as_object_mut().unwrap().remove("version");
    let desired = machine("v1.31.2");
    let (i1, i2) = (infra(1), infra(1));
    let (main, others) = pairs(&current, &desired, &i1, &i2);
    let claim = claim(main, &others, MACHINE_VERSION, Some(&found()));
    assert_eq!(claim.operations[0]["op"], "add");
}

#[test]
fn a_downgrade_or_a_skipped_minor_is_not_claimed_even_with_a_release() {
    for (to, why) in [
        ("v1.31.0", "a downgrade"),
        ("v1.33.0", "skips a minor version"),
    ] {
        let (current, desired) = (machine("v1.31.1"), machine(to));
        let lookup = select_release(&[release("r", to)], to);
        let (main, others) = pairs(&current, &desired, &Value::Null, &Value::Null);
        let claim = claim(main, &others, MACHINE_VERSION, Some(&lookup));
        assert!(claim.operations.is_empty(), "{to}");
        assert!(!claim.covers_everything);
        assert!(claim.message.contains(why), "{}", claim.message);
    }
    let (current, desired) = (machine("v1.31.1"), machine("v1.32.0"));
    let lookup = select_release(&[release("r", "v1.32.0")], "v1.32.0");
    let (main, others) = pairs(&current, &desired, &Value::Null, &Value::Null);
    assert!(claim(main, &others, MACHINE_VERSION, Some(&lookup)).covers_everything);
}

#[test]
fn fields_cluster_api_does_not_compare_are_not_reported() {
    let mut desired = machine("v1.31.2");
    desired["spec"]["infrastructureRef"]["name"] = json!("w-2");
    desired["spec"]["deletion"] = json!({"nodeDrainTimeoutSeconds": 60});
    desired["spec"]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
    let current = machine("v1.31.1");
    let (main, others) = pairs(&current, &desired, &Value::Null, &Value::Null);
    let all = claim(main, &others, MACHINE_VERSION, Some(&found()));
    assert!(all.covers_everything, "{}", all.message);
    assert!(!all.message.contains("not claimed"), "{}", all.message);

    // A field next to an ignored one, with a common prefix, still counts.
    desired["spec"]["failureDomain"] = json!("zone-b");
    let (main, others) = pairs(&current, &desired, &Value::Null, &Value::Null);
    let claim = claim(main, &others, MACHINE_VERSION, Some(&found()));
    assert!(!claim.covers_everything);
    assert!(
        claim.message.contains("machine spec.failureDomain"),
        "{}",
        claim.message
    );
}

#[test]
fn a_removed_version_is_not_claimed() {
    let current = machine("v1.31.1");
    let mut desired = machine("v1.31.1");
    desired["spec"].as_object_mut().unwrap().remove("version");
    let (i1, i2) = (infra(1), infra(1));
    let (main, others) = pairs(&current, &desired, &i1, &i2);
    let claim = claim(main, &others, MACHINE_VERSION, None);
    assert!(claim.operations.is_empty());
    assert!(!claim.covers_everything);
    assert!(
        claim.message.contains("machine spec.version"),
        "{}",
        claim.message
    );
}

#[test]
fn nothing_differs_claims_nothing_and_covers_everything() {
    let m = machine("v1.31.1");
    let i = infra(1);
    let (main, others) = pairs(&m, &m, &i, &i);
    let claim = claim(main, &others, MACHINE_VERSION, None);
    assert!(claim.operations.is_empty());
    assert!(claim.covers_everything);
    assert_eq!(claim.message, "nothing differs");
}

#[test]
fn a_machine_set_claims_its_template_version_only() {
    let ms = |version: &str, replicas: u32| {
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
               "metadata": {"name": "md-0-abc", "namespace": "default"},
               "spec": {"clusterName": "c1", "replicas": replicas,
                        "template": {"spec": {"clusterName": "c1", "version": version}}}})
    };
    let (current, desired) = (ms("v1.31.1", 3), ms("v1.31.2", 5));
    let t = json!({"spec": {"template": {"spec": {"memoryMiB": 1}}}});
    let main = ObjectPair {
        label: "machineSet",
        current: &current,
        desired: &desired,
        compared: TEMPLATE_SPEC,
    };
    let others = [ObjectPair {
        label: "infrastructureMachineTemplate",
        current: &t,
        desired: &t,
        compared: TEMPLATE_SPEC,
    }];
    let claim = claim(main, &others, MACHINE_SET_VERSION, Some(&found()));
    assert_eq!(
        claim.operations,
        vec![json!({"op": "replace", "path": "/spec/template/spec/version", "value": "v1.31.2"})]
    );
    // replicas is outside spec.template.spec: not Cluster API's question, not reported.
    assert!(claim.covers_everything, "{}", claim.message);
    assert!(claim.message.contains("spec.template.spec.version"));
}

#[test]
fn many_differences_are_summarised() {
    let current = json!({"spec": {}});
    let desired = json!({"spec": (0..20).map(|i| (format!("f{i:02}"), json!(i))).collect::<serde_json::Map<_, _>>()});
    let main = ObjectPair {
        label: "machine",
        current: &current,
        desired: &desired,
        compared: MACHINE_SPEC,
    };
    let claim = claim(main, &[], MACHINE_VERSION, None);
    assert!(claim.message.ends_with("and 12 more"), "{}", claim.message);
}

#[test]
fn differences_escape_keys_and_report_whole_arrays() {
    let mut out = Vec::new();
    differences(
        &json!({"a/b": 1, "list": [1, 2], "same": {"x": 1}}),
        &json!({"a/b": 2, "list": [1, 3], "same": {"x": 1}, "new": true}),
        "",
        &mut out,
    );
    assert_eq!(out, ["/a~1b", "/list", "/new"]);
}

/// A Machine as KubeadmControlPlane sends it: labelled as control plane.
fn control_plane_machine(version: &str) -> Value {
    let mut machine = machine(version);
    machine["metadata"]["labels"][control_plane::CONTROL_PLANE_LABEL] = json!("");
    machine
}

/// The claim for a control-plane Machine's v1.31.1 -> v1.31.2 with `bootstrap` (current,
/// desired) as its bootstrap config, the release opted in or not.
fn control_plane_claim(updates_control_plane: bool, bootstrap: (&Value, &Value)) -> Claim {
    let (current, desired) = (
        control_plane_machine("v1.31.1"),
        control_plane_machine("v1.31.2"),
    );
    let (i1, i2) = (infra(1), infra(1));
    let (main, [infra_pair]) = pairs(&current, &desired, &i1, &i2);
    let bootstrap = ObjectPair {
        label: "bootstrapConfig",
        current: bootstrap.0,
        desired: bootstrap.1,
        compared: MACHINE_SPEC,
    };
    claim(
        main,
        &[infra_pair, bootstrap],
        MACHINE_VERSION,
        Some(&control_plane::tests::found(updates_control_plane)),
    )
}

#[test]
fn a_control_plane_machine_is_not_claimed_with_a_release_that_does_not_opt_in() {
    let claim = control_plane_claim(false, (&Value::Null, &Value::Null));
    assert!(claim.operations.is_empty());
    assert!(!claim.covers_everything);
    assert!(
        claim.message.starts_with(
            "not claimed: machine spec.version -> v1.31.2: this is a control-plane Machine"
        ),
        "{}",
        claim.message
    );
    assert!(
        claim.message.contains("spec.updatesControlPlane"),
        "{}",
        claim.message
    );
}

#[test]
fn a_control_plane_machine_is_claimed_with_a_release_that_opts_in() {
    let claim = control_plane_claim(true, (&Value::Null, &Value::Null));
    assert_eq!(
        claim.operations,
        vec![json!({"op": "replace", "path": "/spec/version", "value": "v1.31.2"})]
    );
    assert!(claim.covers_everything, "{}", claim.message);
}

#[test]
fn kubeadm_control_plane_changes_are_not_claimed_even_when_the_release_opts_in() {
    let kubeadm = |extra_args: Value| {
        json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig",
               "spec": {"clusterConfiguration": {"apiServer": {"extraArgs": extra_args}}}})
    };
    let (b1, b2) = (
        kubeadm(json!([])),
        kubeadm(json!([{"name": "audit-log-maxage", "value": "30"}])),
    );
    let claim = control_plane_claim(true, (&b1, &b2));
    assert!(!claim.covers_everything);
    assert!(
        claim
            .message
            .contains("bootstrapConfig spec.clusterConfiguration.apiServer.extraArgs"),
        "{}",
        claim.message
    );
    assert!(
        claim
            .message
            .contains("KubeadmControlPlane's spec.kubeadmConfigSpec"),
        "{}",
        claim.message
    );
}
