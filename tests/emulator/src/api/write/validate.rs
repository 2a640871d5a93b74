//! The write's validation and admission stage.

use super::*;

/// The structural schema of a custom resource (defaults, pruning with the request's field
/// validation, validation and CEL), then the built-in types' own rules.
pub(in crate::api) fn check(
    c: &WriteCtx<'_>,
    old: Option<&Value>,
    new: &mut Value,
    name: &str,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    let ty = &c.t.ty;
    if let Some(s) = ty.schema.as_ref().filter(|_| ty.custom) {
        schema::apply_defaults(new, s);
        let unknown = schema::prune_root(new, s);
        if !unknown.is_empty() {
            match c.field_validation.as_str() {
                "Strict" => {
                    let list: Vec<String> = unknown
                        .iter()
                        .map(|u| format!("unknown field \"{u}\""))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        list.join(", ")
                    )));
                }
                "Ignore" => {}
                _ => warnings.extend(unknown.iter().map(|u| format!("unknown field \"{u}\""))),
            }
        }
        let errs = schema::validate_root(new, old, s);
        if !errs.is_empty() {
            return Err(ApiError::invalid(&ty.kind, &ty.group, name, errs));
        }
    }
    builtin_validation(ty, name, new)?;
    Ok(())
}

/// Admission: NodeRestriction and the ValidatingAdmissionPolicies; a CRD gets its status
/// and its own checks.
pub(in crate::api) fn admit(
    inner: &Inner,
    c: &WriteCtx<'_>,
    old: Option<&Value>,
    new: &mut Value,
    name: &str,
) -> Result<(), ApiError> {
    let ty = &c.t.ty;
    let ns = c.t.ns();
    let sub = c.t.sub();
    let attrs = Attributes {
        verb: c.verb,
        group: &ty.group,
        resource: &ty.plural,
        subresource: sub,
        namespace: &ns,
        name,
    };
    node_restriction(c.user, &attrs, Some(new), old)?;
    let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
    validating_policies(inner, c.user, &attrs, operation, Some(new), old)?;
    if ty.plural == "customresourcedefinitions" {
        crd_status(new);
        crd_check(new, name)?;
    }
    Ok(())
}

fn builtin_validation(ty: &ResourceType, name: &str, obj: &Value) -> Result<(), ApiError> {
    if ty.group == "policy" && ty.plural == "poddisruptionbudgets" {
        let spec = obj.get("spec");
        let min = spec.and_then(|s| s.get("minAvailable")).is_some();
        let max = spec.and_then(|s| s.get("maxUnavailable")).is_some();
        if min && max {
            return Err(ApiError::invalid(
                &ty.kind,
                &ty.group,
                name,
                vec![cause(
                    "FieldValueInvalid",
                    "spec",
                    "Invalid value: \"object\": minAvailable and maxUnavailable cannot be both set",
                )],
            ));
        }
    }
    if ty.plural == "leases" || ty.plural == "secrets" || ty.plural == "configmaps" {
        return Ok(());
    }
    if ty.group == "rbac.authorization.k8s.io"
        && ty.plural.ends_with("bindings")
        && obj.get("roleRef").is_none()
    {
        return Err(ApiError::invalid(
            &ty.kind,
            &ty.group,
            name,
            vec![cause("FieldValueRequired", "roleRef", "Required value")],
        ));
    }
    Ok(())
}

fn crd_status(crd: &mut Value) {
    let now = now_rfc3339();
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    crd["status"] = json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ]
    });
}

fn crd_check(crd: &Value, name: &str) -> Result<(), ApiError> {
    let group = crd
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let plural = crd
        .pointer("/spec/names/plural")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut errs = Vec::new();
    if name != format!("{plural}.{group}") {
        errs.push(cause(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    if ResourceType::from_crd(crd).is_none() {
        errs.push(cause(
            "FieldValueRequired",
            "spec.versions",
            "Required value: must have exactly one version marked as storage version",
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "CustomResourceDefinition",
            "apiextensions.k8s.io",
            name,
            errs,
        ))
    }
}
