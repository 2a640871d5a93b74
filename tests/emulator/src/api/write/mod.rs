//! Writing: create, update, patch and server-side apply, through admission (schema, CEL,
//! NodeRestriction, ValidatingAdmissionPolicy) into the store.
//!
//! A write runs in stages, one file each: [`decode`] the request → the object's
//! [`identity`] → [`prepare`] (what an update carries over, what a create sets) → [`validate`]
//! (schema, built-in rules) → [`prepare::stamp`] (generation, field ownership) →
//! [`validate::admit`] → [`store`] and notify watchers. [`patch`] turns a patch into the
//! object to write; [`compare`] says what a write changes.

use super::*;

mod compare;
mod decode;
mod identity;
mod patch;
mod prepare;
mod store;
mod validate;

pub(super) use compare::*;
pub(super) use decode::*;
pub(super) use patch::*;

/// The common write path, through every stage.
pub(super) fn write(
    st: &Arc<State>,
    inner: &mut Inner,
    c: &WriteCtx<'_>,
    old: Option<Arc<Value>>,
    mut new: Value,
) -> Result<(u16, Value, Vec<String>), ApiError> {
    let name = identity::settle(c.t, &mut new)?;
    match &old {
        Some(old) => prepare::carry_over(c, old, &mut new, &name)?,
        None => prepare::initialize(inner, c.t, &mut new, &name)?,
    }
    let mut warnings = Vec::new();
    validate::check(c, old.as_deref(), &mut new, &name, &mut warnings)?;
    prepare::stamp(c, old.as_deref(), &mut new);
    validate::admit(inner, c, old.as_deref(), &mut new, &name)?;
    store::store(st, inner, c, old, new, &name, warnings)
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
