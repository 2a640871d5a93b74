//! Reading: get, and list with label and field selectors, pages (`limit`/`continue`) and
//! `resourceVersion` semantics.

use super::*;

pub(super) fn get(st: &Arc<State>, t: &Target) -> Result<Reply, ApiError> {
    let inner = st.store.lock();
    let obj = inner
        .tables
        .get(&t.res_key())
        .and_then(|tb| tb.objects.get(&(t.ns(), t.name())))
        .ok_or_else(|| ApiError::not_found(&t.ty.plural, &t.ty.group, &t.name()))?;
    Ok(Reply::Json(200, out(obj, t), Vec::new()))
}

pub(super) fn filter_for(t: &Target, req: &Request) -> Result<Filter, ApiError> {
    Ok(Filter {
        namespace: t.namespace.clone().filter(|_| t.ty.namespaced),
        labels: LabelSelector::parse(
            req.query
                .get("labelSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )?,
        fields: FieldSelector::parse(
            req.query
                .get("fieldSelector")
                .map(String::as_str)
                .unwrap_or_default(),
            &t.ty.group,
            &t.ty.plural,
            &[],
        )?,
    })
}

/// The one key a `metadata.name=` field selector can match, when the namespace is known.
pub(super) fn pinned_key(t: &Target, filter: &Filter) -> Option<ObjKey> {
    let name = filter.fields.pinned_name()?.to_string();
    match (&filter.namespace, t.ty.namespaced) {
        (_, false) => Some((String::new(), name)),
        (Some(ns), true) => Some((ns.clone(), name)),
        (None, true) => None,
    }
}

pub(super) fn encode_continue(rv: u64, key: &ObjKey) -> String {
    let raw = format!("{}\u{0}{}", key.0, key.1);
    let hex: String = raw.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{rv}-{hex}")
}

pub(super) fn decode_continue(s: &str) -> Option<(u64, ObjKey)> {
    let (rv, hex) = s.split_once('-')?;
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    let raw = String::from_utf8(bytes?).ok()?;
    let (ns, name) = raw.split_once('\u{0}')?;
    Some((rv.parse().ok()?, (ns.to_string(), name.to_string())))
}

pub(super) fn list(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let filter = filter_for(t, req)?;
    let limit: usize = req
        .query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let inner = st.store.lock();
    let tb = inner.tables.get(&t.res_key());
    let compacted = tb.map_or(0, |tb| tb.compacted);
    if let Some(rv) = req
        .query
        .get("resourceVersion")
        .filter(|r| !r.is_empty() && *r != "0")
    {
        let n: u64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
        let exact = req.query.get("resourceVersionMatch").map(String::as_str) == Some("Exact");
        if n > inner.rv {
            return Err(ApiError::new(
                504,
                "Timeout",
                format!("Too large resource version: {n}, current: {}", inner.rv),
            ));
        }
        if (exact && n != inner.rv) || n < compacted {
            return Err(ApiError::gone(format!(
                "The resourceVersion for the provided list is too old. (requested {n})"
            )));
        }
    }
    let start = match req.query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => {
            let (rv, key) = decode_continue(c)
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            if rv < compacted {
                return Err(ApiError::gone(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            Some(key)
        }
        None => None,
    };
    let mut items: Vec<&Arc<Value>> = Vec::new();
    let mut next: Option<String> = None;
    let mut remaining = 0usize;
    if let Some(tb) = tb {
        let pinned = pinned_key(t, &filter);
        let range: Box<dyn Iterator<Item = (&ObjKey, &Arc<Value>)>> = match (&start, &t.namespace) {
            _ if pinned.is_some() => Box::new(
                pinned
                    .as_ref()
                    .and_then(|k| tb.objects.get_key_value(k))
                    .filter(|(k, _)| start.as_ref().is_none_or(|s| *k > s))
                    .into_iter(),
            ),
            (Some(k), _) => Box::new(tb.objects.range((
                std::ops::Bound::Excluded(k.clone()),
                std::ops::Bound::Unbounded,
            ))),
            (None, Some(ns)) if t.ty.namespaced => {
                Box::new(tb.objects.range((ns.clone(), String::new())..))
            }
            _ => Box::new(tb.objects.iter()),
        };
        for (k, o) in range {
            if let Some(ns) = &filter.namespace
                && &k.0 != ns
            {
                if k.0 > *ns {
                    break;
                }
                continue;
            }
            if !filter.labels.matches(o) || !filter.fields.matches(o) {
                continue;
            }
            if items.len() == limit {
                remaining += 1;
                continue;
            }
            items.push(o);
            if items.len() == limit {
                next = Some(encode_continue(inner.rv, k));
            }
        }
    }
    if remaining == 0 {
        next = None;
    }
    let rv = inner.rv.to_string();
    if wants(req, "Table") {
        let objs: Vec<&Value> = items.iter().map(|o| o.as_ref()).collect();
        let include = req
            .query
            .get("includeObject")
            .map(String::as_str)
            .unwrap_or("Metadata");
        let mut tbl = table::table(&t.ty, &objs, include, &rv, next.as_deref(), true);
        if remaining > 0 {
            tbl["metadata"]["remainingItemCount"] = json!(remaining);
        }
        return Ok(Reply::Json(200, tbl, Vec::new()));
    }
    let partial = wants(req, "PartialObjectMetadataList");
    let items: Vec<Value> = items
        .iter()
        .map(|o| {
            if partial {
                table::row_object(o, "Metadata")
            } else {
                out(o, t)
            }
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = next {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(remaining);
    }
    let (kind, api_version) = if partial {
        (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        )
    } else {
        (format!("{}List", t.ty.kind), Target::api_version(t))
    };
    Ok(Reply::Json(
        200,
        json!({"kind": kind, "apiVersion": api_version, "metadata": meta, "items": items}),
        Vec::new(),
    ))
}
