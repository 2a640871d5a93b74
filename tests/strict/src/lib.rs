//! Strict parsing of hand-written YAML: unknown fields are errors that name the field, as
//! `kubectl apply` (server-side field validation `Strict`) reports them. The agent and
//! controller themselves read objects leniently, so that a newer API never breaks them.
//!
//! Unknown fields are found the way the API server finds them: by walking the document
//! against the CRD's structural schema (serde alone cannot see through `flatten`).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{CustomResourceExt, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The largest document accepted (the API server's request limit is 3 MiB).
pub const MAX_DOCUMENT_BYTES: usize = 3 * 1024 * 1024;

/// Why a document was refused.
#[derive(Debug, thiserror::Error)]
pub enum StrictError {
    /// The document is larger than [`MAX_DOCUMENT_BYTES`].
    #[error("document is {0} bytes, more than the limit of {MAX_DOCUMENT_BYTES}")]
    TooLarge(usize),
    /// The YAML is malformed or a field has the wrong type.
    #[error("{0}")]
    Malformed(#[from] serde_yaml::Error),
    /// The document holds fields the API does not know.
    #[error("unknown field(s): {}", .0.join(", "))]
    UnknownFields(Vec<String>),
    /// `apiVersion`/`kind` name another type.
    #[error("expected apiVersion {expected_api_version} kind {expected_kind}, found {found}")]
    WrongKind {
        /// The apiVersion the caller asked for.
        expected_api_version: String,
        /// The kind the caller asked for.
        expected_kind: String,
        /// What the document says.
        found: String,
    },
}

/// Parses one Kubernetes object of type `K`: `apiVersion` and `kind` must name `K`, field
/// types must match, and unknown fields anywhere are refused with their paths.
pub fn object_from_yaml<K>(text: &str) -> Result<K, StrictError>
where
    K: Resource<DynamicType = ()> + CustomResourceExt + DeserializeOwned,
{
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(StrictError::TooLarge(text.len()));
    }
    let document: Value = serde_yaml::from_str(text)?;
    let (api_version, kind) = (K::api_version(&()), K::kind(&()));
    let found = |field: &str| {
        document
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    if found("apiVersion") != api_version || found("kind") != kind {
        return Err(StrictError::WrongKind {
            expected_api_version: api_version.into_owned(),
            expected_kind: kind.into_owned(),
            found: format!(
                "apiVersion {:?} kind {:?}",
                found("apiVersion"),
                found("kind")
            ),
        });
    }

    let mut unknown = Vec::new();
    if let Some(metadata) = document.get("metadata") {
        let _: Result<ObjectMeta, _> =
            serde_ignored::deserialize(metadata, |path| unknown.push(format!("metadata.{path}")));
    }
    let crd = K::crd();
    let root = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref()?.open_api_v3_schema.as_ref());
    if let (Some(root), Value::Object(fields)) = (root, &document) {
        for (key, value) in fields {
            match key.as_str() {
                "apiVersion" | "kind" | "metadata" => {}
                _ => match root.properties.as_ref().and_then(|p| p.get(key)) {
                    Some(schema) => collect_unknown(value, schema, key, &mut unknown),
                    None => unknown.push(key.clone()),
                },
            }
        }
    }
    if !unknown.is_empty() {
        return Err(StrictError::UnknownFields(unknown));
    }
    Ok(serde_yaml::from_str(text)?)
}

/// Pushes the path of every object key that `schema` does not declare.
fn collect_unknown(value: &Value, schema: &JSONSchemaProps, at: &str, out: &mut Vec<String>) {
    if schema.x_kubernetes_preserve_unknown_fields == Some(true) {
        return;
    }
    match value {
        Value::Object(fields) => {
            let additional = match &schema.additional_properties {
                Some(JSONSchemaPropsOrBool::Schema(s)) => Some(s.as_ref()),
                _ => None,
            };
            for (key, child) in fields {
                let path = format!("{at}.{key}");
                match (
                    schema.properties.as_ref().and_then(|p| p.get(key)),
                    additional,
                ) {
                    (Some(s), _) | (None, Some(s)) => collect_unknown(child, s, &path, out),
                    (None, None) => {
                        if schema.additional_properties.is_none() {
                            out.push(path);
                        }
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item_schema)) = &schema.items {
                for (i, item) in items.iter().enumerate() {
                    collect_unknown(item, item_schema, &format!("{at}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}
