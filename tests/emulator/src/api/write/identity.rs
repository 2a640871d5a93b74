//! The write's identity stage: which object this is.

use super::*;

pub(super) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// The object's type and identity: `kind` / `apiVersion` of the URL, the namespace of the
/// URL, the name of the URL or the body (or one made from `generateName`), and a valid name.
pub(super) fn settle(t: &Target, new: &mut Value) -> Result<String, ApiError> {
    let ty = &t.ty;
    let ns = t.ns();
    if !new.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let kind = new
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if !kind.is_empty() && kind != ty.kind {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({})",
            new.get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            t.api_version()
        )));
    }
    new["kind"] = json!(ty.kind);
    new["apiVersion"] = json!(ty.api_version());
    if !new.get("metadata").is_some_and(Value::is_object) {
        new["metadata"] = json!({});
    }
    let body_ns = new
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(str::to_string);
    if ty.namespaced {
        match body_ns {
            Some(b) if !b.is_empty() && b != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => new["metadata"]["namespace"] = json!(ns),
        }
    } else if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    let url_name = t.name.clone();
    let name = match (
        &url_name,
        new.pointer("/metadata/name").and_then(Value::as_str),
    ) {
        (Some(u), Some(b)) if u != b => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({b}) does not match the name on the URL ({u})"
            )));
        }
        (_, Some(b)) if !b.is_empty() => b.to_string(),
        (Some(u), _) => u.clone(),
        (None, _) => match new
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
        {
            Some(prefix) => {
                let suffix: String = uuid()
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(5)
                    .collect();
                format!("{prefix}{suffix}")
            }
            None => {
                return Err(ApiError::invalid(
                    &ty.kind,
                    &ty.group,
                    "",
                    vec![cause(
                        "FieldValueRequired",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    )],
                ));
            }
        },
    };
    new["metadata"]["name"] = json!(name);
    let valid_name = if ty.plural == "namespaces" {
        is_dns_subdomain(&name) && !name.contains('.') && name.len() <= 63
    } else if ty.plural == "nodes" || ty.custom {
        is_dns_subdomain(&name)
    } else {
        !name.is_empty() && !name.contains('/') && name != "." && name != ".."
    };
    if !valid_name {
        return Err(ApiError::invalid(
            &ty.kind,
            &ty.group,
            &name,
            vec![cause(
                "FieldValueInvalid",
                "metadata.name",
                format!(
                    "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            )],
        ));
    }
    Ok(name)
}
