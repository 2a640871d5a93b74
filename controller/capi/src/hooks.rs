//! The wire types of Cluster API's Runtime SDK hooks that this extension serves, mirroring
//! `sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1` (`common_types.go`,
//! `discovery_types.go`, `inplaceupdate_types.go`).
//!
//! Requests tolerate unknown fields (Cluster API adds fields over time) and missing ones (a
//! missing object is a `Failure` answer, not a parse error). Machine, MachineSet and the
//! provider objects stay `serde_json::Value`: only a few of their fields are read, and the
//! claim patches are computed against exactly the JSON Cluster API sent.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// `apiVersion` of every hook request and response.
pub const HOOKS_API_VERSION: &str = "hooks.runtime.cluster.x-k8s.io/v1alpha1";

/// The hook paths, as Cluster API's `GVHToPath` builds them:
/// `/<group>/<version>/<lower-cased hook>[/<handler name>]`.
pub mod paths {
    /// Discovery.
    pub const DISCOVERY: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery";
    /// The `CanUpdateMachine` handler.
    pub const CAN_UPDATE_MACHINE: &str =
        "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/can-update-machine";
    /// The `CanUpdateMachineSet` handler.
    pub const CAN_UPDATE_MACHINE_SET: &str =
        "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachineset/can-update-machineset";
    /// The `UpdateMachine` handler.
    pub const UPDATE_MACHINE: &str =
        "/hooks.runtime.cluster.x-k8s.io/v1alpha1/updatemachine/update-machine";
}

/// The handler names announced by discovery (Cluster API registers each as
/// `<handler name>.<ExtensionConfig name>`).
pub mod handler_names {
    /// Answers `CanUpdateMachine`.
    pub const CAN_UPDATE_MACHINE: &str = "can-update-machine";
    /// Answers `CanUpdateMachineSet`.
    pub const CAN_UPDATE_MACHINE_SET: &str = "can-update-machineset";
    /// Answers `UpdateMachine`.
    pub const UPDATE_MACHINE: &str = "update-machine";
}

/// `status` of every response.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseStatus {
    /// The call succeeded (for `UpdateMachine`: in progress or done).
    Success,
    /// The call failed; `message` says why.
    Failure,
}

/// A `DiscoveryRequest` (it carries nothing the extension needs).
#[derive(Deserialize, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryRequest {
    /// Echoed as sent.
    #[serde(default)]
    pub api_version: Option<String>,
    /// `DiscoveryRequest`.
    #[serde(default)]
    pub kind: Option<String>,
}

/// The `DiscoveryResponse`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryResponse {
    /// [`HOOKS_API_VERSION`].
    pub api_version: String,
    /// `DiscoveryResponse`.
    pub kind: String,
    /// Always `Success`.
    pub status: ResponseStatus,
    /// Empty unless something is wrong.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The handlers served.
    pub handlers: Vec<ExtensionHandler>,
}

/// One handler announced by discovery.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionHandler {
    /// The handler name (the last path segment).
    pub name: String,
    /// Which hook it answers.
    pub request_hook: GroupVersionHook,
    /// How long Cluster API waits for an answer (default 10, at most 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
    /// `Fail` or `Ignore` (default `Fail`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<String>,
}

/// A hook, by API version and name.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GroupVersionHook {
    /// [`HOOKS_API_VERSION`].
    pub api_version: String,
    /// `CanUpdateMachine`, `CanUpdateMachineSet` or `UpdateMachine`.
    pub hook: String,
}

/// The objects of one side (current or desired) of a Machine hook request.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineObjects {
    /// The full Machine (`cluster.x-k8s.io/v1beta2`).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub machine: Value,
    /// The provider's infrastructure Machine.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub infrastructure_machine: Value,
    /// The bootstrap config, when there is one.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub bootstrap_config: Value,
}

/// The objects of one side of a `CanUpdateMachineSet` request.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetObjects {
    /// The full MachineSet (`cluster.x-k8s.io/v1beta2`).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub machine_set: Value,
    /// The provider's infrastructure Machine template.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub infrastructure_machine_template: Value,
    /// The bootstrap config template, when there is one.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub bootstrap_config_template: Value,
}

/// A `CanUpdateMachineRequest`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineRequest {
    /// [`HOOKS_API_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `CanUpdateMachineRequest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The ExtensionConfig's settings.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
    /// What the Machine is now (spec only).
    #[serde(default)]
    pub current: MachineObjects,
    /// What Cluster API wants it to be (spec only).
    #[serde(default)]
    pub desired: MachineObjects,
}

/// A `CanUpdateMachineSetRequest`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineSetRequest {
    /// [`HOOKS_API_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `CanUpdateMachineSetRequest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The ExtensionConfig's settings.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
    /// What the MachineSet is now.
    #[serde(default)]
    pub current: MachineSetObjects,
    /// What Cluster API wants it to be.
    #[serde(default)]
    pub desired: MachineSetObjects,
}

/// An `UpdateMachineRequest`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdateMachineRequest {
    /// [`HOOKS_API_VERSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `UpdateMachineRequest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The ExtensionConfig's settings.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
    /// The Machine as it should be, full object (labels, spec, status.nodeRef).
    #[serde(default)]
    pub desired: MachineObjects,
}

/// How a patch is written.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 6902 operations (what this extension writes).
    JSONPatch,
    /// RFC 7386 merge patch.
    JSONMergePatch,
}

/// One patch: JSON bytes, base64 on the wire (a Go `[]byte`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Patch {
    /// `JSONPatch` or `JSONMergePatch`.
    pub patch_type: PatchType,
    /// The patch document.
    #[serde(serialize_with = "base64_encode", deserialize_with = "base64_decode")]
    pub patch: Vec<u8>,
}

fn base64_encode<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn base64_decode<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(deserializer)?;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(serde::de::Error::custom)
}

/// The `CanUpdateMachineResponse`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineResponse {
    /// [`HOOKS_API_VERSION`].
    pub api_version: String,
    /// `CanUpdateMachineResponse`.
    pub kind: String,
    /// `Success` whether or not anything is claimed; `Failure` for a broken request.
    pub status: ResponseStatus,
    /// What was claimed, and what was not and why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The Machine changes done in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_patch: Option<Patch>,
    /// Infrastructure Machine changes done in place (never any: providers own them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_machine_patch: Option<Patch>,
    /// Bootstrap config changes done in place (never any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_config_patch: Option<Patch>,
    /// Whether the update affects availability (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affects_availability: Option<bool>,
}

/// The `CanUpdateMachineSetResponse`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineSetResponse {
    /// [`HOOKS_API_VERSION`].
    pub api_version: String,
    /// `CanUpdateMachineSetResponse`.
    pub kind: String,
    /// `Success` whether or not anything is claimed; `Failure` for a broken request.
    pub status: ResponseStatus,
    /// What was claimed, and what was not and why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The MachineSet changes done in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_set_patch: Option<Patch>,
    /// Infrastructure template changes done in place (never any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_machine_template_patch: Option<Patch>,
    /// Bootstrap template changes done in place (never any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_config_template_patch: Option<Patch>,
    /// Whether the update affects availability (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affects_availability: Option<bool>,
}

/// The `UpdateMachineResponse`: `Success` with `retryAfterSeconds > 0` is in progress,
/// `Success` with 0 is done, `Failure` is failed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpdateMachineResponse {
    /// [`HOOKS_API_VERSION`].
    pub api_version: String,
    /// `UpdateMachineResponse`.
    pub kind: String,
    /// `Success` or `Failure`.
    pub status: ResponseStatus,
    /// What the node is doing, or why it failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When to ask again; 0 means done. Always written (required by Cluster API).
    #[serde(default)]
    pub retry_after_seconds: i32,
}

/// The discovery answer: the three in-place update handlers.
pub fn discovery_response(update_machine_timeout_seconds: i32) -> DiscoveryResponse {
    let handler = |name: &str, hook: &str, timeout: Option<i32>| ExtensionHandler {
        name: name.to_owned(),
        request_hook: GroupVersionHook {
            api_version: HOOKS_API_VERSION.to_owned(),
            hook: hook.to_owned(),
        },
        timeout_seconds: timeout,
        failure_policy: Some("Fail".to_owned()),
    };
    DiscoveryResponse {
        api_version: HOOKS_API_VERSION.to_owned(),
        kind: "DiscoveryResponse".to_owned(),
        status: ResponseStatus::Success,
        message: String::new(),
        handlers: vec![
            handler(
                handler_names::CAN_UPDATE_MACHINE,
                "CanUpdateMachine",
                Some(10),
            ),
            handler(
                handler_names::CAN_UPDATE_MACHINE_SET,
                "CanUpdateMachineSet",
                Some(10),
            ),
            handler(
                handler_names::UPDATE_MACHINE,
                "UpdateMachine",
                Some(update_machine_timeout_seconds),
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patch_bytes_are_base64_on_the_wire() {
        let patch = Patch {
            patch_type: PatchType::JSONPatch,
            patch: br#"[{"op":"replace","path":"/spec/version","value":"v1.31.2"}]"#.to_vec(),
        };
        let wire = serde_json::to_value(&patch).unwrap();
        assert_eq!(wire["patchType"], "JSONPatch");
        let text = wire["patch"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        assert_eq!(decoded, patch.patch);
        let back: Patch = serde_json::from_value(wire).unwrap();
        assert_eq!(back, patch);
    }

    #[test]
    fn update_machine_response_always_carries_retry_after_seconds() {
        let done = UpdateMachineResponse {
            api_version: HOOKS_API_VERSION.into(),
            kind: "UpdateMachineResponse".into(),
            status: ResponseStatus::Success,
            message: String::new(),
            retry_after_seconds: 0,
        };
        assert_eq!(
            serde_json::to_value(&done).unwrap(),
            json!({"apiVersion": HOOKS_API_VERSION, "kind": "UpdateMachineResponse",
                   "status": "Success", "retryAfterSeconds": 0})
        );
    }

    #[test]
    fn empty_can_update_response_omits_patches() {
        let none = CanUpdateMachineResponse {
            api_version: HOOKS_API_VERSION.into(),
            kind: "CanUpdateMachineResponse".into(),
            status: ResponseStatus::Success,
            message: "nothing".into(),
            machine_patch: None,
            infrastructure_machine_patch: None,
            bootstrap_config_patch: None,
            affects_availability: None,
        };
        let wire = serde_json::to_value(&none).unwrap();
        assert_eq!(wire.as_object().unwrap().len(), 4, "{wire}");
    }

    #[test]
    fn requests_tolerate_unknown_and_missing_fields() {
        let request: UpdateMachineRequest = serde_json::from_value(json!({
            "apiVersion": HOOKS_API_VERSION,
            "kind": "UpdateMachineRequest",
            "somethingNew": {"x": 1},
            "desired": {"machine": {"metadata": {"name": "m"}}, "extra": true}
        }))
        .unwrap();
        assert_eq!(request.desired.machine["metadata"]["name"], "m");
        assert!(request.desired.infrastructure_machine.is_null());
        let empty: CanUpdateMachineSetRequest = serde_json::from_value(json!({})).unwrap();
        assert!(empty.current.machine_set.is_null());
    }

    #[test]
    fn discovery_lists_the_three_handlers_on_the_paths_served() {
        let response = discovery_response(30);
        let names: Vec<_> = response.handlers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "can-update-machine",
                "can-update-machineset",
                "update-machine"
            ]
        );
        for handler in &response.handlers {
            let path = format!(
                "/hooks.runtime.cluster.x-k8s.io/v1alpha1/{}/{}",
                handler.request_hook.hook.to_lowercase(),
                handler.name
            );
            assert!(
                [
                    paths::CAN_UPDATE_MACHINE,
                    paths::CAN_UPDATE_MACHINE_SET,
                    paths::UPDATE_MACHINE
                ]
                .contains(&path.as_str()),
                "{path}"
            );
        }
    }
}
