//! Events: core/v1 and events.k8s.io/v1 are one resource seen in two shapes, each write
//! mirrored into the other.

use super::*;

/// core/v1 and events.k8s.io/v1 Events are one resource in kube-apiserver, seen in two shapes:
/// a write to one is mirrored, converted, into the other.
pub(super) fn mirror_event(
    inner: &mut Inner,
    ty: &ResourceType,
    stored: Option<&Value>,
    ns: &str,
    name: &str,
) {
    if ty.plural != "events" {
        return;
    }
    let (other, convert): (&str, fn(&Value) -> Value) = match ty.group.as_str() {
        "" => ("events.k8s.io", core_to_events_v1),
        "events.k8s.io" => ("", events_v1_to_core),
        _ => return,
    };
    let res = (other.to_string(), "events".to_string());
    let key = (ns.to_string(), name.to_string());
    match stored {
        Some(obj) => {
            inner.put(&res, key, convert(obj));
        }
        None => {
            inner.remove(&res, &key);
        }
    }
}

pub(super) fn copy_fields(from: &Value, to: &mut Value, pairs: &[(&str, &str)]) {
    for (a, b) in pairs {
        if let Some(v) = from.get(*a).filter(|v| !v.is_null()) {
            to[*b] = v.clone();
        }
    }
}

pub(super) fn events_v1_to_core(e: &Value) -> Value {
    let mut meta = e.get("metadata").cloned().unwrap_or(json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    let mut c = json!({"apiVersion": "v1", "kind": "Event", "metadata": meta});
    copy_fields(
        e,
        &mut c,
        &[
            ("regarding", "involvedObject"),
            ("note", "message"),
            ("reason", "reason"),
            ("type", "type"),
            ("action", "action"),
            ("related", "related"),
            ("eventTime", "eventTime"),
            ("series", "series"),
            ("reportingController", "reportingComponent"),
            ("reportingInstance", "reportingInstance"),
            ("deprecatedSource", "source"),
            ("deprecatedCount", "count"),
            ("deprecatedFirstTimestamp", "firstTimestamp"),
            ("deprecatedLastTimestamp", "lastTimestamp"),
        ],
    );
    if c.get("involvedObject").is_none() {
        c["involvedObject"] = json!({});
    }
    c
}

pub(super) fn core_to_events_v1(c: &Value) -> Value {
    let mut meta = c.get("metadata").cloned().unwrap_or(json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    let mut e = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta});
    copy_fields(
        c,
        &mut e,
        &[
            ("involvedObject", "regarding"),
            ("message", "note"),
            ("reason", "reason"),
            ("type", "type"),
            ("action", "action"),
            ("related", "related"),
            ("eventTime", "eventTime"),
            ("series", "series"),
            ("reportingComponent", "reportingController"),
            ("reportingInstance", "reportingInstance"),
            ("source", "deprecatedSource"),
            ("count", "deprecatedCount"),
            ("firstTimestamp", "deprecatedFirstTimestamp"),
            ("lastTimestamp", "deprecatedLastTimestamp"),
        ],
    );
    e
}
