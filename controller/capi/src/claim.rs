//! `CanUpdateMachine` / `CanUpdateMachineSet` as pure functions: compare current and desired
//! objects, and claim exactly the changes this extension can carry out in place.
//!
//! What can be done in place: the Kubernetes version (`spec.version` of a Machine,
//! `spec.template.spec.version` of a MachineSet), when one valid NodeRelease brings the
//! desired version and the step is one Kubernetes supports on a node: no downgrade, no
//! skipped minor version. Everything else (infrastructure, bootstrap, other Machine fields) is left
//! unclaimed, so Cluster API replaces the machine when anything else changes. The claim is a
//! JSON Patch over the *current* object that sets exactly the claimed fields to their desired
//! values.

use inplace_proto::version::{is_downgrade, skips_a_minor};
use serde_json::{Value, json};

use crate::catalog::ReleaseLookup;

/// Where the Kubernetes version sits in a Machine.
pub const MACHINE_VERSION: &str = "/spec/version";
/// Where the Kubernetes version sits in a MachineSet.
pub const MACHINE_SET_VERSION: &str = "/spec/template/spec/version";
/// The part of a Machine whose changes Cluster API asks about.
pub const MACHINE_SPEC: &str = "/spec";
/// The part of a MachineSet (and of the templates) whose changes Cluster API asks about.
pub const TEMPLATE_SPEC: &str = "/spec/template/spec";

/// The Machine spec fields (relative to the compared spec) that Cluster API leaves out of its
/// "current + patches == desired" comparison: they never change, are not an in-place
/// extension's business (the references to the provider objects, which are compared
/// themselves), or Cluster API changes them in place itself. A difference there is no
/// reason to replace a machine, so it is neither claimed nor reported as unclaimed.
const LEFT_TO_CLUSTER_API: [&str; 10] = [
    "/clusterName",
    "/bootstrap",
    "/infrastructureRef",
    "/providerID",
    "/minReadySeconds",
    "/readinessGates",
    "/deletion/nodeDrainTimeoutSeconds",
    "/deletion/nodeVolumeDetachTimeoutSeconds",
    "/deletion/nodeDeletionTimeoutSeconds",
    "/taints",
];

/// How many differing fields a message names before it says "and N more".
const LISTED_DIFFERENCES: usize = 8;

/// One object of a request, current and desired, with where its compared part sits.
#[derive(Clone, Copy, Debug)]
pub struct ObjectPair<'a> {
    /// How the object is called in messages (`machine`, `infrastructureMachine`, ...).
    pub label: &'a str,
    /// The current object (null when absent).
    pub current: &'a Value,
    /// The desired object (null when absent).
    pub desired: &'a Value,
    /// The JSON pointer of the compared part (`/spec` or `/spec/template/spec`).
    pub compared: &'a str,
}

/// A version change found between current and desired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionChange {
    /// The current version (absent in a malformed object).
    pub from: Option<String>,
    /// The desired version.
    pub to: String,
}

/// The version change under `pointer`, if the desired object has a version that differs.
pub fn version_change(current: &Value, desired: &Value, pointer: &str) -> Option<VersionChange> {
    let to = desired.pointer(pointer)?.as_str()?.to_owned();
    let from = current
        .pointer(pointer)
        .and_then(Value::as_str)
        .map(str::to_owned);
    (from.as_deref() != Some(to.as_str())).then_some(VersionChange { from, to })
}

impl VersionChange {
    /// Why this change cannot be done on a running node, if it cannot.
    pub fn unsupported_step(&self) -> Option<String> {
        let from = self.from.as_deref()?;
        if is_downgrade(from, &self.to) {
            Some("a downgrade: Kubernetes does not support downgrading a node".into())
        } else if skips_a_minor(from, &self.to) {
            Some(
                "skips a minor version: Kubernetes moves a node one minor version at a time".into(),
            )
        } else {
            None
        }
    }
}

/// Every leaf path (JSON pointer) where `current` and `desired` differ, depth first.
/// Arrays that differ are reported as a whole.
pub fn differences(current: &Value, desired: &Value, at: &str, out: &mut Vec<String>) {
    // An absent object differs from a present one in each of its fields (Cluster API's
    // typed comparison sees an empty struct, not a missing one).
    let empty = Value::Object(serde_json::Map::new());
    let (current, desired) = match (current, desired) {
        (Value::Null, Value::Object(_)) => (&empty, desired),
        (Value::Object(_), Value::Null) => (current, &empty),
        pair => pair,
    };
    match (current, desired) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let child = format!("{at}/{}", escape(key));
                differences(
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                    &child,
                    out,
                );
            }
        }
        (a, b) if a == b => {}
        _ => out.push(if at.is_empty() {
            "/".to_owned()
        } else {
            at.to_owned()
        }),
    }
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The claim: the patch for the object holding the version, and a message for people.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// The JSON Patch operations over the current object; empty when nothing is claimed.
    pub operations: Vec<Value>,
    /// What was claimed, what was not, and why.
    pub message: String,
    /// Whether everything that differs is claimed (so Cluster API will update in place).
    pub covers_everything: bool,
}

impl Claim {
    /// The patch document as bytes, when something is claimed.
    pub fn patch_bytes(&self) -> Option<Vec<u8>> {
        if self.operations.is_empty() {
            return None;
        }
        serde_json::to_vec(&Value::Array(self.operations.clone())).ok()
    }
}

/// Decides what to claim. `main` is the Machine or MachineSet (holding the version at
/// `version_pointer`); `others` are the provider objects, never claimed. `lookup` is the
/// catalog's answer for the desired version (`None` when the version does not change).
pub fn claim(
    main: ObjectPair<'_>,
    others: &[ObjectPair<'_>],
    version_pointer: &str,
    lookup: Option<&ReleaseLookup>,
) -> Claim {
    let change = version_change(main.current, main.desired, version_pointer);
    // Every difference but a version change is unclaimed (the version change is reported
    // on its own below, claimed or not).
    let mut unclaimed: Vec<String> = pair_differences(&main)
        .into_iter()
        .filter(|path| change.is_none() || path != version_pointer)
        .filter(|path| !left_to_cluster_api(path, main.compared))
        .map(|path| format!("{}{path}", main.label))
        .collect();
    for pair in others {
        unclaimed.extend(
            pair_differences(pair)
                .into_iter()
                .map(|path| format!("{}{path}", pair.label)),
        );
    }

    let mut operations = Vec::new();
    let mut said = Vec::new();
    match (&change, lookup) {
        (None, _) => {}
        (Some(change), _) if change.unsupported_step().is_some() => {
            said.push(format!(
                "not claimed: {} {} {} -> {}: {}",
                main.label,
                pointer_to_field(version_pointer),
                change.from.as_deref().unwrap_or("(none)"),
                change.to,
                change.unsupported_step().unwrap_or_default()
            ));
        }
        (Some(change), Some(ReleaseLookup::Found(release))) => {
            let op = if change.from.is_some() {
                "replace"
            } else {
                "add"
            };
            operations.push(json!({"op": op, "path": version_pointer, "value": change.to}));
            said.push(format!(
                "claimed {} {} {} -> {} (NodeRelease {})",
                main.label,
                pointer_to_field(version_pointer),
                change.from.as_deref().unwrap_or("(none)"),
                change.to,
                release.name
            ));
        }
        (Some(change), lookup) => {
            let why = lookup
                .map(|l| l.explain(&change.to))
                .unwrap_or_else(|| "no release lookup was made".to_owned());
            said.push(format!(
                "not claimed: {} {} -> {}: {why}",
                main.label,
                pointer_to_field(version_pointer),
                change.to
            ));
        }
    }
    if !unclaimed.is_empty() {
        let shown: Vec<String> = unclaimed
            .iter()
            .take(LISTED_DIFFERENCES)
            .map(|p| pointer_to_field_labelled(p))
            .collect();
        let more = unclaimed.len().saturating_sub(LISTED_DIFFERENCES);
        said.push(format!(
            "not claimed (cannot be done in place): {}{}",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    if change.is_none() && unclaimed.is_empty() {
        said.push("nothing differs".to_owned());
    }
    Claim {
        covers_everything: unclaimed.is_empty() && (change.is_none() || !operations.is_empty()),
        operations,
        message: said.join("; "),
    }
}

/// Whether `path` (under the Machine spec at `compared`) is one Cluster API does not compare.
fn left_to_cluster_api(path: &str, compared: &str) -> bool {
    let Some(field) = path.strip_prefix(compared) else {
        return false;
    };
    LEFT_TO_CLUSTER_API.iter().any(|ignored| {
        field
            .strip_prefix(ignored)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// The differing paths within the compared part of one object pair.
fn pair_differences(pair: &ObjectPair<'_>) -> Vec<String> {
    let mut paths = Vec::new();
    differences(
        pair.current.pointer(pair.compared).unwrap_or(&Value::Null),
        pair.desired.pointer(pair.compared).unwrap_or(&Value::Null),
        pair.compared,
        &mut paths,
    );
    paths
}

/// `/spec/template/spec/version` → `spec.template.spec.version`.
fn pointer_to_field(pointer: &str) -> String {
    pointer
        .trim_start_matches('/')
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect::<Vec<_>>()
        .join(".")
}

/// `machine/spec/version` → `machine spec.version`.
fn pointer_to_field_labelled(labelled: &str) -> String {
    match labelled.split_once('/') {
        Some((label, rest)) => format!("{label} {}", pointer_to_field(&format!("/{rest}"))),
        None => labelled.to_owned(),
    }
}

#[cfg(test)]
mod tests {
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
        let patch: json_patch::Patch =
            serde_json::from_slice(&claim.patch_bytes().unwrap()).unwrap();
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
            vec![
                json!({"op": "replace", "path": "/spec/template/spec/version", "value": "v1.31.2"})
            ]
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
}
