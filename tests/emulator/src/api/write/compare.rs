//! What a write changes: whether it bumps `metadata.generation`, and whether it is a no-op.

use super::*;

/// Whether two values are equal apart from the keys in `skip` (when both are objects).
/// Compares in place: cloning whole objects to strip keys cost two deep copies per write.
pub(in crate::api) fn equal_except(a: &Value, b: &Value, skip: &[&str]) -> bool {
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
pub(in crate::api) fn same_generation_fields(a: &Value, b: &Value) -> bool {
    equal_except(a, b, &["metadata", "status"])
}

/// Whether two states of an object differ only in what changes on every write (the
/// resourceVersion, the times of managedFields entries): such a write is a no-op.
pub(in crate::api) fn same_but_volatile(a: &Value, b: &Value) -> bool {
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
