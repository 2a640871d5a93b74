//! Writing: create, update, patch and server-side apply, through admission (schema, CEL,
//! NodeRestriction, ValidatingAdmissionPolicy) into the store.

use super::*;

pub(super) fn parse_body(req: &Request) -> Result<Value, ApiError> {
    let ct = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    if ct.contains("protobuf") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct})"
            ),
        ));
    }
    let v: Value = if ct.ends_with("yaml") {
        serde_yaml::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
        })?
    };
    Ok(v)
}

/// How one write is made.
pub(super) struct WriteCtx<'a> {
    pub(super) t: &'a Target,
    pub(super) user: &'a User,
    pub(super) verb: &'a str,
    pub(super) manager: String,
    pub(super) field_validation: String,
    pub(super) dry_run: bool,
    pub(super) applied: bool,
}

pub(super) fn default_manager(req: &Request, verb: &str) -> String {
    if let Some(m) = req.query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    let ua = req
        .user_agent
        .split('/')
        .next()
        .unwrap_or("unknown")
        .to_string();
    if ua.is_empty() {
        format!("unknown-{verb}")
    } else {
        ua
    }
}

pub(super) fn ctx<'a>(t: &'a Target, req: &'a Request, verb: &'a str) -> WriteCtx<'a> {
    WriteCtx {
        t,
        user: &req.user,
        verb,
        manager: default_manager(req, verb),
        field_validation: req
            .query
            .get("fieldValidation")
            .cloned()
            .unwrap_or_else(|| "Warn".into()),
        dry_run: req.query.get("dryRun").is_some_and(|d| d == "All"),
        applied: false,
    }
}

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

/// Whether two values are equal apart from the keys in `skip` (when both are objects).
/// Compares in place: cloning whole objects to strip keys cost two deep copies per write.
pub(super) fn equal_except(a: &Value, b: &Value, skip: &[&str]) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let kept = |m: &serde_json::Map<String, Value>| {
        m.keys().filter(|k| !skip.contains(&k.as_str())).count()
    };
    kept(a) == kept(b)
        && a.iter()
            .filter(|(k, _)| !skip.contains(&k.as_str()))
            .all(|(k, v)| b.get(k) == Some(v))
}

/// Whether a write changes what bumps `metadata.generation` (all but metadata and status).
pub(super) fn same_generation_fields(a: &Value, b: &Value) -> bool {
    equal_except(a, b, &["metadata", "status"])
}

/// Whether two states of an object differ only in what changes on every write (the
/// resourceVersion, the times of managedFields entries): such a write is a no-op.
pub(super) fn same_but_volatile(a: &Value, b: &Value) -> bool {
    if !equal_except(a, b, &["metadata"]) {
        return false;
    }
    let (Some(am), Some(bm)) = (a.get("metadata"), b.get("metadata")) else {
        return a.get("metadata") == b.get("metadata");
    };
    if !equal_except(am, bm, &["resourceVersion", "managedFields"]) {
        return false;
    }
    match (am.get("managedFields"), bm.get("managedFields")) {
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            x.len() == y.len() && x.iter().zip(y).all(|(e, f)| equal_except(e, f, &["time"]))
        }
        (x, y) => x == y,
    }
}

/// The common write path: preserve system metadata, schema (defaults, pruning, validation,
/// CEL), generation, managed fields, admission, finalizers, then store.
pub(super) fn write(
    st: &Arc<State>,
    inner: &mut Inner,
    c: &WriteCtx<'_>,
    old: Option<Arc<Value>>,
    mut new: Value,
) -> Result<(u16, Value, Vec<String>), ApiError> {
    let t = c.t;
    let ty = &t.ty;
    let ns = t.ns();
    let mut warnings = Vec::new();
    if !new.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    // Type and identity checks.
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
    if ty.namespaced && old.is_none() {
        let exists = inner
            .tables
            .get(&(String::new(), "namespaces".into()))
            .is_some_and(|tb| tb.objects.contains_key(&(String::new(), ns.clone())));
        if !exists {
            return Err(ApiError::not_found("namespaces", "", &ns));
        }
    }
    let sub = t.sub().to_string();
    match &old {
        Some(old) => {
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
                        &name,
                        "the object has been modified; please apply your changes to the latest version and try again",
                    ));
                }
                Some(rv) if !rv.is_empty() => {}
                _ if ty.custom && c.verb == "update" => {
                    return Err(ApiError::invalid(
                        &ty.kind,
                        &ty.group,
                        &name,
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
                new = (**old).clone();
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
                        &name,
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
        }
        None => {
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
        }
    }
    // Structural schema: defaults, pruning, validation, CEL.
    if let Some(s) = ty.schema.as_ref().filter(|_| ty.custom) {
        schema::apply_defaults(&mut new, s);
        let unknown = schema::prune_root(&mut new, s);
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
        let errs = schema::validate_root(&new, old.as_deref(), s);
        if !errs.is_empty() {
            return Err(ApiError::invalid(&ty.kind, &ty.group, &name, errs));
        }
    }
    builtin_validation(ty, &name, &new)?;
    // Generation.
    if ty.has_generation
        && let Some(old) = &old
    {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let bump = !same_generation_fields(old, &new);
        new["metadata"]["generation"] = json!(if bump { g + 1 } else { g });
    }
    // Field ownership.
    if !c.applied {
        managed::record_update(
            old.as_deref(),
            &mut new,
            ty.schema.as_ref(),
            &c.manager,
            &sub,
            &ty.api_version(),
        );
    }
    // Admission.
    let attrs = Attributes {
        verb: c.verb,
        group: &ty.group,
        resource: &ty.plural,
        subresource: &sub,
        namespace: &ns,
        name: &name,
    };
    node_restriction(c.user, &attrs, Some(&new), old.as_deref())?;
    let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
    validating_policies(inner, c.user, &attrs, operation, Some(&new), old.as_deref())?;
    if ty.plural == "customresourcedefinitions" {
        crd_status(&mut new);
        crd_check(&new, &name)?;
    }
    // No-op writes don't change the resourceVersion (as in kube-apiserver).
    if let Some(old) = &old
        && same_but_volatile(old, &new)
    {
        return Ok((200, out(old, t), warnings));
    }
    if c.dry_run {
        return Ok((
            if old.is_some() { 200 } else { 201 },
            out(&new, t),
            warnings,
        ));
    }
    let key = (ns.clone(), name.clone());
    let res = t.res_key();
    let finalizers_done = new
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if new.pointer("/metadata/deletionTimestamp").is_some() && finalizers_done {
        inner.put(&res, key.clone(), new);
        let gone = inner.remove(&res, &key);
        after_removal(st, inner, ty, gone.as_deref(), "Background");
        return Ok((
            200,
            out(&gone.map(|g| (*g).clone()).unwrap_or_default(), t),
            warnings,
        ));
    }
    let stored = inner.put(&res, key, new);
    mirror_event(inner, ty, Some(&stored), &ns, &name);
    if ty.plural == "customresourcedefinitions"
        && let Some(rt) = ResourceType::from_crd(&stored)
    {
        inner.register(rt);
    }
    Ok((
        if old.is_some() { 200 } else { 201 },
        out(&stored, t),
        warnings,
    ))
}

pub(super) fn builtin_validation(
    ty: &ResourceType,
    name: &str,
    obj: &Value,
) -> Result<(), ApiError> {
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

pub(super) fn crd_status(crd: &mut Value) {
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

pub(super) fn crd_check(crd: &Value, name: &str) -> Result<(), ApiError> {
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

pub(super) fn create(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let body = parse_body(req)?;
    let c = ctx(t, req, "create");
    let mut inner = st.store.lock();
    let name = body
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if !name.is_empty()
        && inner
            .tables
            .get(&t.res_key())
            .is_some_and(|tb| tb.objects.contains_key(&(t.ns(), name.clone())))
    {
        return Err(ApiError::already_exists(&t.ty.plural, &t.ty.group, &name));
    }
    let (code, obj, warnings) = write(st, &mut inner, &c, None, body)?;
    Ok(Reply::Json(code, obj, warnings))
}

pub(super) fn current(inner: &Inner, t: &Target) -> Option<Arc<Value>> {
    inner
        .tables
        .get(&t.res_key())
        .and_then(|tb| tb.objects.get(&(t.ns(), t.name())))
        .cloned()
}

pub(super) fn update(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let body = parse_body(req)?;
    let c = ctx(t, req, "update");
    let mut inner = st.store.lock();
    let old = current(&inner, t)
        .ok_or_else(|| ApiError::not_found(&t.ty.plural, &t.ty.group, &t.name()))?;
    let (code, obj, warnings) = write(st, &mut inner, &c, Some(old), body)?;
    Ok(Reply::Json(code, obj, warnings))
}

pub(super) fn patch(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
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
pub(super) fn strip_smp_directives(v: Value) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_a_no_op_only_when_nothing_but_volatile_fields_change() {
        let old = json!({
            "metadata": {"name": "a", "resourceVersion": "7",
                         "managedFields": [{"manager": "m", "time": "2026-01-01T00:00:00Z"}]},
            "spec": {"x": 1},
        });
        let mut new = old.clone();
        new["metadata"]["resourceVersion"] = json!("8");
        new["metadata"]["managedFields"][0]["time"] = json!("2026-01-02T00:00:00Z");
        assert!(same_but_volatile(&old, &new));
        new["metadata"]["managedFields"][0]["manager"] = json!("other");
        assert!(!same_but_volatile(&old, &new));
        let mut labelled = old.clone();
        labelled["metadata"]["labels"] = json!({"k": "v"});
        assert!(!same_but_volatile(&old, &labelled));
        assert!(!same_but_volatile(&old, &json!({"spec": {"x": 1}})));
    }

    #[test]
    fn generation_follows_everything_but_metadata_and_status() {
        let old = json!({"metadata": {"name": "a"}, "spec": {"x": 1}, "status": {"p": 1}});
        let mut new = old.clone();
        new["metadata"]["labels"] = json!({"k": "v"});
        new["status"] = json!({"p": 2});
        assert!(same_generation_fields(&old, &new));
        new["spec"]["x"] = json!(2);
        assert!(!same_generation_fields(&old, &new));
        let mut extra = old.clone();
        extra["data"] = json!({});
        assert!(!same_generation_fields(&old, &extra));
    }
}
