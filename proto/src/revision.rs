//! The revision of a piece of content: a short hash that names "this exact set of
//! artifacts, activation and checks". Stable across field order and formatting, because it
//! is computed over the typed value with object keys sorted, never over the input text, and
//! with `artifacts` in name order: the API declares that list a map keyed by name, and
//! kube-apiserver's `self == oldSelf` on a NodeRelease holds for a reordered list.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::content::UpdateContent;

/// Hex digits kept from the sha256: 48 bits, plenty for the releases of one cluster.
pub const REVISION_LEN: usize = 12;

/// The revision hash of `content`.
pub fn revision_of(content: &UpdateContent) -> String {
    let mut by_name = content.clone();
    by_name.artifacts.sort_by(|a, b| a.name.cmp(&b.name));
    // Serializing a typed value cannot fail: it holds only strings, numbers and lists.
    let value = serde_json::to_value(&by_name).unwrap_or(Value::Null);
    let mut hasher = Sha256::new();
    write_canonical(&value, &mut hasher);
    let digest = hex::encode(hasher.finalize());
    digest[..REVISION_LEN].to_owned()
}

/// Feeds `value` to the hasher as JSON with object keys sorted, whatever order the map
/// type keeps them in.
fn write_canonical(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            hasher.update(b"{");
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                hasher.update(Value::String(key.clone()).to_string().as_bytes());
                hasher.update(b":");
                write_canonical(&map[key], hasher);
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                write_canonical(item, hasher);
            }
            hasher.update(b"]");
        }
        scalar => hasher.update(scalar.to_string().as_bytes()),
    }
}
