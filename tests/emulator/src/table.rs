//! `meta.k8s.io/v1` Table responses (what `kubectl get` asks for), with printer-column
//! JSONPath evaluation (`.a.b`, `[0]`, `[*]`, `[?(@.type=="Ready")]`).

use crate::registry::ResourceType;
use serde_json::{Value, json};

/// Evaluate a (kubectl-style) JSONPath and return every match.
pub fn jsonpath<'v>(obj: &'v Value, path: &str) -> Vec<&'v Value> {
    let path = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    let mut cur: Vec<&Value> = vec![obj];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            rest = &r[end..];
            if field.is_empty() {
                continue;
            }
            cur = cur.into_iter().filter_map(|v| v.get(field)).collect();
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = find_close(r) else {
                return Vec::new();
            };
            let inner = &r[..end];
            rest = &r[end + 1..];
            if inner == "*" {
                cur = cur
                    .into_iter()
                    .flat_map(|v| match v {
                        Value::Array(a) => a.iter().collect::<Vec<_>>(),
                        Value::Object(m) => m.values().collect(),
                        _ => Vec::new(),
                    })
                    .collect();
            } else if let Some(filter) = inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')'))
            {
                cur = cur
                    .into_iter()
                    .filter_map(Value::as_array)
                    .flat_map(|a| a.iter().filter(|it| filter_matches(it, filter)))
                    .collect();
            } else if let Ok(i) = inner.parse::<i64>() {
                cur = cur
                    .into_iter()
                    .filter_map(|v| {
                        let a = v.as_array()?;
                        let idx = if i < 0 { a.len() as i64 + i } else { i };
                        a.get(usize::try_from(idx).ok()?)
                    })
                    .collect();
            } else {
                let key = inner.trim_matches(|c| c == '\'' || c == '"');
                cur = cur.into_iter().filter_map(|v| v.get(key)).collect();
            }
        } else {
            return Vec::new();
        }
    }
    cur
}

fn find_close(s: &str) -> Option<usize> {
    let mut depth = 0;
    let mut quote = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[' | '(') => depth += 1,
            (None, ')') => depth -= 1,
            (None, ']') if depth == 0 => return Some(i),
            (None, ']') => depth -= 1,
            _ => {}
        }
    }
    None
}

fn filter_matches(item: &Value, filter: &str) -> bool {
    let (lhs, op, rhs) = if let Some((l, r)) = filter.split_once("==") {
        (l, "==", r)
    } else if let Some((l, r)) = filter.split_once("!=") {
        (l, "!=", r)
    } else {
        let l = filter.trim();
        return l
            .strip_prefix('@')
            .is_some_and(|p| !jsonpath(item, p).is_empty());
    };
    let Some(p) = lhs.trim().strip_prefix('@') else {
        return false;
    };
    let want = rhs.trim().trim_matches(|c| c == '"' || c == '\'');
    let have = jsonpath(item, p).first().map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    match op {
        "==" => have.as_deref() == Some(want),
        _ => have.as_deref() != Some(want),
    }
}

fn column(name: &str, ty: &str, format: &str, description: &str, priority: i64) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
}

/// The column definitions for a type.
pub fn columns(t: &ResourceType) -> Vec<Value> {
    if t.plural == "events" && t.group.is_empty() {
        return vec![
            column(
                "Last Seen",
                "string",
                "",
                "Time since the most recent occurrence",
                0,
            ),
            column("Type", "string", "", "Type of this event", 0),
            column("Reason", "string", "", "Why the action was taken", 0),
            column("Object", "string", "", "The object this event is about", 0),
            column("Message", "string", "", "A human-readable description", 0),
            column(
                "Name",
                "string",
                "name",
                "Name must be unique within a namespace.",
                1,
            ),
        ];
    }
    let mut cols = vec![column(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace.",
        0,
    )];
    if t.custom {
        if t.printer_columns.is_empty() {
            cols.push(column("Age", "date", "", "CreationTimestamp", 0));
        }
        for c in &t.printer_columns {
            cols.push(column(
                c.get("name").and_then(Value::as_str).unwrap_or_default(),
                c.get("type").and_then(Value::as_str).unwrap_or("string"),
                c.get("format").and_then(Value::as_str).unwrap_or_default(),
                c.get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                c.get("priority").and_then(Value::as_i64).unwrap_or(0),
            ));
        }
        return cols;
    }
    match t.plural.as_str() {
        "nodes" => {
            cols.push(column("Status", "string", "", "The status of the node", 0));
            cols.push(column("Roles", "string", "", "The roles of the node", 0));
            cols.push(column("Age", "string", "", "CreationTimestamp", 0));
            cols.push(column(
                "Version",
                "string",
                "",
                "Kubelet Version reported by the node.",
                0,
            ));
        }
        "customresourcedefinitions" => {
            cols.push(column("Created At", "date", "", "CreationTimestamp", 0));
        }
        "namespaces" => {
            cols.push(column(
                "Status",
                "string",
                "",
                "The status of the namespace",
                0,
            ));
            cols.push(column("Age", "string", "", "CreationTimestamp", 0));
        }
        "pods" => {
            cols.push(column(
                "Ready",
                "string",
                "",
                "The aggregate readiness state of this pod",
                0,
            ));
            cols.push(column(
                "Status",
                "string",
                "",
                "The aggregate status of the containers",
                0,
            ));
            cols.push(column("Node", "string", "", "Node the pod runs on", 1));
            cols.push(column("Age", "string", "", "CreationTimestamp", 0));
        }
        _ => cols.push(column("Age", "string", "", "CreationTimestamp", 0)),
    }
    cols
}

fn human_age(obj: &Value) -> Value {
    let Some(ts) = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
    else {
        return json!("<unknown>");
    };
    let Ok(t) = chrono::DateTime::parse_from_rfc3339(ts) else {
        return json!("<unknown>");
    };
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .num_seconds()
        .max(0);
    json!(match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 * 3 => format!("{}m", s / 60),
        s if s < 86400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    })
}

fn node_status(obj: &Value) -> String {
    let ready = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
        })
        .and_then(|c| c.get("status").and_then(Value::as_str));
    let mut s = match ready {
        Some("True") => "Ready".to_string(),
        _ => "NotReady".to_string(),
    };
    if obj.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        s.push_str(",SchedulingDisabled");
    }
    s
}

/// One row's cells.
pub fn cells(t: &ResourceType, obj: &Value) -> Vec<Value> {
    if t.plural == "events" && t.group.is_empty() {
        let when = [
            "/lastTimestamp",
            "/eventTime",
            "/metadata/creationTimestamp",
        ]
        .iter()
        .find_map(|p| obj.pointer(p).and_then(Value::as_str))
        .unwrap_or_default();
        let field = |p: &str| obj.pointer(p).cloned().unwrap_or(json!(""));
        let kind = obj
            .pointer("/involvedObject/kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_lowercase();
        let oname = obj
            .pointer("/involvedObject/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        return vec![
            human_age(&json!({"metadata": {"creationTimestamp": when}})),
            field("/type"),
            field("/reason"),
            json!(format!("{kind}/{oname}")),
            field("/message"),
            field("/metadata/name"),
        ];
    }
    let name = obj
        .pointer("/metadata/name")
        .cloned()
        .unwrap_or(Value::Null);
    let mut out = vec![name];
    if t.custom {
        if t.printer_columns.is_empty() {
            out.push(human_age(obj));
        }
        for c in &t.printer_columns {
            let path = c
                .get("jsonPath")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let ty = c.get("type").and_then(Value::as_str).unwrap_or("string");
            let found = jsonpath(obj, path);
            let cell = match found.first() {
                None => Value::Null,
                Some(Value::String(ts)) if ty == "date" => {
                    human_age(&json!({"metadata": {"creationTimestamp": ts}}))
                }
                Some(v) if ty == "string" && !v.is_string() => json!(v.to_string()),
                Some(v) => (*v).clone(),
            };
            out.push(cell);
        }
        return out;
    }
    match t.plural.as_str() {
        "nodes" => {
            let roles: Vec<String> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .map(|m| {
                    m.keys()
                        .filter_map(|k| {
                            k.strip_prefix("node-role.kubernetes.io/")
                                .map(str::to_string)
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(json!(node_status(obj)));
            out.push(json!(if roles.is_empty() {
                "<none>".to_string()
            } else {
                roles.join(",")
            }));
            out.push(human_age(obj));
            out.push(
                obj.pointer("/status/nodeInfo/kubeletVersion")
                    .cloned()
                    .unwrap_or(json!("")),
            );
        }
        "customresourcedefinitions" => {
            out.push(
                obj.pointer("/metadata/creationTimestamp")
                    .cloned()
                    .unwrap_or(Value::Null),
            );
        }
        "namespaces" => {
            out.push(
                obj.pointer("/status/phase")
                    .cloned()
                    .unwrap_or(json!("Active")),
            );
            out.push(human_age(obj));
        }
        "pods" => {
            let total = obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .map_or(0, |a| {
                    a.iter()
                        .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
                        .count()
                });
            out.push(json!(format!("{ready}/{total}")));
            let phase = if obj.pointer("/metadata/deletionTimestamp").is_some() {
                json!("Terminating")
            } else {
                obj.pointer("/status/phase")
                    .cloned()
                    .unwrap_or(json!("Pending"))
            };
            out.push(phase);
            out.push(
                obj.pointer("/spec/nodeName")
                    .cloned()
                    .unwrap_or(json!("<none>")),
            );
            out.push(human_age(obj));
        }
        _ => out.push(human_age(obj)),
    }
    out
}

/// The row `object` according to `includeObject` (None, Metadata (default), Object).
pub fn row_object(obj: &Value, include: &str) -> Value {
    match include {
        "None" => Value::Null,
        "Object" => obj.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
        }),
    }
}

/// A Table for a set of objects.
pub fn table(
    t: &ResourceType,
    objs: &[&Value],
    include: &str,
    rv: &str,
    cont: Option<&str>,
    with_columns: bool,
) -> Value {
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cells(t, o)});
            let ro = row_object(o, include);
            if !ro.is_null() {
                row["object"] = ro;
            }
            row
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    let mut table =
        json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "rows": rows});
    if with_columns {
        table["columnDefinitions"] = Value::Array(columns(t));
    } else {
        table["columnDefinitions"] = Value::Array(Vec::new());
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_filters() {
        let o = json!({"status": {"conditions": [
            {"type": "Valid", "status": "False"}, {"type": "Ready", "status": "True", "message": "ok"}]},
            "spec": {"items": [1, 2]}});
        assert_eq!(
            jsonpath(&o, ".status.conditions[?(@.type==\"Ready\")].message"),
            vec![&json!("ok")]
        );
        assert_eq!(jsonpath(&o, ".spec.items[1]"), vec![&json!(2)]);
        assert_eq!(jsonpath(&o, ".spec.items[*]").len(), 2);
        assert!(jsonpath(&o, ".spec.missing").is_empty());
    }
}
