//! Structural-schema handling for custom resources, in the order kube-apiserver applies it:
//! defaulting, pruning of unknown fields, then validation (OpenAPI v3 keywords and CEL
//! `x-kubernetes-validations`, including transition rules against the old object).

use crate::cel_rules;
use crate::error::{Cause, cause};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A schema `pattern`, compiled once per distinct pattern: compiling one on every write was
/// the largest single cost of a plan write (the plan schema has four). `None` for a pattern
/// the regex crate cannot compile, which, as before, is not enforced.
fn compiled_pattern(pattern: &str) -> Option<Arc<regex::Regex>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Arc<regex::Regex>>>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    cache
        .entry(pattern.to_owned())
        .or_insert_with(|| regex::Regex::new(pattern).ok().map(Arc::new))
        .clone()
}

/// Apply `default`s of the schema to absent fields, recursively (like the real server does on
/// every write and read).
pub fn apply_defaults(v: &mut Value, s: &Value) {
    match v {
        Value::Object(map) => {
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (k, ps) in props {
                    let absent = match map.get(k) {
                        None => true,
                        Some(Value::Null) => !is_nullable(ps),
                        Some(_) => false,
                    };
                    if absent && let Some(d) = ps.get("default") {
                        map.insert(k.clone(), d.clone());
                    }
                    if let Some(child) = map.get_mut(k) {
                        apply_defaults(child, ps);
                    }
                }
            }
            if let Some(ap) = s.get("additionalProperties").filter(|a| a.is_object()) {
                for (_, child) in map.iter_mut() {
                    apply_defaults(child, ap);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for child in items {
                    apply_defaults(child, is);
                }
            }
        }
        _ => {}
    }
}

fn is_nullable(s: &Value) -> bool {
    s.get("nullable").and_then(Value::as_bool).unwrap_or(false)
}

fn preserves_unknown(s: &Value) -> bool {
    s.get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Drop fields the schema doesn't know; return their paths (for `fieldValidation`).
pub fn prune_root(obj: &mut Value, s: &Value) -> Vec<String> {
    let mut unknown = Vec::new();
    if let Some(map) = obj.as_object_mut() {
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            let drop: Vec<String> = meta
                .keys()
                .filter(|k| !OBJECT_META_FIELDS.contains(&k.as_str()))
                .cloned()
                .collect();
            for k in drop {
                meta.remove(&k);
                unknown.push(format!("metadata.{k}"));
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        let drop: Vec<String> = map
            .keys()
            .filter(|k| !["apiVersion", "kind", "metadata"].contains(&k.as_str()))
            .filter(|k| !preserves_unknown(s) && !props.is_some_and(|p| p.contains_key(*k)))
            .cloned()
            .collect();
        for k in drop {
            map.remove(&k);
            unknown.push(k);
        }
        if let Some(props) = props {
            for (k, ps) in props {
                if k == "metadata" || k == "apiVersion" || k == "kind" {
                    continue;
                }
                if let Some(child) = map.get_mut(k) {
                    prune(child, ps, k, &mut unknown);
                }
            }
        }
    }
    unknown
}

fn prune(v: &mut Value, s: &Value, path: &str, unknown: &mut Vec<String>) {
    if s.get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        return;
    }
    match v {
        Value::Object(map) => {
            let props = s.get("properties").and_then(Value::as_object);
            let additional = s
                .get("additionalProperties")
                .filter(|a| a.is_object() || a.as_bool() == Some(true));
            if props.is_some() && additional.is_none() && !preserves_unknown(s) {
                let drop: Vec<String> = map
                    .keys()
                    .filter(|k| !props.is_some_and(|p| p.contains_key(*k)))
                    .cloned()
                    .collect();
                for k in drop {
                    map.remove(&k);
                    unknown.push(format!("{path}.{k}"));
                }
            } else if props.is_none()
                && additional.is_none()
                && !preserves_unknown(s)
                && s.get("type").is_some()
            {
                let drop: Vec<String> = map.keys().cloned().collect();
                for k in drop {
                    map.remove(&k);
                    unknown.push(format!("{path}.{k}"));
                }
            }
            for (k, child) in map.iter_mut() {
                let cs = props
                    .and_then(|p| p.get(k))
                    .or(additional.filter(|a| a.is_object()));
                if let Some(cs) = cs {
                    prune(child, cs, &format!("{path}.{k}"), unknown);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for (i, child) in items.iter_mut().enumerate() {
                    prune(child, is, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

/// Validate a whole custom object (`old` for updates: transition rules).
pub fn validate_root(obj: &Value, old: Option<&Value>, s: &Value) -> Vec<Cause> {
    let mut errs = Vec::new();
    let Some(map) = obj.as_object() else {
        errs.push(cause("FieldValueTypeInvalid", "", "must be an object"));
        return errs;
    };
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, ps) in props {
            if k == "metadata" || k == "apiVersion" || k == "kind" {
                continue;
            }
            if let Some(child) = map.get(k) {
                validate(child, old.and_then(|o| o.get(k)), ps, k, &mut errs);
            }
        }
    }
    for r in s
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(k) = r.as_str()
            && !map.contains_key(k)
        {
            errs.push(cause("FieldValueRequired", k, "Required value"));
        }
    }
    cel_rules::check(obj, old, s, "", &mut errs);
    errs
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn short(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

/// Checks `v` at `path` against its structural schema `s` (`old` is the stored value, for
/// CEL's transition rules): null, type, enum, then what its type has, then CEL.
fn validate(v: &Value, old: Option<&Value>, s: &Value, path: &str, errs: &mut Vec<Cause>) {
    if v.is_null() {
        if !is_nullable(s) && s.get("type").is_some() {
            let t = s.get("type").and_then(Value::as_str).unwrap_or_default();
            errs.push(cause(
                "FieldValueTypeInvalid",
                path,
                format!("Invalid value: \"null\": {path} in body must be of type {t}: \"null\""),
            ));
        }
        return;
    }
    let int_or_string = s
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if int_or_string {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            errs.push(cause(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: {}: {path} in body must be of type integer or string",
                    short(v)
                ),
            ));
            return;
        }
    } else if let Some(t) = s.get("type").and_then(Value::as_str) {
        let have = type_name(v);
        let ok = have == t || (t == "number" && have == "integer");
        if !ok {
            errs.push(cause(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: \"{have}\": {path} in body must be of type {t}: \"{have}\""
                ),
            ));
            return;
        }
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(short).collect();
        errs.push(cause(
            "FieldValueNotSupported",
            path,
            format!(
                "Unsupported value: {}: supported values: {}",
                short(v),
                list.join(", ")
            ),
        ));
    }
    match v {
        Value::String(st) => validate_string(v, st, s, path, errs),
        Value::Number(n) => validate_number(n, s, path, errs),
        Value::Array(items) => validate_array(items, old, s, path, errs),
        Value::Object(map) => validate_object(map, old, s, path, errs),
        _ => {}
    }
    cel_rules::check(v, old, s, path, errs);
}

/// `maxLength`, `minLength`, `pattern` and `format: date-time` of a string.
fn validate_string(v: &Value, st: &str, s: &Value, path: &str, errs: &mut Vec<Cause>) {
    let len = st.chars().count() as u64;
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
        && len > max
    {
        errs.push(cause(
            "FieldValueTooLong",
            path,
            format!("Too long: may not be more than {max} bytes"),
        ));
    }
    if let Some(min) = s.get("minLength").and_then(Value::as_u64)
        && len < min
    {
        errs.push(cause(
            "FieldValueInvalid",
            path,
            format!(
                "Invalid value: {}: {path} in body should be at least {min} chars long",
                short(v)
            ),
        ));
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str) {
        match compiled_pattern(p) {
            Some(re) if !re.is_match(st) => errs.push(cause(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {}: {path} in body should match '{p}'",
                    short(v)
                ),
            )),
            _ => {}
        }
    }
    if s.get("format").and_then(Value::as_str) == Some("date-time")
        && chrono::DateTime::parse_from_rfc3339(st).is_err()
    {
        errs.push(cause(
            "FieldValueInvalid",
            path,
            format!(
                "Invalid value: {}: {path} in body must be of type date-time: {}",
                short(v),
                short(v)
            ),
        ));
    }
}

/// `minimum` and `maximum` (exclusive or not) of a number.
fn validate_number(n: &serde_json::Number, s: &Value, path: &str, errs: &mut Vec<Cause>) {
    let x = n.as_f64().unwrap_or_default();
    let excl_min = s
        .get("exclusiveMinimum")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let excl_max = s
        .get("exclusiveMaximum")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if let Some(min) = s.get("minimum").and_then(Value::as_f64)
        && (x < min || (excl_min && x == min))
    {
        let rel = if excl_min {
            "greater than"
        } else {
            "greater than or equal to"
        };
        errs.push(cause(
            "FieldValueInvalid",
            path,
            format!("Invalid value: {n}: {path} in body should be {rel} {min}"),
        ));
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64)
        && (x > max || (excl_max && x == max))
    {
        let rel = if excl_max {
            "less than"
        } else {
            "less than or equal to"
        };
        errs.push(cause(
            "FieldValueInvalid",
            path,
            format!("Invalid value: {n}: {path} in body should be {rel} {max}"),
        ));
    }
}

/// `maxItems`, `minItems`, the list type's uniqueness (map keys, set), then each item
/// (a list-map item against the old item with the same keys, for CEL's transition rules).
fn validate_array(
    items: &[Value],
    old: Option<&Value>,
    s: &Value,
    path: &str,
    errs: &mut Vec<Cause>,
) {
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
        && items.len() as u64 > max
    {
        errs.push(cause(
            "FieldValueTooMany",
            path,
            format!("Too many: {}: must have at most {max} items", items.len()),
        ));
    }
    if let Some(min) = s.get("minItems").and_then(Value::as_u64)
        && (items.len() as u64) < min
    {
        errs.push(cause(
            "FieldValueInvalid",
            path,
            format!(
                "Invalid value: {}: {path} in body should have at least {min} items",
                items.len()
            ),
        ));
    }
    let list_type = s.get("x-kubernetes-list-type").and_then(Value::as_str);
    let keys: Vec<&str> = s
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match list_type {
        Some("map") => {
            let mut seen = Vec::new();
            for (i, it) in items.iter().enumerate() {
                let k: Vec<Option<&Value>> = keys.iter().map(|key| it.get(*key)).collect();
                if seen.contains(&k) {
                    errs.push(cause(
                        "FieldValueDuplicate",
                        &format!("{path}[{i}]"),
                        format!("Duplicate value: {}", key_repr(it, &keys)),
                    ));
                }
                seen.push(k);
            }
        }
        Some("set") => {
            for (i, it) in items.iter().enumerate() {
                if items[..i].contains(it) {
                    errs.push(cause(
                        "FieldValueDuplicate",
                        &format!("{path}[{i}]"),
                        format!("Duplicate value: {}", short(it)),
                    ));
                }
            }
        }
        _ => {}
    }
    if let Some(is) = s.get("items") {
        for (i, it) in items.iter().enumerate() {
            let old_item = match (list_type, old) {
                (Some("map"), Some(Value::Array(olds))) => {
                    olds.iter().find(|o| same_keys(o, it, &keys))
                }
                _ => None,
            };
            validate(it, old_item, is, &format!("{path}[{i}]"), errs);
        }
    }
}

/// Each property and additional property, `required`, `maxProperties`.
fn validate_object(
    map: &serde_json::Map<String, Value>,
    old: Option<&Value>,
    s: &Value,
    path: &str,
    errs: &mut Vec<Cause>,
) {
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, ps) in props {
            if let Some(child) = map.get(k) {
                validate(
                    child,
                    old.and_then(|o| o.get(k)),
                    ps,
                    &format!("{path}.{k}"),
                    errs,
                );
            }
        }
    }
    if let Some(ap) = s.get("additionalProperties").filter(|a| a.is_object()) {
        for (k, child) in map {
            validate(
                child,
                old.and_then(|o| o.get(k)),
                ap,
                &format!("{path}[{k}]"),
                errs,
            );
        }
    }
    for r in s
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(k) = r.as_str()
            && !map.contains_key(k)
        {
            errs.push(cause(
                "FieldValueRequired",
                &format!("{path}.{k}"),
                "Required value",
            ));
        }
    }
    if let Some(max) = s.get("maxProperties").and_then(Value::as_u64)
        && map.len() as u64 > max
    {
        errs.push(cause(
            "FieldValueTooMany",
            path,
            format!("Too many: {}: must have at most {max} items", map.len()),
        ));
    }
}

/// Whether two list-map items have the same key values.
pub fn same_keys(a: &Value, b: &Value, keys: &[&str]) -> bool {
    keys.iter().all(|k| a.get(*k) == b.get(*k))
}

fn key_repr(it: &Value, keys: &[&str]) -> String {
    let mut m = Map::new();
    for k in keys {
        if let Some(v) = it.get(*k) {
            m.insert((*k).to_string(), v.clone());
        }
    }
    Value::Object(m).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
            "mode": {"type": "string", "enum": ["A", "B"], "default": "A"},
            "count": {"type": "integer", "minimum": 1},
            "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                      "items": {"type": "object", "properties": {"k": {"type": "string"}}}}
        }}}})
    }

    #[test]
    fn defaults_prune_validate() {
        let s = schema();
        let mut o = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a", "bogus": 1},
                           "spec": {"name": "abc", "extra": true}, "top": 1});
        apply_defaults(&mut o, &s);
        assert_eq!(o["spec"]["mode"], "A");
        let unknown = prune_root(&mut o, &s);
        assert_eq!(
            unknown,
            vec![
                "metadata.bogus".to_string(),
                "top".into(),
                "spec.extra".into()
            ]
        );
        assert!(validate_root(&o, None, &s).is_empty());
        let bad = json!({"spec": {"name": "ABCDEFG", "mode": "C", "count": 0,
                                  "items": [{"k": "a"}, {"k": "a"}]}});
        let errs = validate_root(&bad, None, &s);
        let fields: Vec<&str> = errs.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            vec![
                "spec.count",
                "spec.items[1]",
                "spec.mode",
                "spec.name",
                "spec.name"
            ]
        );
        let missing = validate_root(&json!({"spec": {}}), None, &s);
        assert_eq!(missing[0].field, "spec.name");
    }
}
