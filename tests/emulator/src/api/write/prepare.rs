//! The write's preparation: what the server carries over into an update, sets on a new
//! object, and stamps on both.

use super::*;

/// An update: the request must name the stored resourceVersion (a custom resource's update
/// must name one at all); a status write changes only the status, a main-resource write
/// keeps the stored status; the server's own metadata stays; no finalizer may be added to an
/// object being deleted.
pub(super) fn carry_over(
    c: &WriteCtx<'_>,
    old: &Value,
    new: &mut Value,
    name: &str,
) -> Result<(), ApiError> {
    let ty = &c.t.ty;
    let sub = c.t.sub();
    // Optimistic concurrency.
    match new
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
    {
        Some(rv)
            if !rv.is_empty()
                && Some(rv)
                    != old
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str) =>
        {
            return Err(ApiError::conflict(
                &ty.plural,
                &ty.group,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        Some(rv) if !rv.is_empty() => {}
        _ if ty.custom && c.verb == "update" => {
            return Err(ApiError::invalid(
                &ty.kind,
                &ty.group,
                name,
                vec![cause(
                    "FieldValueInvalid",
                    "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update",
                )],
            ));
        }
        _ => {}
    }
    if sub == "status" {
        let status = new.get("status").cloned();
        let managed = new.pointer("/metadata/managedFields").cloned();
        *new = old.clone();
        match status {
            Some(s) => new["status"] = s,
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        match managed {
            Some(m) => new["metadata"]["managedFields"] = m,
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove("managedFields");
                }
            }
        }
    } else if ty.status_subresource {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old["metadata"].get(f) {
            Some(v) => new["metadata"][f] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(f);
                }
            }
        }
    }
    if old.pointer("/metadata/deletionTimestamp").is_some() {
        let old_f = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let new_f = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let added: Vec<&Value> = new_f.iter().filter(|f| !old_f.contains(f)).collect();
        if !added.is_empty() {
            // kube-apiserver's object-meta validation: 422 Invalid, not 403.
            return Err(ApiError::invalid(
                &ty.kind,
                &ty.group,
                name,
                vec![cause(
                    "FieldValueForbidden",
                    "metadata.finalizers",
                    format!(
                        "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                )],
            ));
        }
    }
    Ok(())
}

/// A create: the namespace must exist and no resourceVersion be given; the server sets the
/// uid, creation time and first generation, and the status a new object of its type starts with.
pub(super) fn initialize(
    inner: &Inner,
    t: &Target,
    new: &mut Value,
    name: &str,
) -> Result<(), ApiError> {
    let ty = &t.ty;
    let ns = t.ns();
    if ty.namespaced {
        let exists = inner
            .tables
            .get(&(String::new(), "namespaces".into()))
            .is_some_and(|tb| tb.objects.contains_key(&(String::new(), ns.clone())));
        if !exists {
            return Err(ApiError::not_found("namespaces", "", &ns));
        }
    }
    if new
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return Err(ApiError::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    if let Some(m) = new["metadata"].as_object_mut() {
        for f in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "uid",
            "creationTimestamp",
        ] {
            m.remove(f);
        }
    }
    new["metadata"]["uid"] = json!(uuid());
    new["metadata"]["creationTimestamp"] = json!(now_rfc3339());
    if ty.has_generation {
        new["metadata"]["generation"] = json!(1);
    }
    if ty.status_subresource
        && ty.plural != "nodes"
        && ty.plural != "namespaces"
        && let Some(m) = new.as_object_mut()
    {
        m.remove("status");
    }
    if ty.group.is_empty() && ty.plural == "pods" {
        new["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
    }
    if ty.plural == "namespaces" {
        new["status"] = json!({"phase": "Active"});
        new["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
    }
    Ok(())
}

/// The server's marks on what is stored: the generation (bumped when anything but metadata
/// and status changed) and the field manager's ownership.
pub(super) fn stamp(c: &WriteCtx<'_>, old: Option<&Value>, new: &mut Value) {
    let ty = &c.t.ty;
    let sub = c.t.sub();
    if ty.has_generation
        && let Some(old) = &old
    {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let bump = !same_generation_fields(old, new);
        new["metadata"]["generation"] = json!(if bump { g + 1 } else { g });
    }
    // Field ownership.
    if !c.applied {
        managed::record_update(
            old,
            new,
            ty.schema.as_ref(),
            &c.manager,
            sub,
            &ty.api_version(),
        );
    }
}
