//! `CanUpdateMachine` / `CanUpdateMachineSet` as pure functions: compare current and desired
//! objects, and claim exactly the changes this extension can carry out in place.
//!
//! What can be done in place: the Kubernetes version (`spec.version` of a Machine,
//! `spec.template.spec.version` of a MachineSet), when one valid NodeRelease brings the
//! desired version and the step is one Kubernetes supports on a node: no downgrade, no
//! skipped minor version. Everything else (infrastructure, bootstrap, other Machine fields) is left
//! unclaimed, so Cluster API replaces the machine when anything else changes. The claim is a
//! JSON Patch over the *current* object that sets exactly the claimed fields to their desired
//! values. A control-plane Machine is claimed only with a release that says it updates
//! control-plane nodes ([`control_plane`]); a Machine whose node the release has no build
//! for is not claimed ([`architecture`]: the lookup the extension passes in says so).

use inplace_proto::version::{is_downgrade, skips_a_minor};
use serde_json::{Value, json};

use crate::catalog::ReleaseLookup;

pub mod architecture;
pub mod control_plane;

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
    let control_plane = control_plane::is_control_plane(main.desired);
    let restricted = lookup
        .cloned()
        .map(|l| control_plane::restrict(l, control_plane));
    let lookup = restricted.as_ref();
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
        said.extend(control_plane::bootstrap_note(control_plane, &unclaimed));
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
mod tests;
