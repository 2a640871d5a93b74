//! Deleting: one object (finalizers, grace, preconditions), a collection, and the garbage
//! collector for owner references (orphan, background, foreground).

use super::*;

pub(super) fn delete_options(req: &Request) -> Value {
    let mut opts: Value = if req.body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&req.body).unwrap_or(json!({}))
    };
    if let Some(p) = req.query.get("propagationPolicy") {
        opts["propagationPolicy"] = json!(p);
    }
    opts
}

pub(super) fn delete(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let opts = delete_options(req);
    let mut inner = st.store.lock();
    let (code, obj) = delete_one(
        st,
        &mut inner,
        t,
        &req.user,
        &opts,
        is_true_str(req.query.get("dryRun"), "All"),
    )?;
    Ok(Reply::Json(code, obj, Vec::new()))
}

pub(super) fn is_true_str(v: Option<&String>, want: &str) -> bool {
    v.is_some_and(|x| x == want)
}

pub(super) fn delete_one(
    st: &Arc<State>,
    inner: &mut Inner,
    t: &Target,
    user: &User,
    opts: &Value,
    dry_run: bool,
) -> Result<(u16, Value), ApiError> {
    let name = t.name();
    let ty = t.ty.clone();
    let old = current(inner, t).ok_or_else(|| ApiError::not_found(&ty.plural, &ty.group, &name))?;
    if let Some(uid) = opts.pointer("/preconditions/uid").and_then(Value::as_str)
        && old.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid)
    {
        return Err(ApiError::conflict(
            &ty.plural,
            &ty.group,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old.pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            ),
        ));
    }
    if let Some(rv) = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            != Some(rv)
    {
        return Err(ApiError::conflict(
            &ty.plural,
            &ty.group,
            &name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                old.pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            ),
        ));
    }
    let ns = t.ns();
    let attrs = Attributes {
        verb: "delete",
        group: &ty.group,
        resource: &ty.plural,
        subresource: "",
        namespace: &ns,
        name: &name,
    };
    node_restriction(user, &attrs, None, Some(&old))?;
    validating_policies(inner, user, &attrs, "DELETE", None, Some(&old))?;
    if dry_run {
        return Ok((200, out(&old, t)));
    }
    let policy = opts
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .unwrap_or("Background")
        .to_string();
    let res = t.res_key();
    let key = (ns.clone(), name.clone());
    let mut finalizers: Vec<Value> = old
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if policy == "Foreground" && !finalizers.contains(&json!("foregroundDeletion")) {
        finalizers.push(json!("foregroundDeletion"));
    }
    if policy == "Orphan" && !finalizers.contains(&json!("orphan")) && ty.plural != "namespaces" {
        // Orphaning is done right away rather than by a finalizer.
        orphan_dependents(
            inner,
            old.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
    }
    if !finalizers.is_empty() && ty.plural != "namespaces" {
        let mut marked = (*old).clone();
        if marked.pointer("/metadata/deletionTimestamp").is_none() {
            marked["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        }
        marked["metadata"]["finalizers"] = Value::Array(finalizers);
        if same_but_volatile(&marked, &old) {
            return Ok((200, out(&old, t)));
        }
        let stored = inner.put(&res, key, marked);
        if policy == "Foreground" {
            spawn_gc(
                st,
                old.pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                "Foreground".into(),
            );
        }
        return Ok((200, out(&stored, t)));
    }
    if ty.plural == "namespaces" {
        // Contents go first, then the namespace itself (no Terminating phase is kept).
        let keys: Vec<(ResKey, ObjKey)> = inner
            .tables
            .iter()
            .filter(|(k, _)| inner.types.get(*k).is_some_and(|t| t.namespaced))
            .flat_map(|(k, tb)| {
                tb.objects
                    .keys()
                    .filter(|o| o.0 == name)
                    .map(move |o| (k.clone(), o.clone()))
            })
            .collect();
        for (r, o) in keys {
            let gone = inner.remove(&r, &o);
            let rt = inner.types.get(&r).cloned();
            if let Some(rt) = rt {
                after_removal(st, inner, &rt, gone.as_deref(), "Background");
            }
        }
    }
    let gone = inner
        .remove(&res, &key)
        .ok_or_else(|| ApiError::not_found(&ty.plural, &ty.group, &name))?;
    after_removal(st, inner, &ty, Some(&gone), &policy);
    Ok((200, out(&gone, t)))
}

/// Side effects of an object being removed: CRDs stop being served, dependents are collected.
pub(super) fn after_removal(
    st: &Arc<State>,
    inner: &mut Inner,
    ty: &ResourceType,
    gone: Option<&Value>,
    policy: &str,
) {
    let Some(gone) = gone else { return };
    if ty.plural == "events" {
        let ns = gone
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = gone
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        mirror_event(inner, ty, None, &ns, &name);
    }
    if ty.plural == "customresourcedefinitions"
        && let Some(rt) = ResourceType::from_crd(gone)
    {
        inner.unregister(&rt.group, &rt.plural);
    }
    if policy != "Orphan"
        && let Some(uid) = gone.pointer("/metadata/uid").and_then(Value::as_str)
    {
        spawn_gc(st, uid.to_string(), policy.to_string());
    }
}

pub(super) fn orphan_dependents(inner: &mut Inner, uid: &str) {
    for (res, key, obj) in dependents(inner, uid) {
        let mut o = (*obj).clone();
        if let Some(refs) = o
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        {
            refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
        }
        inner.put(&res, key, o);
    }
}

pub(super) fn dependents(inner: &Inner, uid: &str) -> Vec<(ResKey, ObjKey, Arc<Value>)> {
    inner
        .owned_by(uid)
        .into_iter()
        .filter_map(|(res, key)| {
            let obj = inner.tables.get(&res)?.objects.get(&key)?.clone();
            Some((res, key, obj))
        })
        .collect()
}

pub(super) fn uid_exists(inner: &Inner, uid: &str) -> bool {
    inner.locate_uid(uid).is_some()
}

/// The garbage collector: runs after the response, like kube-controller-manager's.
pub(super) fn spawn_gc(st: &Arc<State>, uid: String, policy: String) {
    let st = st.clone();
    tokio::spawn(async move {
        tokio::task::yield_now().await;
        collect(&st, &uid, &policy);
    });
}

pub(super) fn collect(st: &Arc<State>, uid: &str, policy: &str) {
    let mut inner = st.store.lock();
    let mut queue = vec![uid.to_string()];
    while let Some(owner) = queue.pop() {
        for (res, key, obj) in dependents(&inner, &owner) {
            let refs: Vec<Value> = obj
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let others_alive = refs
                .iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
                .any(|u| u != owner && uid_exists(&inner, u));
            if others_alive {
                let mut o = (*obj).clone();
                if let Some(refs) = o
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner.as_str()));
                }
                inner.put(&res, key, o);
                continue;
            }
            let finalizers = obj
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty());
            if finalizers {
                if obj.pointer("/metadata/deletionTimestamp").is_none() {
                    let mut o = (*obj).clone();
                    o["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                    inner.put(&res, key, o);
                }
                continue;
            }
            if let Some(gone) = inner.remove(&res, &key) {
                if res.1 == "customresourcedefinitions"
                    && let Some(rt) = ResourceType::from_crd(&gone)
                {
                    inner.unregister(&rt.group, &rt.plural);
                }
                if let Some(u) = gone.pointer("/metadata/uid").and_then(Value::as_str) {
                    queue.push(u.to_string());
                }
            }
        }
    }
    if policy == "Foreground" {
        // The owner waits for its dependents, then loses the foregroundDeletion finalizer.
        let found = inner.locate_uid(uid).and_then(|(res, key)| {
            let obj = inner.tables.get(&res)?.objects.get(&key)?.clone();
            Some((res, key, obj))
        });
        if let Some((res, key, obj)) = found {
            let mut o = (*obj).clone();
            if let Some(f) = o
                .pointer_mut("/metadata/finalizers")
                .and_then(Value::as_array_mut)
            {
                f.retain(|x| x != "foregroundDeletion");
            }
            let done = o
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
            inner.put(&res, key.clone(), o);
            if done {
                inner.remove(&res, &key);
            }
        }
    }
}

pub(super) fn delete_collection(
    st: &Arc<State>,
    t: &Target,
    req: &Request,
) -> Result<Reply, ApiError> {
    let filter = filter_for(t, req)?;
    let opts = delete_options(req);
    let mut inner = st.store.lock();
    let names: Vec<ObjKey> = inner
        .tables
        .get(&t.res_key())
        .map(|tb| {
            tb.objects
                .iter()
                .filter(|(_, o)| filter.matches(o))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    let mut items = Vec::new();
    for (ns, name) in names {
        let one = Target {
            ty: t.ty.clone(),
            version: t.version.clone(),
            namespace: Some(ns),
            name: Some(name),
            sub: None,
        };
        let (_, obj) = delete_one(st, &mut inner, &one, &req.user, &opts, false)?;
        items.push(obj);
    }
    let rv = inner.rv.to_string();
    Ok(Reply::Json(
        200,
        json!({"kind": format!("{}List", t.ty.kind), "apiVersion": t.api_version(), "metadata": {"resourceVersion": rv}, "items": items}),
        Vec::new(),
    ))
}
