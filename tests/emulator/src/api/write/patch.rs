//! Patches (JSON, merge, strategic merge) and server-side apply: the object to write.

use super::*;

pub(in crate::api) fn patch(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let ct = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut c = ctx(t, req, "patch");
    // Decoded before taking the store's lock: every other request waits while it is held.
    let apply_config: Option<Value> = match ct.as_str() {
        "application/apply-patch+yaml" => Some(
            serde_yaml::from_slice(&req.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        ),
        _ => None,
    };
    let mut inner = st.store.lock();
    let old = current(&inner, t);
    let name = t.name();
    let new = match (ct.as_str(), apply_config) {
        ("application/apply-patch+yaml", Some(config)) => {
            let Some(manager) = req.query.get("fieldManager").filter(|m| !m.is_empty()) else {
                return Err(ApiError::bad_request(
                    "PATCH, application/apply-patch+yaml requires fieldManager to be set",
                ));
            };
            if config.get("apiVersion").is_none() || config.get("kind").is_none() {
                return Err(ApiError::bad_request(
                    "invalid object type: apiVersion and kind must be set in an apply configuration",
                ));
            }
            c.manager = manager.clone();
            c.applied = true;
            let force = is_true(req.query.get("force"));
            let mut merged = managed::apply(
                old.as_deref(),
                &config,
                t.ty.schema.as_ref(),
                manager,
                t.sub(),
                force,
                &t.ty.api_version(),
            )
            .map_err(|mut e| {
                e.details = Some((name.clone(), t.ty.group.clone(), t.ty.plural.clone()));
                e
            })?;
            if old.is_none() {
                merged["metadata"]["name"] = json!(name);
            } else if config.pointer("/metadata/resourceVersion").is_none() {
                merged["metadata"]["resourceVersion"] = old
                    .as_ref()
                    .and_then(|o| o.pointer("/metadata/resourceVersion"))
                    .cloned()
                    .unwrap_or(Value::Null);
            }
            merged
        }
        (
            "application/merge-patch+json"
            | "application/strategic-merge-patch+json"
            | "application/json-patch+json",
            _,
        ) => {
            if ct == "application/strategic-merge-patch+json" && t.ty.custom {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
            let old = old
                .clone()
                .ok_or_else(|| ApiError::not_found(&t.ty.plural, &t.ty.group, &name))?;
            let mut doc = (*old).clone();
            if ct == "application/json-patch+json" {
                let p: json_patch::Patch = serde_json::from_slice(&req.body).map_err(|e| {
                    ApiError::bad_request(format!(
                        "the body of the request could not be decoded: {e}"
                    ))
                })?;
                for op in &p.0 {
                    // The real server's JSON patch treats a missing path as equal to null in a
                    // `test` (kube-runtime's finalizer helper adds the first finalizer so).
                    if let json_patch::PatchOperation::Test(test) = op
                        && test.value.is_null()
                        && doc.pointer(test.path.as_str()).is_none()
                    {
                        continue;
                    }
                    json_patch::patch(&mut doc, std::slice::from_ref(op)).map_err(|e| {
                        ApiError::new(
                            422,
                            "Invalid",
                            format!(
                                "the server rejected our request due to an error in our request: {e}"
                            ),
                        )
                    })?;
                }
            } else {
                let p: Value = serde_json::from_slice(&req.body).map_err(|e| {
                    ApiError::bad_request(format!(
                        "the body of the request could not be decoded: {e}"
                    ))
                })?;
                json_patch::merge(&mut doc, &strip_smp_directives(p));
            }
            doc
        }
        (other, _) => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other})"
                ),
            ));
        }
    };
    let (code, obj, warnings) = write(st, &mut inner, &c, old, new)?;
    Ok(Reply::Json(code, obj, warnings))
}

/// Strategic-merge-patch directives (`$patch`, `$retainKeys`, `$setElementOrder/...`) are dropped:
/// the emulator applies strategic merge patches as JSON merge patches.
pub(in crate::api) fn strip_smp_directives(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k, strip_smp_directives(v)))
                .collect(),
        ),
        other => other,
    }
}
