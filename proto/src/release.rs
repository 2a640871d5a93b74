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

    /// Whether this release also brings a kubeadm control-plane node to `kubernetesVersion`
    /// (its activation upgrades the control-plane static Pods, not only the kubelet). The
    /// Cluster API extension updates a control-plane Machine in place only with such a
    /// release: a kubelet newer than the API server beside it breaks the version skew policy.
    /// Not part of the content: it is the author's word about the content, not something a
    /// node runs, so it leaves the revision alone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub updates_control_plane: bool,

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

/// Why a release cannot be used by a rollout or the Cluster API extension.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// `validate()` finds problems: each, with its field path.
    #[error("{0}")]
    Invalid(crate::Problems),
    /// The release controller marked this generation `Valid=False` (a controller of another
    /// version may judge what this one accepts): its message.
    #[error("Valid=False: {0}")]
    MarkedInvalid(String),
}

impl NodeRelease {
    /// The one judgement of whether this release may be used, and its revision when it may:
    /// it validates, and the release controller has not marked this generation
    /// `Valid=False` (a mark on an earlier generation says nothing about this spec). The
    /// release controller itself judges with `validate()` alone: it writes that mark.
    pub fn usable(&self) -> Result<String, Unusable> {
        self.validate().map_err(Unusable::Invalid)?;
        let conditions = self.status.as_ref().map_or(&[][..], |s| &s.conditions);
        let mark = crate::condition::find(conditions, crate::reason::release_condition::VALID);
        if let Some(mark) = mark
            && mark.status == crate::condition::FALSE
            && (mark.observed_generation.is_none()
                || mark.observed_generation == self.metadata.generation)
        {
            return Err(Unusable::MarkedInvalid(mark.message.clone()));
        }
        Ok(crate::revision_of(&self.spec.content))
    }
}
