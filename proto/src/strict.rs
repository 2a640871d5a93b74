//! Strict parsing of hand-written YAML: unknown fields are errors that name the field, as
//! `kubectl apply` (server-side field validation `Strict`) reports them. The agent and
//! controller themselves read objects leniently, so that a newer API never breaks them.

use serde::de::DeserializeOwned;

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
}

/// Parses one YAML document, refusing unknown fields anywhere in it.
pub fn from_yaml_strict<T: DeserializeOwned>(text: &str) -> Result<T, StrictError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(StrictError::TooLarge(text.len()));
    }
    let mut unknown = Vec::new();
    let value: T = serde_ignored::deserialize(serde_yaml::Deserializer::from_str(text), |path| {
        unknown.push(path.to_string())
    })?;
    // `metadata` is k8s-openapi's ObjectMeta, which knows every field; anything ignored
    // elsewhere is a typo or a field of a newer API.
    if unknown.is_empty() {
        Ok(value)
    } else {
        Err(StrictError::UnknownFields(unknown))
    }
}
