//! The eviction subresource: a Pod evicted unless a PodDisruptionBudget forbids it.

use super::*;

pub(super) fn pod_healthy(p: &Value) -> bool {
    p.pointer("/metadata/deletionTimestamp").is_none()
        && p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && p.pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.get("type").and_then(Value::as_str) == Some("Ready")
                        && c.get("status").and_then(Value::as_str) == Some("True")
                })
            })
}

pub(super) fn scaled(v: &Value, total: usize) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            Some((pct * total as i64 + 99) / 100)
        }
        _ => None,
    }
}

/// The eviction subresource: honours PodDisruptionBudgets (429 when no disruption is allowed).
pub(super) fn evict(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let body = parse_body(req)?;
    let name = t.name();
    let ns = t.ns();
    if let Some(b) = body.pointer("/metadata/name").and_then(Value::as_str)
        && b != name
    {
        return Err(ApiError::bad_request(format!(
            "name in URL does not match name in Eviction object ({b} vs {name})"
        )));
    }
    let mut inner = st.store.lock();
    let pod = current(&inner, t).ok_or_else(|| ApiError::not_found("pods", "", &name))?;
    let pdbs: Vec<Arc<Value>> = inner
        .tables
        .get(&("policy".to_string(), "poddisruptionbudgets".to_string()))
        .map(|tb| {
            tb.objects
                .iter()
                .filter(|(k, _)| k.0 == ns)
                .filter(|(_, p)| {
                    p.pointer("/spec/selector")
                        .map(LabelSelector::from_object)
                        .is_some_and(|sel| !sel.is_empty() && sel.matches(&pod))
                })
                .map(|(_, p)| p.clone())
                .collect()
        })
        .unwrap_or_default();
    if pdbs.len() > 1 {
        return Err(ApiError::new(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        ));
    }
    if let Some(pdb) = pdbs.first()
        && pod.pointer("/metadata/deletionTimestamp").is_none()
    {
        let sel = pdb
            .pointer("/spec/selector")
            .map(LabelSelector::from_object)
            .unwrap_or_default();
        let pods: Vec<&Arc<Value>> = inner
            .tables
            .get(&(String::new(), "pods".to_string()))
            .map(|tb| {
                tb.objects
                    .iter()
                    .filter(|(k, p)| k.0 == ns && sel.matches(p))
                    .map(|(_, p)| p)
                    .collect()
            })
            .unwrap_or_default();
        let expected = pods.len();
        let healthy = pods.iter().filter(|p| pod_healthy(p)).count() as i64;
        let desired = if let Some(m) = pdb.pointer("/spec/minAvailable") {
            scaled(m, expected).unwrap_or(0)
        } else if let Some(m) = pdb.pointer("/spec/maxUnavailable") {
            expected as i64 - scaled(m, expected).unwrap_or(0)
        } else {
            0
        };
        let allowed = healthy - desired;
        let this_healthy = pod_healthy(&pod);
        let ok = if this_healthy {
            allowed > 0
        } else {
            healthy >= desired
        };
        if !ok {
            let pdb_name = pdb
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            );
            e.causes = vec![cause(
                "DisruptionBudget",
                "",
                format!(
                    "The disruption budget {pdb_name} needs {desired} healthy pods and has {healthy} currently"
                ),
            )];
            return Err(e);
        }
    }
    let c = ctx(t, req, "create");
    let opts = body.get("deleteOptions").cloned().unwrap_or(json!({}));
    let target = Target {
        ty: t.ty.clone(),
        version: t.version.clone(),
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        sub: None,
    };
    delete_one(st, &mut inner, &target, c.user, &opts, c.dry_run)?;
    Ok(Reply::Json(
        201,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        Vec::new(),
    ))
}
