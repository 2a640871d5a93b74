//! Field ownership (`metadata.managedFields`, FieldsV1) and server-side apply merging.
//!
//! A field set is a set of paths; each path element is a FieldsV1 key: `f:<field>`,
//! `k:<json of the list-map keys>`, `v:<json value>` (set lists) or `.` (the list item itself).

use crate::error::{ApiError, Cause};
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// A set of leaf paths.
pub type FieldSet = BTreeSet<Vec<String>>;

/// How a list merges.
#[derive(Debug, Clone, PartialEq)]
pub enum ListKind {
    /// Replaced whole; owned as one field.
    Atomic,
    /// Items merged by these key fields.
    Map(Vec<String>),
    /// Items are unique scalars.
    Set,
}

/// Where list kinds come from: the CRD schema, or a small table for built-in kinds.
#[derive(Clone, Copy)]
pub struct Shape<'a> {
    schema: Option<&'a Value>,
    dotted: &'a str,
}

fn builtin_list(dotted: &str) -> ListKind {
    let keys = |k: &[&str]| ListKind::Map(k.iter().map(|s| s.to_string()).collect());
    match dotted {
        "metadata.finalizers" => ListKind::Set,
        "metadata.ownerReferences" => keys(&["uid"]),
        "status.conditions" => keys(&["type"]),
        "spec.taints" => keys(&["key", "effect"]),
        "status.addresses" => keys(&["type"]),
        "spec.containers"
        | "spec.initContainers"
        | "spec.volumes"
        | "spec.template.spec.containers" => keys(&["name"]),
        _ => ListKind::Atomic,
    }
}

impl<'a> Shape<'a> {
    /// The root of an object of a kind with this schema (None for built-ins).
    pub fn root(schema: Option<&'a Value>) -> Self {
        Shape { schema, dotted: "" }
    }

    fn child(&self, field: &str, dotted: &'a str) -> Shape<'a> {
        let schema = self.schema.and_then(|s| {
            s.get("properties")
                .and_then(|p| p.get(field))
                .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
        });
        Shape {
            schema: if dotted.starts_with("metadata") {
                None
            } else {
                schema
            },
            dotted,
        }
    }

    fn items(&self) -> Shape<'a> {
        Shape {
            schema: self.schema.and_then(|s| s.get("items")),
            dotted: self.dotted,
        }
    }

    fn list_kind(&self) -> ListKind {
        match self.schema {
            Some(s) => match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("map") => ListKind::Map(
                    s.get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(|k| k.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
                Some("set") => ListKind::Set,
                _ => ListKind::Atomic,
            },
            None => builtin_list(self.dotted),
        }
    }

    fn is_atomic_map(&self) -> bool {
        self.schema
            .and_then(|s| s.get("x-kubernetes-map-type"))
            .and_then(Value::as_str)
            == Some("atomic")
            || self
                .schema
                .is_some_and(|s| s.get("x-kubernetes-int-or-string").is_some())
    }
}

fn leak(s: String) -> &'static str {
    // Dotted paths are few and bounded by the schemas; interning keeps Shape copyable.
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static INTERN: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let m = INTERN.get_or_init(Default::default);
    let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = g.get(s.as_str()) {
        return s;
    }
    let l: &'static str = Box::leak(s.into_boxed_str());
    g.insert(l);
    l
}

fn join(dotted: &str, field: &str) -> &'static str {
    leak(if dotted.is_empty() {
        field.to_string()
    } else {
        format!("{dotted}.{field}")
    })
}

fn item_key(item: &Value, keys: &[String]) -> String {
    let mut m = Map::new();
    for k in keys {
        if let Some(v) = item.get(k) {
            m.insert(k.clone(), v.clone());
        }
    }
    format!("k:{}", Value::Object(m))
}

/// The leaf fields an object (or apply configuration) sets. Identity metadata (name, uid, ...)
/// and apiVersion/kind are not tracked, as in kube-apiserver.
pub fn fields_of(obj: &Value, schema: Option<&Value>) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    let root = Shape::root(schema);
    for (k, v) in map {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for mk in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(mv) = v.get(mk) {
                        let sh = root
                            .child("metadata", "metadata")
                            .child(mk, join("metadata", mk));
                        walk(
                            mv,
                            sh,
                            vec!["f:metadata".into(), format!("f:{mk}")],
                            &mut out,
                        );
                    }
                }
            }
            _ => walk(
                v,
                root.child(k, join("", k)),
                vec![format!("f:{k}")],
                &mut out,
            ),
        }
    }
    out
}

fn walk(v: &Value, shape: Shape<'_>, path: Vec<String>, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() && !shape.is_atomic_map() => {
            for (k, child) in m {
                let mut p = path.clone();
                p.push(format!("f:{k}"));
                walk(child, shape.child(k, join(shape.dotted, k)), p, out);
            }
        }
        Value::Array(items) => match shape.list_kind() {
            ListKind::Atomic => {
                out.insert(path);
            }
            ListKind::Set => {
                for it in items {
                    let mut p = path.clone();
                    p.push(format!("v:{it}"));
                    out.insert(p);
                }
            }
            ListKind::Map(keys) => {
                for it in items {
                    let mut p = path.clone();
                    p.push(item_key(it, &keys));
                    let mut dot = p.clone();
                    dot.push(".".into());
                    out.insert(dot);
                    if let Some(m) = it.as_object() {
                        for (k, child) in m {
                            let mut cp = p.clone();
                            cp.push(format!("f:{k}"));
                            walk(
                                child,
                                shape.items().child(k, join(shape.dotted, k)),
                                cp,
                                out,
                            );
                        }
                    }
                }
            }
        },
        _ => {
            out.insert(path);
        }
    }
}

/// The value at a path, if present.
pub fn value_at<'v>(obj: &'v Value, path: &[String]) -> Option<&'v Value> {
    let mut cur = obj;
    for el in path {
        if el == "." {
            continue;
        }
        cur = if let Some(f) = el.strip_prefix("f:") {
            cur.get(f)?
        } else if let Some(k) = el.strip_prefix("k:") {
            let keys: Map<String, Value> = serde_json::from_str(k).ok()?;
            cur.as_array()?
                .iter()
                .find(|it| keys.iter().all(|(kk, kv)| it.get(kk) == Some(kv)))?
        } else if let Some(v) = el.strip_prefix("v:") {
            let want: Value = serde_json::from_str(v).ok()?;
            cur.as_array()?.iter().find(|it| **it == want)?
        } else {
            return None;
        };
    }
    Some(cur)
}

/// Remove the field at a path (a `.` path removes the list item).
pub fn remove_at(obj: &mut Value, path: &[String]) {
    let path: Vec<&String> = path.iter().filter(|e| *e != ".").collect();
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for el in parents {
        let next = if let Some(f) = el.strip_prefix("f:") {
            cur.get_mut(f)
        } else if let Some(k) = el.strip_prefix("k:") {
            let Ok(keys) = serde_json::from_str::<Map<String, Value>>(k) else {
                return;
            };
            cur.as_array_mut().and_then(|a| {
                a.iter_mut()
                    .find(|it| keys.iter().all(|(kk, kv)| it.get(kk) == Some(kv)))
            })
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(k) = last.strip_prefix("k:") {
        if let (Ok(keys), Some(a)) = (
            serde_json::from_str::<Map<String, Value>>(k),
            cur.as_array_mut(),
        ) {
            a.retain(|it| !keys.iter().all(|(kk, kv)| it.get(kk) == Some(kv)));
        }
    } else if let Some(v) = last.strip_prefix("v:")
        && let (Ok(want), Some(a)) = (serde_json::from_str::<Value>(v), cur.as_array_mut())
    {
        a.retain(|it| *it != want);
    }
}

/// FieldsV1 JSON for a field set.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for el in path {
            let entry = cur.entry(el.clone()).or_insert_with(|| json!({}));
            match entry.as_object_mut() {
                Some(m) => cur = m,
                None => break,
            }
        }
    }
    Value::Object(root)
}

/// The field set in a FieldsV1 JSON.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn rec(v: &Value, path: &mut Vec<String>, out: &mut FieldSet) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, child) in m {
                    path.push(k.clone());
                    rec(child, path, out);
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone());
            }
        }
    }
    let mut out = FieldSet::new();
    rec(v, &mut Vec::new(), &mut out);
    out
}

/// A readable path: `.spec.x` / `.status.conditions[type="Ready"].status`.
pub fn render_path(path: &[String]) -> String {
    let mut s = String::new();
    for el in path {
        if let Some(f) = el.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = el.strip_prefix("k:") {
            let keys: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let inner: Vec<String> = keys.iter().map(|(a, b)| format!("{a}={b}")).collect();
            s.push_str(&format!("[{}]", inner.join(",")));
        } else if let Some(v) = el.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        }
    }
    s
}

/// One managedFields entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `status` or empty.
    pub subresource: String,
    /// The apiVersion the fields were written in.
    pub api_version: String,
    /// The time of the last change.
    pub time: String,
    /// Owned fields.
    pub fields: FieldSet,
}

/// Parse `metadata.managedFields`.
pub fn entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| Entry {
                    manager: e
                        .get("manager")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    operation: e
                        .get("operation")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    subresource: e
                        .get("subresource")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    api_version: e
                        .get("apiVersion")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    time: e
                        .get("time")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .into(),
                    fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Write `metadata.managedFields` (entries without fields are dropped).
pub fn set_entries(obj: &mut Value, list: &[Entry]) {
    let arr: Vec<Value> = list
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if arr.is_empty() {
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
    } else {
        obj["metadata"]["managedFields"] = Value::Array(arr);
    }
}

/// Record a non-apply write by `manager`: it owns what it changed; removed fields leave every set.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    schema: Option<&Value>,
    manager: &str,
    subresource: &str,
    api_version: &str,
) {
    let mut list = old.map(entries).unwrap_or_default();
    let new_fields = fields_of(new, schema);
    let changed: FieldSet = new_fields
        .iter()
        .filter(|p| old.is_none_or(|o| value_at(o, p) != value_at(new, p)))
        .cloned()
        .collect();
    for e in &mut list {
        e.fields
            .retain(|p| new_fields.contains(p) && !changed.contains(p));
    }
    if !changed.is_empty() {
        let now = crate::store::now_rfc3339();
        match list.iter_mut().find(|e| {
            e.manager == manager && e.operation == "Update" && e.subresource == subresource
        }) {
            Some(e) => {
                e.fields.extend(changed);
                e.time = now;
                e.api_version = api_version.to_string();
            }
            None => list.push(Entry {
                manager: manager.into(),
                operation: "Update".into(),
                subresource: subresource.into(),
                api_version: api_version.into(),
                time: now,
                fields: changed,
            }),
        }
    }
    set_entries(new, &list);
}

/// Server-side apply of `config` by `manager` onto `current` (None: create). Returns the merged
/// object with its managedFields, or a 409 listing the conflicting fields.
pub fn apply(
    current: Option<&Value>,
    config: &Value,
    schema: Option<&Value>,
    manager: &str,
    subresource: &str,
    force: bool,
    api_version: &str,
) -> Result<Value, ApiError> {
    let applied = fields_of(config, schema);
    let mut list = current.map(entries).unwrap_or_default();
    let mut merged = current.cloned().unwrap_or_else(|| json!({}));
    if let Some(cur) = current {
        let mut conflicts: Vec<(String, Vec<String>)> = Vec::new(); // (who, field)
        for e in &list {
            if e.manager == manager && e.operation == "Apply" {
                continue;
            }
            for p in e.fields.intersection(&applied) {
                if value_at(cur, p) != value_at(config, p) && p.last().is_none_or(|l| l != ".") {
                    conflicts.push((
                        if e.operation == "Apply" {
                            format!("conflict with \"{}\" using {}", e.manager, e.api_version)
                        } else {
                            format!("conflict with \"{}\"", e.manager)
                        },
                        p.clone(),
                    ));
                }
            }
        }
        if !conflicts.is_empty() && !force {
            let n = conflicts.len();
            let causes: Vec<Cause> = conflicts
                .iter()
                .map(|(m, p)| Cause {
                    reason: "FieldManagerConflict".into(),
                    message: m.clone(),
                    field: render_path(p),
                })
                .collect();
            let lines: Vec<String> = conflicts
                .iter()
                .map(|(m, p)| format!("{m}: {}", render_path(p)))
                .collect();
            let plural = if n == 1 { "" } else { "s" };
            let mut err = ApiError::new(
                409,
                "Conflict",
                format!(
                    "Apply failed with {n} conflict{plural}: {}",
                    lines.join("\n")
                ),
            );
            err.causes = causes;
            return Err(err);
        }
        // Forced (or non-conflicting equal values): the others lose the applied fields they differ on.
        for e in &mut list {
            if e.manager == manager && e.operation == "Apply" {
                continue;
            }
            e.fields
                .retain(|p| !applied.contains(p) || value_at(cur, p) == value_at(config, p));
        }
        // Fields this manager applied before and no longer applies, and nobody else owns, go away.
        let others: FieldSet = list
            .iter()
            .filter(|e| !(e.manager == manager && e.operation == "Apply"))
            .flat_map(|e| e.fields.iter().cloned())
            .collect();
        let previous: FieldSet = list
            .iter()
            .filter(|e| {
                e.manager == manager && e.operation == "Apply" && e.subresource == subresource
            })
            .flat_map(|e| e.fields.iter().cloned())
            .collect();
        let mut dropped: Vec<&Vec<String>> = previous
            .iter()
            .filter(|p| !applied.contains(*p) && !others.contains(*p))
            .collect();
        dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in dropped {
            remove_at(&mut merged, p);
        }
    }
    merge_into(&mut merged, config, Shape::root(schema));
    let now = crate::store::now_rfc3339();
    list.retain(|e| {
        !(e.manager == manager && e.operation == "Apply" && e.subresource == subresource)
    });
    list.push(Entry {
        manager: manager.into(),
        operation: "Apply".into(),
        subresource: subresource.into(),
        api_version: api_version.into(),
        time: now,
        fields: applied,
    });
    set_entries(&mut merged, &list);
    Ok(merged)
}

fn merge_into(dst: &mut Value, src: &Value, shape: Shape<'_>) {
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) if !shape.is_atomic_map() => {
            for (k, sv) in s {
                if k == "managedFields" {
                    continue;
                }
                let child = shape.child(k, join(shape.dotted, k));
                if sv.is_null() {
                    d.remove(k);
                    continue;
                }
                match d.get_mut(k) {
                    Some(dv) => merge_into(dv, sv, child),
                    None => {
                        d.insert(k.clone(), sv.clone());
                    }
                }
            }
        }
        (Value::Array(d), Value::Array(s)) => match shape.list_kind() {
            ListKind::Atomic => *d = s.clone(),
            ListKind::Set => {
                for it in s {
                    if !d.contains(it) {
                        d.push(it.clone());
                    }
                }
            }
            ListKind::Map(keys) => {
                for it in s {
                    let k = item_key(it, &keys);
                    match d.iter_mut().find(|x| item_key(x, &keys) == k) {
                        Some(x) => merge_into(x, it, shape.items()),
                        None => d.push(it.clone()),
                    }
                }
            }
        },
        (d, s) => *d = s.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_conflicts_and_force() {
        let cfg_a = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "x", "labels": {"a": "1"}},
                           "spec": {"x": 1, "y": 2}});
        let obj = apply(None, &cfg_a, None, "a", "", false, "v1").unwrap();
        assert_eq!(obj["spec"]["y"], 2);
        let cfg_b = json!({"metadata": {"name": "x"}, "spec": {"x": 5}});
        let err = apply(Some(&obj), &cfg_b, None, "b", "", false, "v1").unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(err.causes[0].field, ".spec.x");
        let same = json!({"metadata": {"name": "x"}, "spec": {"x": 1}});
        assert!(apply(Some(&obj), &same, None, "b", "", false, "v1").is_ok());
        let forced = apply(Some(&obj), &cfg_b, None, "b", "", true, "v1").unwrap();
        assert_eq!(forced["spec"]["x"], 5);
        // a re-applies without y: y is removed since only a owned it.
        let cfg_a2 = json!({"metadata": {"name": "x", "labels": {"a": "1"}}, "spec": {}});
        let after = apply(Some(&forced), &cfg_a2, None, "a", "", false, "v1").unwrap();
        assert_eq!(after["spec"], json!({"x": 5}));
    }

    #[test]
    fn list_map_conditions() {
        let o = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let f = fields_of(&o, None);
        assert!(f.contains(&vec![
            "f:status".into(),
            "f:conditions".into(),
            "k:{\"type\":\"Ready\"}".into(),
            "f:status".into()
        ]));
        assert_eq!(from_fields_v1(&to_fields_v1(&f)), f);
    }
}
