//! The resource API: get/list/watch/create/update/patch/apply/delete, the status and eviction
//! subresources, admission (schema, CEL, NodeRestriction, ValidatingAdmissionPolicy) and the
//! garbage collector.

use crate::auth::{Attributes, AuthzMode, User, authorize, node_restriction, validating_policies};
use crate::error::{ApiError, cause};
use crate::faults::Faults;
use crate::managed;
use crate::registry::ResourceType;
use crate::schema;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{EventKind, Filter, Inner, ObjKey, ResKey, Store, WatchMsg, now_rfc3339, uuid};
use crate::table;
use bytes::Bytes;
use futures::stream::BoxStream;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Server-wide state.
pub struct State {
    /// Storage.
    pub store: Store,
    /// Fault switches.
    pub faults: Arc<Faults>,
    /// Known users by token.
    pub users: std::sync::RwLock<HashMap<String, User>>,
    /// Authorization mode.
    pub authz: AuthzMode,
    /// How often watches with allowWatchBookmarks get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// Who a request without credentials is (None: 401).
    pub anonymous: Option<User>,
}

/// A parsed resource request.
pub struct Request {
    /// HTTP method.
    pub method: http::Method,
    /// Query parameters.
    pub query: HashMap<String, String>,
    /// Content-Type.
    pub content_type: String,
    /// Accept.
    pub accept: String,
    /// User-Agent.
    pub user_agent: String,
    /// Body.
    pub body: Bytes,
    /// The authenticated user.
    pub user: User,
}

/// What a handler answers.
pub enum Reply {
    /// A JSON body with a status code and warnings.
    Json(u16, Value, Vec<String>),
    /// A watch stream of JSON lines.
    Stream(BoxStream<'static, Bytes>),
}

/// One addressed resource.
pub struct Target {
    /// The type.
    pub ty: Arc<ResourceType>,
    /// The version in the URL.
    pub version: String,
    /// Namespace, if in the URL.
    pub namespace: Option<String>,
    /// Name, if in the URL.
    pub name: Option<String>,
    /// Subresource, if any.
    pub sub: Option<String>,
}

impl Target {
    fn res_key(&self) -> ResKey {
        (self.ty.group.clone(), self.ty.plural.clone())
    }
    fn ns(&self) -> String {
        if self.ty.namespaced {
            self.namespace.clone().unwrap_or_default()
        } else {
            String::new()
        }
    }
    fn name(&self) -> String {
        self.name.clone().unwrap_or_default()
    }
    fn sub(&self) -> &str {
        self.sub.as_deref().unwrap_or_default()
    }
}

/// Resolve `/api/v1/...` or `/apis/<g>/<v>/...` to a target.
pub fn resolve(inner: &Inner, segs: &[&str]) -> Option<Target> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let served = |plural: &str| {
        inner
            .find(group, plural)
            .filter(|t| t.version == version || t.versions.iter().any(|x| x == version))
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] if served(plural).is_some_and(|t| t.namespaced) => {
            (Some(ns.to_string()), {
                let mut v = vec![*plural];
                v.extend_from_slice(tail);
                v
            })
        }
        other => (None, other.to_vec()),
    };
    let ty = served(rest.first()?)?;
    if rest.len() > 3 {
        return None;
    }
    Some(Target {
        ty,
        version: version.to_string(),
        namespace,
        name: rest.get(1).map(|s| s.to_string()),
        sub: rest.get(2).map(|s| s.to_string()),
    })
}

fn verb_of(method: &http::Method, t: &Target, watch: bool) -> &'static str {
    match (method.as_str(), t.name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

fn is_true(v: Option<&String>) -> bool {
    matches!(v.map(String::as_str), Some("true" | "1"))
}

/// Answer a resource request.
pub fn handle(st: &Arc<State>, t: Target, req: Request) -> Result<Reply, ApiError> {
    let watch = is_true(req.query.get("watch"));
    let verb = verb_of(&req.method, &t, watch);
    let ns = t.ns();
    let name = t.name();
    {
        let inner = st.store.lock();
        let attrs = Attributes {
            verb,
            group: &t.ty.group,
            resource: &t.ty.plural,
            subresource: t.sub(),
            namespace: &ns,
            name: &name,
        };
        authorize(&inner, st.authz, &req.user, &attrs)?;
    }
    if matches!(verb, "create" | "update" | "patch" | "delete") && st.faults.take_conflict() {
        return Err(ApiError::conflict(
            &t.ty.plural,
            &t.ty.group,
            &name,
            "injected conflict (emulator fault)",
        ));
    }
    match (verb, t.sub()) {
        ("get", "" | "status") => get(st, &t),
        ("list", "") => list(st, &t, &req),
        ("watch", "") => watch_stream(st, &t, &req),
        ("create", "") => create(st, &t, &req),
        ("create", "eviction") if t.ty.group.is_empty() && t.ty.plural == "pods" => {
            evict(st, &t, &req)
        }
        ("update", "" | "status") => update(st, &t, &req),
        ("patch", "" | "status") => patch(st, &t, &req),
        ("delete", "") => delete(st, &t, &req),
        ("deletecollection", "") => delete_collection(st, &t, &req),
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// Output form of an object for the requested version.
fn out(obj: &Value, t: &Target) -> Value {
    let mut o = obj.clone();
    if t.ty.custom && t.version != t.ty.version {
        o["apiVersion"] = json!(format!("{}/{}", t.ty.group, t.version));
    }
    o
}

fn wants(req: &Request, what: &str) -> bool {
    req.accept
        .split(',')
        .any(|part| part.split(';').any(|p| p.trim() == format!("as={what}")))
}

fn get(st: &Arc<State>, t: &Target) -> Result<Reply, ApiError> {
    let inner = st.store.lock();
    let obj = inner
        .tables
        .get(&t.res_key())
        .and_then(|tb| tb.objects.get(&(t.ns(), t.name())))
        .ok_or_else(|| ApiError::not_found(&t.ty.plural, &t.ty.group, &t.name()))?;
    Ok(Reply::Json(200, out(obj, t), Vec::new()))
}

fn filter_for(t: &Target, req: &Request) -> Result<Filter, ApiError> {
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
fn pinned_key(t: &Target, filter: &Filter) -> Option<ObjKey> {
    let name = filter.fields.pinned_name()?.to_string();
    match (&filter.namespace, t.ty.namespaced) {
        (_, false) => Some((String::new(), name)),
        (Some(ns), true) => Some((ns.clone(), name)),
        (None, true) => None,
    }
}

fn encode_continue(rv: u64, key: &ObjKey) -> String {
    let raw = format!("{}\u{0}{}", key.0, key.1);
    let hex: String = raw.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{rv}-{hex}")
}

fn decode_continue(s: &str) -> Option<(u64, ObjKey)> {
    let (rv, hex) = s.split_once('-')?;
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    let raw = String::from_utf8(bytes?).ok()?;
    let (ns, name) = raw.split_once('\u{0}')?;
    Some((rv.parse().ok()?, (ns.to_string(), name.to_string())))
}

fn list(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
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

impl Target {
    fn api_version(&self) -> String {
        if self.ty.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.ty.group, self.version)
        }
    }
}

struct WatchGuard {
    store: Store,
    key: ResKey,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.store.lock().remove_watcher(&self.key, self.id);
    }
}

enum Shape {
    Full,
    Table(String),
    Partial,
}

/// One line of a watch stream, serialised straight from the stored object (building it with
/// `json!` deep-copied the object, once per watcher and event).
#[derive(serde::Serialize)]
struct WatchEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    object: &'a Value,
}

fn event_line(kind: &str, obj: &Value, t: &Target, shape: &Shape, ty: &ResourceType) -> Bytes {
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

fn error_line(err: &ApiError) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": "ERROR", "object": err.to_status()}))
        .unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn bookmark_line(t: &Target, rv: u64, initial_end: bool) -> Bytes {
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

fn watch_stream(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
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

fn parse_body(req: &Request) -> Result<Value, ApiError> {
    let ct = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    if ct.contains("protobuf") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct})"
            ),
        ));
    }
    let v: Value = if ct.ends_with("yaml") {
        serde_yaml::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
        })?
    };
    Ok(v)
}

/// How one write is made.
struct WriteCtx<'a> {
    t: &'a Target,
    user: &'a User,
    verb: &'a str,
    manager: String,
    field_validation: String,
    dry_run: bool,
    applied: bool,
}

fn default_manager(req: &Request, verb: &str) -> String {
    if let Some(m) = req.query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    let ua = req
        .user_agent
        .split('/')
        .next()
        .unwrap_or("unknown")
        .to_string();
    if ua.is_empty() {
        format!("unknown-{verb}")
    } else {
        ua
    }
}

fn ctx<'a>(t: &'a Target, req: &'a Request, verb: &'a str) -> WriteCtx<'a> {
    WriteCtx {
        t,
        user: &req.user,
        verb,
        manager: default_manager(req, verb),
        field_validation: req
            .query
            .get("fieldValidation")
            .cloned()
            .unwrap_or_else(|| "Warn".into()),
        dry_run: req.query.get("dryRun").is_some_and(|d| d == "All"),
        applied: false,
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Whether two values are equal apart from the keys in `skip` (when both are objects).
/// Compares in place: cloning whole objects to strip keys cost two deep copies per write.
fn equal_except(a: &Value, b: &Value, skip: &[&str]) -> bool {
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
fn same_generation_fields(a: &Value, b: &Value) -> bool {
    equal_except(a, b, &["metadata", "status"])
}

/// Whether two states of an object differ only in what changes on every write (the
/// resourceVersion, the times of managedFields entries): such a write is a no-op.
fn same_but_volatile(a: &Value, b: &Value) -> bool {
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

/// The common write path: preserve system metadata, schema (defaults, pruning, validation,
/// CEL), generation, managed fields, admission, finalizers, then store.
fn write(
    st: &Arc<State>,
    inner: &mut Inner,
    c: &WriteCtx<'_>,
    old: Option<Arc<Value>>,
    mut new: Value,
) -> Result<(u16, Value, Vec<String>), ApiError> {
    let t = c.t;
    let ty = &t.ty;
    let ns = t.ns();
    let mut warnings = Vec::new();
    if !new.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    // Type and identity checks.
    let kind = new
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if !kind.is_empty() && kind != ty.kind {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({})",
            new.get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            t.api_version()
        )));
    }
    new["kind"] = json!(ty.kind);
    new["apiVersion"] = json!(ty.api_version());
    if !new.get("metadata").is_some_and(Value::is_object) {
        new["metadata"] = json!({});
    }
    let body_ns = new
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(str::to_string);
    if ty.namespaced {
        match body_ns {
            Some(b) if !b.is_empty() && b != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => new["metadata"]["namespace"] = json!(ns),
        }
    } else if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    let url_name = t.name.clone();
    let name = match (
        &url_name,
        new.pointer("/metadata/name").and_then(Value::as_str),
    ) {
        (Some(u), Some(b)) if u != b => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({b}) does not match the name on the URL ({u})"
            )));
        }
        (_, Some(b)) if !b.is_empty() => b.to_string(),
        (Some(u), _) => u.clone(),
        (None, _) => match new
            .pointer("/metadata/generateName")
            .and_then(Value::as_str)
        {
            Some(prefix) => {
                let suffix: String = uuid()
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .take(5)
                    .collect();
                format!("{prefix}{suffix}")
            }
            None => {
                return Err(ApiError::invalid(
                    &ty.kind,
                    &ty.group,
                    "",
                    vec![cause(
                        "FieldValueRequired",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    )],
                ));
            }
        },
    };
    new["metadata"]["name"] = json!(name);
    let valid_name = if ty.plural == "namespaces" {
        is_dns_subdomain(&name) && !name.contains('.') && name.len() <= 63
    } else if ty.plural == "nodes" || ty.custom {
        is_dns_subdomain(&name)
    } else {
        !name.is_empty() && !name.contains('/') && name != "." && name != ".."
    };
    if !valid_name {
        return Err(ApiError::invalid(
            &ty.kind,
            &ty.group,
            &name,
            vec![cause(
                "FieldValueInvalid",
                "metadata.name",
                format!(
                    "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            )],
        ));
    }
    if ty.namespaced && old.is_none() {
        let exists = inner
            .tables
            .get(&(String::new(), "namespaces".into()))
            .is_some_and(|tb| tb.objects.contains_key(&(String::new(), ns.clone())));
        if !exists {
            return Err(ApiError::not_found("namespaces", "", &ns));
        }
    }
    let sub = t.sub().to_string();
    match &old {
        Some(old) => {
            // Optimistic concurrency.
            match new
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
            {
                Some(rv)
                    if !rv.is_empty()
                        && Some(rv)
                            != old
                                .pointer("/metadata/resourceVersion")
                                .and_then(Value::as_str) =>
                {
                    return Err(ApiError::conflict(
                        &ty.plural,
                        &ty.group,
                        &name,
                        "the object has been modified; please apply your changes to the latest version and try again",
                    ));
                }
                Some(rv) if !rv.is_empty() => {}
                _ if ty.custom && c.verb == "update" => {
                    return Err(ApiError::invalid(
                        &ty.kind,
                        &ty.group,
                        &name,
                        vec![cause(
                            "FieldValueInvalid",
                            "metadata.resourceVersion",
                            "Invalid value: 0x0: must be specified for an update",
                        )],
                    ));
                }
                _ => {}
            }
            if sub == "status" {
                let status = new.get("status").cloned();
                let managed = new.pointer("/metadata/managedFields").cloned();
                new = (**old).clone();
                match status {
                    Some(s) => new["status"] = s,
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                match managed {
                    Some(m) => new["metadata"]["managedFields"] = m,
                    None => {
                        if let Some(m) = new["metadata"].as_object_mut() {
                            m.remove("managedFields");
                        }
                    }
                }
            } else if ty.status_subresource {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old["metadata"].get(f) {
                    Some(v) => new["metadata"][f] = v.clone(),
                    None => {
                        if let Some(m) = new["metadata"].as_object_mut() {
                            m.remove(f);
                        }
                    }
                }
            }
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                let old_f = old
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let new_f = new
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let added: Vec<&Value> = new_f.iter().filter(|f| !old_f.contains(f)).collect();
                if !added.is_empty() {
                    // kube-apiserver's object-meta validation: 422 Invalid, not 403.
                    return Err(ApiError::invalid(
                        &ty.kind,
                        &ty.group,
                        &name,
                        vec![cause(
                            "FieldValueForbidden",
                            "metadata.finalizers",
                            format!(
                                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                            ),
                        )],
                    ));
                }
            }
        }
        None => {
            if new
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
            {
                return Err(ApiError::bad_request(
                    "resourceVersion should not be set on objects to be created",
                ));
            }
            if let Some(m) = new["metadata"].as_object_mut() {
                for f in [
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                    "uid",
                    "creationTimestamp",
                ] {
                    m.remove(f);
                }
            }
            new["metadata"]["uid"] = json!(uuid());
            new["metadata"]["creationTimestamp"] = json!(now_rfc3339());
            if ty.has_generation {
                new["metadata"]["generation"] = json!(1);
            }
            if ty.status_subresource
                && ty.plural != "nodes"
                && ty.plural != "namespaces"
                && let Some(m) = new.as_object_mut()
            {
                m.remove("status");
            }
            if ty.group.is_empty() && ty.plural == "pods" {
                new["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            }
            if ty.plural == "namespaces" {
                new["status"] = json!({"phase": "Active"});
                new["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            }
        }
    }
    // Structural schema: defaults, pruning, validation, CEL.
    if let Some(s) = ty.schema.as_ref().filter(|_| ty.custom) {
        schema::apply_defaults(&mut new, s);
        let unknown = schema::prune_root(&mut new, s);
        if !unknown.is_empty() {
            match c.field_validation.as_str() {
                "Strict" => {
                    let list: Vec<String> = unknown
                        .iter()
                        .map(|u| format!("unknown field \"{u}\""))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        list.join(", ")
                    )));
                }
                "Ignore" => {}
                _ => warnings.extend(unknown.iter().map(|u| format!("unknown field \"{u}\""))),
            }
        }
        let errs = schema::validate_root(&new, old.as_deref(), s);
        if !errs.is_empty() {
            return Err(ApiError::invalid(&ty.kind, &ty.group, &name, errs));
        }
    }
    builtin_validation(ty, &name, &new)?;
    // Generation.
    if ty.has_generation
        && let Some(old) = &old
    {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let bump = !same_generation_fields(old, &new);
        new["metadata"]["generation"] = json!(if bump { g + 1 } else { g });
    }
    // Field ownership.
    if !c.applied {
        managed::record_update(
            old.as_deref(),
            &mut new,
            ty.schema.as_ref(),
            &c.manager,
            &sub,
            &ty.api_version(),
        );
    }
    // Admission.
    let attrs = Attributes {
        verb: c.verb,
        group: &ty.group,
        resource: &ty.plural,
        subresource: &sub,
        namespace: &ns,
        name: &name,
    };
    node_restriction(c.user, &attrs, Some(&new), old.as_deref())?;
    let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
    validating_policies(inner, c.user, &attrs, operation, Some(&new), old.as_deref())?;
    if ty.plural == "customresourcedefinitions" {
        crd_status(&mut new);
        crd_check(&new, &name)?;
    }
    // No-op writes don't change the resourceVersion (as in kube-apiserver).
    if let Some(old) = &old
        && same_but_volatile(old, &new)
    {
        return Ok((200, out(old, t), warnings));
    }
    if c.dry_run {
        return Ok((
            if old.is_some() { 200 } else { 201 },
            out(&new, t),
            warnings,
        ));
    }
    let key = (ns.clone(), name.clone());
    let res = t.res_key();
    let finalizers_done = new
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if new.pointer("/metadata/deletionTimestamp").is_some() && finalizers_done {
        inner.put(&res, key.clone(), new);
        let gone = inner.remove(&res, &key);
        after_removal(st, inner, ty, gone.as_deref(), "Background");
        return Ok((
            200,
            out(&gone.map(|g| (*g).clone()).unwrap_or_default(), t),
            warnings,
        ));
    }
    let stored = inner.put(&res, key, new);
    mirror_event(inner, ty, Some(&stored), &ns, &name);
    if ty.plural == "customresourcedefinitions"
        && let Some(rt) = ResourceType::from_crd(&stored)
    {
        inner.register(rt);
    }
    Ok((
        if old.is_some() { 200 } else { 201 },
        out(&stored, t),
        warnings,
    ))
}

fn builtin_validation(ty: &ResourceType, name: &str, obj: &Value) -> Result<(), ApiError> {
    if ty.group == "policy" && ty.plural == "poddisruptionbudgets" {
        let spec = obj.get("spec");
        let min = spec.and_then(|s| s.get("minAvailable")).is_some();
        let max = spec.and_then(|s| s.get("maxUnavailable")).is_some();
        if min && max {
            return Err(ApiError::invalid(
                &ty.kind,
                &ty.group,
                name,
                vec![cause(
                    "FieldValueInvalid",
                    "spec",
                    "Invalid value: \"object\": minAvailable and maxUnavailable cannot be both set",
                )],
            ));
        }
    }
    if ty.plural == "leases" || ty.plural == "secrets" || ty.plural == "configmaps" {
        return Ok(());
    }
    if ty.group == "rbac.authorization.k8s.io"
        && ty.plural.ends_with("bindings")
        && obj.get("roleRef").is_none()
    {
        return Err(ApiError::invalid(
            &ty.kind,
            &ty.group,
            name,
            vec![cause("FieldValueRequired", "roleRef", "Required value")],
        ));
    }
    Ok(())
}

fn crd_status(crd: &mut Value) {
    let now = now_rfc3339();
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let stored: Vec<Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").cloned())
                .collect()
        })
        .unwrap_or_default();
    crd["status"] = json!({
        "acceptedNames": names,
        "storedVersions": stored,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ]
    });
}

fn crd_check(crd: &Value, name: &str) -> Result<(), ApiError> {
    let group = crd
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let plural = crd
        .pointer("/spec/names/plural")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut errs = Vec::new();
    if name != format!("{plural}.{group}") {
        errs.push(cause(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    if ResourceType::from_crd(crd).is_none() {
        errs.push(cause(
            "FieldValueRequired",
            "spec.versions",
            "Required value: must have exactly one version marked as storage version",
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            "CustomResourceDefinition",
            "apiextensions.k8s.io",
            name,
            errs,
        ))
    }
}

fn create(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
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

fn current(inner: &Inner, t: &Target) -> Option<Arc<Value>> {
    inner
        .tables
        .get(&t.res_key())
        .and_then(|tb| tb.objects.get(&(t.ns(), t.name())))
        .cloned()
}

fn update(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let body = parse_body(req)?;
    let c = ctx(t, req, "update");
    let mut inner = st.store.lock();
    let old = current(&inner, t)
        .ok_or_else(|| ApiError::not_found(&t.ty.plural, &t.ty.group, &t.name()))?;
    let (code, obj, warnings) = write(st, &mut inner, &c, Some(old), body)?;
    Ok(Reply::Json(code, obj, warnings))
}

fn patch(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let ct = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut c = ctx(t, req, "patch");
    // Decoded before taking the store's lock: every other request waits while it is held.
    let apply_config: Option<Value> = match ct.as_str() {
        "application/apply-patch+yaml" => Some(
            serde_yaml::from_slice(&req.body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        ),
        _ => None,
    };
    let mut inner = st.store.lock();
    let old = current(&inner, t);
    let name = t.name();
    let new = match (ct.as_str(), apply_config) {
        ("application/apply-patch+yaml", Some(config)) => {
            let Some(manager) = req.query.get("fieldManager").filter(|m| !m.is_empty()) else {
                return Err(ApiError::bad_request(
                    "PATCH, application/apply-patch+yaml requires fieldManager to be set",
                ));
            };
            if config.get("apiVersion").is_none() || config.get("kind").is_none() {
                return Err(ApiError::bad_request(
                    "invalid object type: apiVersion and kind must be set in an apply configuration",
                ));
            }
            c.manager = manager.clone();
            c.applied = true;
            let force = is_true(req.query.get("force"));
            let mut merged = managed::apply(
                old.as_deref(),
                &config,
                t.ty.schema.as_ref(),
                manager,
                t.sub(),
                force,
                &t.ty.api_version(),
            )
            .map_err(|mut e| {
                e.details = Some((name.clone(), t.ty.group.clone(), t.ty.plural.clone()));
                e
            })?;
            if old.is_none() {
                merged["metadata"]["name"] = json!(name);
            } else if config.pointer("/metadata/resourceVersion").is_none() {
                merged["metadata"]["resourceVersion"] = old
                    .as_ref()
                    .and_then(|o| o.pointer("/metadata/resourceVersion"))
                    .cloned()
                    .unwrap_or(Value::Null);
            }
            merged
        }
        (
            "application/merge-patch+json"
            | "application/strategic-merge-patch+json"
            | "application/json-patch+json",
            _,
        ) => {
            if ct == "application/strategic-merge-patch+json" && t.ty.custom {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
            let old = old
                .clone()
                .ok_or_else(|| ApiError::not_found(&t.ty.plural, &t.ty.group, &name))?;
            let mut doc = (*old).clone();
            if ct == "application/json-patch+json" {
                let p: json_patch::Patch = serde_json::from_slice(&req.body).map_err(|e| {
                    ApiError::bad_request(format!(
                        "the body of the request could not be decoded: {e}"
                    ))
                })?;
                for op in &p.0 {
                    // The real server's JSON patch treats a missing path as equal to null in a
                    // `test` (kube-runtime's finalizer helper adds the first finalizer so).
                    if let json_patch::PatchOperation::Test(test) = op
                        && test.value.is_null()
                        && doc.pointer(test.path.as_str()).is_none()
                    {
                        continue;
                    }
                    json_patch::patch(&mut doc, std::slice::from_ref(op)).map_err(|e| {
                        ApiError::new(
                            422,
                            "Invalid",
                            format!(
                                "the server rejected our request due to an error in our request: {e}"
                            ),
                        )
                    })?;
                }
            } else {
                let p: Value = serde_json::from_slice(&req.body).map_err(|e| {
                    ApiError::bad_request(format!(
                        "the body of the request could not be decoded: {e}"
                    ))
                })?;
                json_patch::merge(&mut doc, &strip_smp_directives(p));
            }
            doc
        }
        (other, _) => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other})"
                ),
            ));
        }
    };
    let (code, obj, warnings) = write(st, &mut inner, &c, old, new)?;
    Ok(Reply::Json(code, obj, warnings))
}

/// Strategic-merge-patch directives (`$patch`, `$retainKeys`, `$setElementOrder/...`) are dropped:
/// the emulator applies strategic merge patches as JSON merge patches.
fn strip_smp_directives(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k, strip_smp_directives(v)))
                .collect(),
        ),
        other => other,
    }
}

fn delete_options(req: &Request) -> Value {
    let mut opts: Value = if req.body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&req.body).unwrap_or(json!({}))
    };
    if let Some(p) = req.query.get("propagationPolicy") {
        opts["propagationPolicy"] = json!(p);
    }
    opts
}

fn delete(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let opts = delete_options(req);
    let mut inner = st.store.lock();
    let (code, obj) = delete_one(
        st,
        &mut inner,
        t,
        &req.user,
        &opts,
        is_true_str(req.query.get("dryRun"), "All"),
    )?;
    Ok(Reply::Json(code, obj, Vec::new()))
}

fn is_true_str(v: Option<&String>, want: &str) -> bool {
    v.is_some_and(|x| x == want)
}

fn delete_one(
    st: &Arc<State>,
    inner: &mut Inner,
    t: &Target,
    user: &User,
    opts: &Value,
    dry_run: bool,
) -> Result<(u16, Value), ApiError> {
    let name = t.name();
    let ty = t.ty.clone();
    let old = current(inner, t).ok_or_else(|| ApiError::not_found(&ty.plural, &ty.group, &name))?;
    if let Some(uid) = opts.pointer("/preconditions/uid").and_then(Value::as_str)
        && old.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid)
    {
        return Err(ApiError::conflict(
            &ty.plural,
            &ty.group,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old.pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            ),
        ));
    }
    if let Some(rv) = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && old
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            != Some(rv)
    {
        return Err(ApiError::conflict(
            &ty.plural,
            &ty.group,
            &name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                old.pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            ),
        ));
    }
    let ns = t.ns();
    let attrs = Attributes {
        verb: "delete",
        group: &ty.group,
        resource: &ty.plural,
        subresource: "",
        namespace: &ns,
        name: &name,
    };
    node_restriction(user, &attrs, None, Some(&old))?;
    validating_policies(inner, user, &attrs, "DELETE", None, Some(&old))?;
    if dry_run {
        return Ok((200, out(&old, t)));
    }
    let policy = opts
        .get("propagationPolicy")
        .and_then(Value::as_str)
        .unwrap_or("Background")
        .to_string();
    let res = t.res_key();
    let key = (ns.clone(), name.clone());
    let mut finalizers: Vec<Value> = old
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if policy == "Foreground" && !finalizers.contains(&json!("foregroundDeletion")) {
        finalizers.push(json!("foregroundDeletion"));
    }
    if policy == "Orphan" && !finalizers.contains(&json!("orphan")) && ty.plural != "namespaces" {
        // Orphaning is done right away rather than by a finalizer.
        orphan_dependents(
            inner,
            old.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
    }
    if !finalizers.is_empty() && ty.plural != "namespaces" {
        let mut marked = (*old).clone();
        if marked.pointer("/metadata/deletionTimestamp").is_none() {
            marked["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        }
        marked["metadata"]["finalizers"] = Value::Array(finalizers);
        if same_but_volatile(&marked, &old) {
            return Ok((200, out(&old, t)));
        }
        let stored = inner.put(&res, key, marked);
        if policy == "Foreground" {
            spawn_gc(
                st,
                old.pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                "Foreground".into(),
            );
        }
        return Ok((200, out(&stored, t)));
    }
    if ty.plural == "namespaces" {
        // Contents go first, then the namespace itself (no Terminating phase is kept).
        let keys: Vec<(ResKey, ObjKey)> = inner
            .tables
            .iter()
            .filter(|(k, _)| inner.types.get(*k).is_some_and(|t| t.namespaced))
            .flat_map(|(k, tb)| {
                tb.objects
                    .keys()
                    .filter(|o| o.0 == name)
                    .map(move |o| (k.clone(), o.clone()))
            })
            .collect();
        for (r, o) in keys {
            let gone = inner.remove(&r, &o);
            let rt = inner.types.get(&r).cloned();
            if let Some(rt) = rt {
                after_removal(st, inner, &rt, gone.as_deref(), "Background");
            }
        }
    }
    let gone = inner
        .remove(&res, &key)
        .ok_or_else(|| ApiError::not_found(&ty.plural, &ty.group, &name))?;
    after_removal(st, inner, &ty, Some(&gone), &policy);
    Ok((200, out(&gone, t)))
}

/// Side effects of an object being removed: CRDs stop being served, dependents are collected.
fn after_removal(
    st: &Arc<State>,
    inner: &mut Inner,
    ty: &ResourceType,
    gone: Option<&Value>,
    policy: &str,
) {
    let Some(gone) = gone else { return };
    if ty.plural == "events" {
        let ns = gone
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let name = gone
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        mirror_event(inner, ty, None, &ns, &name);
    }
    if ty.plural == "customresourcedefinitions"
        && let Some(rt) = ResourceType::from_crd(gone)
    {
        inner.unregister(&rt.group, &rt.plural);
    }
    if policy != "Orphan"
        && let Some(uid) = gone.pointer("/metadata/uid").and_then(Value::as_str)
    {
        spawn_gc(st, uid.to_string(), policy.to_string());
    }
}

fn orphan_dependents(inner: &mut Inner, uid: &str) {
    for (res, key, obj) in dependents(inner, uid) {
        let mut o = (*obj).clone();
        if let Some(refs) = o
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        {
            refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
        }
        inner.put(&res, key, o);
    }
}

fn dependents(inner: &Inner, uid: &str) -> Vec<(ResKey, ObjKey, Arc<Value>)> {
    inner
        .owned_by(uid)
        .into_iter()
        .filter_map(|(res, key)| {
            let obj = inner.tables.get(&res)?.objects.get(&key)?.clone();
            Some((res, key, obj))
        })
        .collect()
}

fn uid_exists(inner: &Inner, uid: &str) -> bool {
    inner.locate_uid(uid).is_some()
}

/// The garbage collector: runs after the response, like kube-controller-manager's.
fn spawn_gc(st: &Arc<State>, uid: String, policy: String) {
    let st = st.clone();
    tokio::spawn(async move {
        tokio::task::yield_now().await;
        collect(&st, &uid, &policy);
    });
}

fn collect(st: &Arc<State>, uid: &str, policy: &str) {
    let mut inner = st.store.lock();
    let mut queue = vec![uid.to_string()];
    while let Some(owner) = queue.pop() {
        for (res, key, obj) in dependents(&inner, &owner) {
            let refs: Vec<Value> = obj
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let others_alive = refs
                .iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str))
                .any(|u| u != owner && uid_exists(&inner, u));
            if others_alive {
                let mut o = (*obj).clone();
                if let Some(refs) = o
                    .pointer_mut("/metadata/ownerReferences")
                    .and_then(Value::as_array_mut)
                {
                    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner.as_str()));
                }
                inner.put(&res, key, o);
                continue;
            }
            let finalizers = obj
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty());
            if finalizers {
                if obj.pointer("/metadata/deletionTimestamp").is_none() {
                    let mut o = (*obj).clone();
                    o["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
                    inner.put(&res, key, o);
                }
                continue;
            }
            if let Some(gone) = inner.remove(&res, &key) {
                if res.1 == "customresourcedefinitions"
                    && let Some(rt) = ResourceType::from_crd(&gone)
                {
                    inner.unregister(&rt.group, &rt.plural);
                }
                if let Some(u) = gone.pointer("/metadata/uid").and_then(Value::as_str) {
                    queue.push(u.to_string());
                }
            }
        }
    }
    if policy == "Foreground" {
        // The owner waits for its dependents, then loses the foregroundDeletion finalizer.
        let found = inner.locate_uid(uid).and_then(|(res, key)| {
            let obj = inner.tables.get(&res)?.objects.get(&key)?.clone();
            Some((res, key, obj))
        });
        if let Some((res, key, obj)) = found {
            let mut o = (*obj).clone();
            if let Some(f) = o
                .pointer_mut("/metadata/finalizers")
                .and_then(Value::as_array_mut)
            {
                f.retain(|x| x != "foregroundDeletion");
            }
            let done = o
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
            inner.put(&res, key.clone(), o);
            if done {
                inner.remove(&res, &key);
            }
        }
    }
}

fn delete_collection(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let filter = filter_for(t, req)?;
    let opts = delete_options(req);
    let mut inner = st.store.lock();
    let names: Vec<ObjKey> = inner
        .tables
        .get(&t.res_key())
        .map(|tb| {
            tb.objects
                .iter()
                .filter(|(_, o)| filter.matches(o))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    let mut items = Vec::new();
    for (ns, name) in names {
        let one = Target {
            ty: t.ty.clone(),
            version: t.version.clone(),
            namespace: Some(ns),
            name: Some(name),
            sub: None,
        };
        let (_, obj) = delete_one(st, &mut inner, &one, &req.user, &opts, false)?;
        items.push(obj);
    }
    let rv = inner.rv.to_string();
    Ok(Reply::Json(
        200,
        json!({"kind": format!("{}List", t.ty.kind), "apiVersion": t.api_version(), "metadata": {"resourceVersion": rv}, "items": items}),
        Vec::new(),
    ))
}

fn pod_healthy(p: &Value) -> bool {
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

fn scaled(v: &Value, total: usize) -> Option<i64> {
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
fn evict(st: &Arc<State>, t: &Target, req: &Request) -> Result<Reply, ApiError> {
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

/// Kinds of watch events, re-exported for tests.
pub type Kind = EventKind;

/// core/v1 and events.k8s.io/v1 Events are one resource in kube-apiserver, seen in two shapes:
/// a write to one is mirrored, converted, into the other.
fn mirror_event(
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

fn copy_fields(from: &Value, to: &mut Value, pairs: &[(&str, &str)]) {
    for (a, b) in pairs {
        if let Some(v) = from.get(*a).filter(|v| !v.is_null()) {
            to[*b] = v.clone();
        }
    }
}

fn events_v1_to_core(e: &Value) -> Value {
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

fn core_to_events_v1(c: &Value) -> Value {
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
