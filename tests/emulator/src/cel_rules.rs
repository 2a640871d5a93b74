//! CEL for `x-kubernetes-validations` and ValidatingAdmissionPolicies, on the `cel` crate.
//!
//! Supported: the CEL standard library of the crate (has(), size(), all/exists/exists_one/map/
//! filter, matches(), startsWith/endsWith/contains, duration(), timestamp()), `self`, `oldSelf`
//! (transition rules are skipped on create, as the real server does) and `type(x) == int|string`.
//! In a transition rule, lists of `x-kubernetes-list-type` `map` or `set` compare equal
//! whatever the order of their items, as on the real server.
//! Rules the crate cannot compile or evaluate for lack of a function are skipped and counted in
//! [`skipped_rules`]; see docs/development/api-emulator.md.

use crate::error::{Cause, cause};
use cel::{Context, Program};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

static SKIPPED: AtomicU64 = AtomicU64::new(0);

/// How many rule evaluations were skipped because the CEL crate lacks a feature.
pub fn skipped_rules() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

type Cache = Mutex<HashMap<String, Option<Arc<Program>>>>;

fn compile(rule: &str) -> Option<Arc<Program>> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut g = cache.lock().unwrap_or_else(|p| p.into_inner());
    g.entry(rule.to_string())
        .or_insert_with(|| Program::compile(rule).ok().map(Arc::new))
        .clone()
}

/// The outcome of one expression.
pub enum Outcome {
    /// Evaluated to this value.
    Value(cel::Value),
    /// Evaluation failed (a real server reports this as a validation error).
    Error(String),
    /// The emulator can't evaluate it (missing CEL feature); treated as passing.
    Unsupported,
}

fn type_of(v: cel::Value) -> cel::Value {
    let name = match &v {
        cel::Value::Int(_) => "int",
        cel::Value::UInt(_) => "uint",
        cel::Value::Float(_) => "double",
        cel::Value::String(_) => "string",
        cel::Value::Bool(_) => "bool",
        cel::Value::List(_) => "list",
        cel::Value::Map(_) => "map",
        cel::Value::Null => "null_type",
        cel::Value::Duration(_) => "google.protobuf.Duration",
        cel::Value::Timestamp(_) => "google.protobuf.Timestamp",
        _ => "unknown",
    };
    cel::Value::String(Arc::new(name.to_string()))
}

/// JSON to CEL, with JSON integers as CEL `int` (as Kubernetes does for int64 fields).
pub fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => {
            let map: HashMap<cel::objects::Key, cel::Value> = m
                .iter()
                .map(|(k, v)| (cel::objects::Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            cel::Value::Map(cel::objects::Map { map: Arc::new(map) })
        }
    }
}

/// Evaluate `expr` with the given variables (JSON values).
pub fn eval(expr: &str, vars: &[(&str, &Value)]) -> Outcome {
    let Some(program) = compile(expr) else {
        return Outcome::Unsupported;
    };
    let mut ctx = Context::default();
    ctx.add_function(
        "type",
        |v: cel::Value| -> Result<cel::Value, cel::ExecutionError> { Ok(type_of(v)) },
    );
    for t in ["int", "uint", "double", "string", "bool", "list", "map"] {
        ctx.add_variable_from_value(t, cel::Value::String(Arc::new(t.to_string())));
    }
    for (name, value) in vars {
        ctx.add_variable_from_value(*name, to_cel(value));
    }
    match program.execute(&ctx) {
        Ok(v) => Outcome::Value(v),
        Err(cel::ExecutionError::UndeclaredReference(_))
        | Err(cel::ExecutionError::UnsupportedFieldsConstruction(_)) => Outcome::Unsupported,
        Err(e) => Outcome::Error(e.to_string()),
    }
}

/// Check the `x-kubernetes-validations` rules of schema node `s` against `v`.
pub fn check(v: &Value, old: Option<&Value>, s: &Value, path: &str, errs: &mut Vec<Cause>) {
    let Some(rules) = s.get("x-kubernetes-validations").and_then(Value::as_array) else {
        return;
    };
    for r in rules {
        let Some(rule) = r.get("rule").and_then(Value::as_str) else {
            continue;
        };
        let transition = rule.contains("oldSelf");
        let optional_old = r
            .get("optionalOldSelf")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if transition && old.is_none() && !optional_old {
            continue;
        }
        let null = Value::Null;
        let (this, previous);
        let mut vars: Vec<(&str, &Value)> = vec![("self", v)];
        if transition {
            this = in_canonical_order(v, s);
            previous = in_canonical_order(old.unwrap_or(&null), s);
            vars = vec![("self", &this), ("oldSelf", &previous)];
        }
        let field = match r.get("fieldPath").and_then(Value::as_str) {
            Some(fp) if path.is_empty() => fp.trim_start_matches('.').to_string(),
            Some(fp) => format!("{path}{fp}"),
            None => path.to_string(),
        };
        let shown = match v {
            Value::Object(_) => "\"object\"".to_string(),
            Value::Array(_) => "\"array\"".to_string(),
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        let message = r
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("failed rule: {rule}"));
        let reason = match r.get("reason").and_then(Value::as_str) {
            Some("FieldValueForbidden") => "FieldValueForbidden",
            Some("FieldValueRequired") => "FieldValueRequired",
            Some("FieldValueDuplicate") => "FieldValueDuplicate",
            _ => "FieldValueInvalid",
        };
        match eval(rule, &vars) {
            Outcome::Value(cel::Value::Bool(true)) => {}
            Outcome::Value(_) => errs.push(cause(
                reason,
                &field,
                format!("Invalid value: {shown}: {message}"),
            )),
            Outcome::Error(e) => errs.push(cause(
                reason,
                &field,
                format!("Invalid value: {shown}: {message} ({e})"),
            )),
            Outcome::Unsupported => {
                SKIPPED.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(rule, "CEL rule not supported by the emulator; skipped");
            }
        }
    }
}

/// `v` with the items of every `map` or `set` list (by the schema `s`) sorted, so that two
/// values that differ only in the order of such items are equal. The real server's CEL
/// equality ignores that order; the `cel` crate compares lists in order.
fn in_canonical_order(v: &Value, s: &Value) -> Value {
    match v {
        Value::Array(items) => {
            let item_schema = s.get("items").unwrap_or(&Value::Null);
            let mut items: Vec<Value> = items
                .iter()
                .map(|item| in_canonical_order(item, item_schema))
                .collect();
            let unordered = matches!(
                s.get("x-kubernetes-list-type").and_then(Value::as_str),
                Some("map" | "set")
            );
            if unordered {
                items.sort_by_cached_key(Value::to_string);
            }
            Value::Array(items)
        }
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(name, field)| {
                    let field_schema = s
                        .get("properties")
                        .and_then(|p| p.get(name))
                        .or_else(|| s.get("additionalProperties"))
                        .unwrap_or(&Value::Null);
                    (name.clone(), in_canonical_order(field, field_schema))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(expr: &str, v: Value) -> bool {
        matches!(
            eval(expr, &[("self", &v)]),
            Outcome::Value(cel::Value::Bool(true))
        )
    }

    #[test]
    fn kubernetes_style_rules() {
        assert!(ok(
            "self.type != 'Binary' || has(self.path)",
            json!({"type": "Binary", "path": "/x"})
        ));
        assert!(!ok(
            "self.type != 'Binary' || has(self.path)",
            json!({"type": "Binary"})
        ));
        assert!(ok("size(self.members) > 0", json!({"members": [1]})));
        assert!(ok(
            "duration(self.window) <= duration(self.timeout)",
            json!({"window": "30s", "timeout": "5m"})
        ));
        assert!(!ok(
            "duration(self.window) <= duration(self.timeout)",
            json!({"window": "10m", "timeout": "5m"})
        ));
        assert!(ok(
            "type(self) == int ? self >= 1 : self.matches('^[1-9][0-9]?%$|^100%$')",
            json!("10%")
        ));
        assert!(ok(
            "type(self) == int ? self >= 1 : self.matches('^[1-9][0-9]?%$|^100%$')",
            json!(3)
        ));
        assert!(!ok(
            "type(self) == int ? self >= 1 : self.matches('^[1-9][0-9]?%$|^100%$')",
            json!("0%")
        ));
        assert!(ok(
            "self.spec.nodeName == self.metadata.name",
            json!({"spec": {"nodeName": "a"}, "metadata": {"name": "a"}})
        ));
        assert!(ok(
            "self.all(x, x > 0) && self.exists_one(x, x == 2)",
            json!([1, 2, 3])
        ));
        let a = json!({"a": 1});
        assert!(matches!(
            eval("self == oldSelf", &[("self", &a), ("oldSelf", &a)]),
            Outcome::Value(cel::Value::Bool(true))
        ));
    }

    /// Found with `real_apiserver::a_reordered_release_is_unchanged_for_the_server_and_keeps_its_revision`:
    /// the real server takes a reordered `map` list as unchanged; the emulator refused it.
    #[test]
    fn self_equals_old_self_whatever_the_order_of_a_map_list() {
        let list = |list_type: &str| {
            json!({"type": "array", "x-kubernetes-list-type": list_type,
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {"name": {"type": "string"}}}})
        };
        let schema = |list_type: &str| {
            json!({"type": "object", "properties": {"artifacts": list(list_type)},
                "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "immutable"}]})
        };
        let old = json!({"artifacts": [{"name": "kubernetes"}, {"name": "containerd"}]});
        let reordered = json!({"artifacts": [{"name": "containerd"}, {"name": "kubernetes"}]});
        let changed = json!({"artifacts": [{"name": "containerd"}, {"name": "runc"}]});
        let errors = |v: &Value, list_type: &str| {
            let mut errs = Vec::new();
            check(v, Some(&old), &schema(list_type), "spec", &mut errs);
            errs.len()
        };
        assert_eq!(
            errors(&reordered, "map"),
            0,
            "a map list in another order is the same"
        );
        assert_eq!(errors(&reordered, "set"), 0, "so is a set");
        assert_eq!(errors(&changed, "map"), 1, "another item is a change");
        assert_eq!(
            errors(&reordered, "atomic"),
            1,
            "an atomic list keeps its order"
        );
    }
}
