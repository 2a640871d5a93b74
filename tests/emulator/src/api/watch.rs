//! Watching: the initial events, bookmarks, the event stream of one resource type, and the
//! watch's end (410 Gone for a resource version compacted away).

use super::*;

pub(super) struct WatchGuard {
    store: Store,
    key: ResKey,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.store.lock().remove_watcher(&self.key, self.id);
    }
}

pub(super) enum Shape {
    Full,
    Table(String),
    Partial,
}

/// One line of a watch stream, serialised straight from the stored object (building it with
/// `json!` deep-copied the object, once per watcher and event).
#[derive(serde::Serialize)]
pub(super) struct WatchEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    object: &'a Value,
}

pub(super) fn event_line(
    kind: &str,
    obj: &Value,
    t: &Target,
    shape: &Shape,
    ty: &ResourceType,
) -> Bytes {
    let converted;
    let object = match shape {
        Shape::Full if !(t.ty.custom && t.version != t.ty.version) => obj,
        Shape::Full => {
            converted = out(obj, t);
            &converted
        }
        Shape::Partial => {
            converted = table::row_object(obj, "Metadata");
            &converted
        }
        Shape::Table(include) => {
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            converted = table::table(ty, &[obj], include, rv, None, true);
            &converted
        }
    };
    let mut line = serde_json::to_vec(&WatchEvent { kind, object }).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

pub(super) fn error_line(err: &ApiError) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": "ERROR", "object": err.to_status()}))
        .unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

pub(super) fn bookmark_line(t: &Target, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": t.ty.kind, "apiVersion": t.api_version(), "metadata": meta});
    let mut line =
        serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

pub(super) fn watch_stream(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let filter = filter_for(t, req)?;
    let shape = if wants(req, "Table") {
        Shape::Table(
            req.query
                .get("includeObject")
                .cloned()
                .unwrap_or_else(|| "Metadata".into()),
        )
    } else if wants(req, "PartialObjectMetadata") {
        Shape::Partial
    } else {
        Shape::Full
    };
    let bookmarks = is_true(req.query.get("allowWatchBookmarks"));
    let send_initial = is_true(req.query.get("sendInitialEvents"));
    let timeout = req
        .query
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let rv_param = req
        .query
        .get("resourceVersion")
        .cloned()
        .unwrap_or_default();
    if st.faults.take_gone() {
        let err = ApiError::gone(format!(
            "too old resource version: {rv_param} (injected by the emulator)"
        ));
        return Ok(Reply::Stream(Box::pin(futures::stream::iter(vec![
            error_line(&err),
        ]))));
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<WatchMsg>();
    let mut initial: Vec<Bytes> = Vec::new();
    let ty = t.ty.clone();
    let (guard, start_rv) = {
        let mut inner = st.store.lock();
        let key = t.res_key();
        let tb = inner.tables.entry(key.clone()).or_default();
        if rv_param.is_empty() || rv_param == "0" || send_initial {
            let matching: Vec<&Arc<Value>> = match pinned_key(t, &filter) {
                // A single-object watch costs a lookup, not a scan (30,000 agents do this).
                Some(k) => tb
                    .objects
                    .get(&k)
                    .filter(|o| filter.matches(o))
                    .into_iter()
                    .collect(),
                None => tb.objects.values().filter(|o| filter.matches(o)).collect(),
            };
            for o in matching {
                initial.push(event_line("ADDED", o, t, &shape, &ty));
            }
        } else {
            let rv: u64 = rv_param.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid resource version: {rv_param}"))
            })?;
            match tb.changes_since(rv) {
                None => {
                    let err = ApiError::gone(format!(
                        "too old resource version: {rv} ({})",
                        tb.compacted + 1
                    ));
                    return Ok(Reply::Stream(Box::pin(futures::stream::iter(vec![
                        error_line(&err),
                    ]))));
                }
                Some(changes) => {
                    for c in changes {
                        if let Some((kind, obj)) = filter.translate(&c) {
                            initial.push(event_line(kind.as_str(), &obj, t, &shape, &ty));
                        }
                    }
                }
            }
        }
        let id = inner.add_watcher(&key, filter, tx);
        (
            WatchGuard {
                store: st.store.clone(),
                key,
                id,
            },
            inner.rv,
        )
    };
    let mut cut = st.faults.cut_signal();
    cut.mark_unchanged();
    let interval = st.bookmark_interval;
    let store = st.store.clone();
    let target = Target {
        ty: t.ty.clone(),
        version: t.version.clone(),
        namespace: t.namespace.clone(),
        name: None,
        sub: None,
    };
    let stream = async_stream::stream! {
        let _guard = guard;
        for line in initial {
            yield line;
        }
        if send_initial && bookmarks {
            yield bookmark_line(&target, start_rv, true);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some((kind, obj, _rv)) => yield event_line(kind.as_str(), &obj, &target, &shape, &ty),
                    None => break,
                },
                _ = tick.tick(), if bookmarks => {
                    if rx.is_empty() {
                        let rv = store.lock().rv;
                        yield bookmark_line(&target, rv, false);
                    }
                }
                _ = cut.changed() => break,
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
    };
    Ok(Reply::Stream(Box::pin(stream)))
}
