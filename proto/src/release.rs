//! NodeRelease: *what* a node should run. Immutable once created.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::content::UpdateContent;

/// A reviewed, immutable set of artifacts that were tested together. A new combination is
/// a new release.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "inplace.dev",
    version = "v1alpha1",
    kind = "NodeRelease",
    doc = "What a node should run: an immutable, reviewed set of artifacts with their activation and health checks.",
    status = "NodeReleaseStatus",
    shortname = "nrel",
    category = "inplace",
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Kubernetes","type":"string","jsonPath":".spec.kubernetesVersion"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".status.revision"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Valid\")].message"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = add_immutability_rule)]
pub struct NodeReleaseSpec {
    /// A free-form version label shown by kubectl (for example `v1.31.2`).
    #[schemars(length(min = 1, max = 64))]
    pub version: String,

    /// The artifacts, activation and health checks.
    #[serde(flatten)]
    pub content: UpdateContent,
}

/// Puts `self == oldSelf` first among the spec's rules, keeping the content's own (an
/// `extend` here would replace the rules the flattened content brings).
fn add_immutability_rule(schema: &mut schemars::Schema) {
    let rule = serde_json::json!({
        "rule": "self == oldSelf",
        "message": "a NodeRelease is immutable: create a new release instead",
    });
    match schema
        .get_mut("x-kubernetes-validations")
        .and_then(serde_json::Value::as_array_mut)
    {
        Some(rules) => rules.insert(0, rule),
        None => {
            schema.insert("x-kubernetes-validations".into(), vec![rule].into());
        }
    }
}

/// What the controller found out about a release.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeReleaseStatus {
    /// The generation the controller last validated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The revision hash of the release's content; plans made from it carry the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,

    /// `Valid`, with reason `ValidRelease` or `InvalidRelease` and every problem listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
