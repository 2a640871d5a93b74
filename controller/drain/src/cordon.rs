//! Cordoning a node, and the one record that inplace — not a person — cordoned it.
//!
//! Whoever cordons for inplace writes [`CORDONED_ANNOTATION`] = `"true"` *before or with*
//! the cordon, on the object it keeps its memory on: the rollout controller on the node's
//! NodeUpdatePlan (applied before the cordon is made, so a crash in between never leaves a
//! node cordoned with nobody remembering why), the Cluster API extension on the Node (in
//! the same patch as the cordon). A node that was already unschedulable is never recorded,
//! so inplace never uncordons a node a person cordoned. Only a recorded cordon is undone,
//! and the record is removed with or after the uncordon.
//!
//! Compatibility: the Cluster API extension used to record its cordon as
//! [`LEGACY_CAPI_CORDONED_ANNOTATION`] on the Node. [`is_recorded`] still reads it and
//! [`forget`] removes it, so a node cordoned by an older extension is still uncordoned.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Map, Value, json};

use crate::DrainError;

/// The record that inplace cordoned the node: `"true"`.
pub const CORDONED_ANNOTATION: &str = "inplace.dev/cordoned";

/// The Cluster API extension's record before it shared [`CORDONED_ANNOTATION`]; read and
/// removed, never written.
pub const LEGACY_CAPI_CORDONED_ANNOTATION: &str = "inplace.dev/capi-cordoned";

/// Whether `annotations` carry the record that inplace cordoned the node.
pub fn is_recorded(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| {
        a.get(CORDONED_ANNOTATION).is_some_and(|v| v == "true")
            || a.contains_key(LEGACY_CAPI_CORDONED_ANNOTATION)
    })
}

/// The annotations (for a merge patch) that record the cordon.
pub fn record() -> Map<String, Value> {
    let mut annotations = Map::new();
    annotations.insert(CORDONED_ANNOTATION.to_owned(), json!("true"));
    annotations
}

/// The annotations (for a merge patch) that forget the cordon, old record included.
pub fn forget() -> Map<String, Value> {
    let mut annotations = Map::new();
    annotations.insert(CORDONED_ANNOTATION.to_owned(), Value::Null);
    annotations.insert(LEGACY_CAPI_CORDONED_ANNOTATION.to_owned(), Value::Null);
    annotations
}

/// Patches a Node: `spec.unschedulable` when given (a cordon or an uncordon) and
/// `annotations` (merged; `null` removes), in one merge patch.
pub async fn patch_node(
    nodes: &Api<Node>,
    params: &PatchParams,
    node: &str,
    unschedulable: Option<bool>,
    annotations: Map<String, Value>,
) -> Result<(), DrainError> {
    let mut patch = json!({});
    if let Some(unschedulable) = unschedulable {
        patch["spec"] = json!({ "unschedulable": unschedulable });
    }
    if !annotations.is_empty() {
        patch["metadata"] = json!({ "annotations": annotations });
    }
    nodes
        .patch(node, params, &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| DrainError::Cordon {
            action: match unschedulable {
                Some(true) => "cordoning",
                Some(false) => "uncordoning",
                None => "annotating",
            },
            node: node.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_record_and_the_old_extension_record_both_count() {
        assert!(!is_recorded(None));
        assert!(!is_recorded(Some(&annotations(&[]))));
        assert!(is_recorded(Some(&annotations(&[(
            CORDONED_ANNOTATION,
            "true"
        )]))));
        assert!(!is_recorded(Some(&annotations(&[(
            CORDONED_ANNOTATION,
            "false"
        )]))));
        assert!(is_recorded(Some(&annotations(&[(
            LEGACY_CAPI_CORDONED_ANNOTATION,
            "true"
        )]))));
        assert_eq!(forget().len(), 2, "forgetting removes the old record too");
        assert_eq!(record()[CORDONED_ANNOTATION], "true");
    }
}
