//! The write's store-and-notify stage.

use super::*;

/// The write's last stage: a no-op or a dry run stores nothing; an object being deleted
/// whose last finalizer went is removed (and its dependents collected); anything else is
/// stored, watchers are notified, and a CRD's type is served from now on.
pub(super) fn store(
    st: &Arc<State>,
    inner: &mut Inner,
    c: &WriteCtx<'_>,
    old: Option<Arc<Value>>,
    new: Value,
    name: &str,
    warnings: Vec<String>,
) -> Result<(u16, Value, Vec<String>), ApiError> {
    let t = c.t;
    let ty = &t.ty;
    let ns = t.ns();
    // A no-op write does not change the resourceVersion (as in kube-apiserver).
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
    let key = (ns.clone(), name.to_owned());
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
    mirror_event(inner, ty, Some(&stored), &ns, name);
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
