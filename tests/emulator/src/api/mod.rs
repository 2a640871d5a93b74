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
use crate::store::{Filter, Inner, ObjKey, ResKey, Store, WatchMsg, now_rfc3339, uuid};
use crate::table;
use bytes::Bytes;
use futures::stream::BoxStream;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

mod delete;
mod events;
mod evict;
mod read;
mod watch;
mod write;

use delete::*;
use events::*;
use evict::*;
use read::*;
use watch::*;
use write::*;

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

impl Target {
    pub(super) fn api_version(&self) -> String {
        if self.ty.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.ty.group, self.version)
        }
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
