//! Storage: one global monotonic resourceVersion (like etcd), objects per resource, a bounded
//! event history per resource (older watches get 410 Gone) and watchers indexed by name so a
//! single-object watch costs O(1) per event.

use crate::registry::{ResourceType, builtins};
use crate::selectors::{FieldSelector, LabelSelector};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;

/// `(group, plural)`.
pub type ResKey = (String, String);
/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub type ObjKey = (String, String);

/// A watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

/// One change, kept in the history ring.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion of the change.
    pub rv: u64,
    /// What happened.
    pub kind: EventKind,
    /// The object after (or, for a delete, the last state).
    pub object: Arc<Value>,
    /// The object before, for modifications.
    pub old: Option<Arc<Value>>,
}

/// What a watcher selects.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

impl Filter {
    /// Whether the object passes.
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
                != ns
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The event a watcher with this filter sees for a change, if any (an object leaving the
    /// selection is seen as DELETED, one entering it as ADDED, as kube-apiserver's watch cache does).
    pub fn translate(&self, change: &Change) -> Option<(EventKind, Arc<Value>)> {
        let now = self.matches(&change.object);
        match change.kind {
            EventKind::Added => now.then(|| (EventKind::Added, change.object.clone())),
            EventKind::Deleted => now.then(|| (EventKind::Deleted, change.object.clone())),
            EventKind::Modified => {
                let before = change.old.as_ref().is_some_and(|o| self.matches(o));
                match (before, now) {
                    (true, true) => Some((EventKind::Modified, change.object.clone())),
                    (true, false) => Some((EventKind::Deleted, change.object.clone())),
                    (false, true) => Some((EventKind::Added, change.object.clone())),
                    (false, false) => None,
                }
            }
        }
    }
}

/// A message to a watch stream.
pub type WatchMsg = (EventKind, Arc<Value>, u64);

struct Watcher {
    filter: Filter,
    tx: mpsc::UnboundedSender<WatchMsg>,
}

/// The objects, history and watchers of one resource.
#[derive(Default)]
pub struct Table {
    /// Current objects.
    pub objects: BTreeMap<ObjKey, Arc<Value>>,
    history: VecDeque<Change>,
    /// The newest resourceVersion no longer in the history (watches from before it get 410).
    pub compacted: u64,
    watchers: HashMap<u64, Watcher>,
    by_name: HashMap<String, HashSet<u64>>,
    unindexed: HashSet<u64>,
}

impl Table {
    /// The retained changes newer than `rv`, or None when `rv` is older than the window.
    pub fn changes_since(&self, rv: u64) -> Option<Vec<Change>> {
        if rv < self.compacted {
            return None;
        }
        let start = self.history.partition_point(|c| c.rv <= rv);
        Some(self.history.range(start..).cloned().collect())
    }

    /// Number of registered watchers.
    pub fn watcher_count(&self) -> usize {
        self.watchers.len()
    }
}

/// Everything under the lock.
pub struct Inner {
    /// The last resourceVersion handed out.
    pub rv: u64,
    /// Served types by `(group, plural)`.
    pub types: BTreeMap<ResKey, Arc<ResourceType>>,
    /// Data per type.
    pub tables: HashMap<ResKey, Table>,
    history_window: usize,
    next_watcher: u64,
    /// Where each uid lives.
    uids: HashMap<String, (ResKey, ObjKey)>,
    /// Owner uid → the objects that name it in ownerReferences.
    owned: HashMap<String, HashSet<(ResKey, ObjKey)>>,
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn uid_of(obj: &Value) -> Option<String> {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The emulator's storage. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Mutex<Inner>>,
}

impl Store {
    /// An empty store with the built-in types and the default namespaces.
    pub fn new(history_window: usize) -> Self {
        let mut inner = Inner {
            rv: 0,
            types: BTreeMap::new(),
            tables: HashMap::new(),
            history_window: history_window.max(1),
            next_watcher: 1,
            uids: HashMap::new(),
            owned: HashMap::new(),
        };
        for t in builtins() {
            inner.register(t);
        }
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "uid": uuid(), "creationTimestamp": now_rfc3339(),
                              "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"}
            });
            inner.put(
                &(String::new(), "namespaces".into()),
                (String::new(), ns.into()),
                obj,
            );
        }
        Store {
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    /// Lock the store. Hold it briefly: no awaits while locked.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of one object.
    pub fn get(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let g = self.lock();
        g.tables
            .get(&(group.to_string(), plural.to_string()))
            .and_then(|t| t.objects.get(&(namespace.to_string(), name.to_string())))
            .map(|o| (**o).clone())
    }

    /// Copies of all objects of a resource.
    pub fn list(&self, group: &str, plural: &str) -> Vec<Value> {
        let g = self.lock();
        g.tables
            .get(&(group.to_string(), plural.to_string()))
            .map(|t| t.objects.values().map(|o| (**o).clone()).collect())
            .unwrap_or_default()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// How many watches are open on a resource.
    pub fn watcher_count(&self, group: &str, plural: &str) -> usize {
        self.lock()
            .tables
            .get(&(group.to_string(), plural.to_string()))
            .map_or(0, Table::watcher_count)
    }
}

impl Inner {
    /// Serve a type (again); keeps existing objects.
    pub fn register(&mut self, t: ResourceType) {
        let key = (t.group.clone(), t.plural.clone());
        self.tables.entry(key.clone()).or_default();
        self.types.insert(key, Arc::new(t));
    }

    /// Stop serving a type and drop its objects (closing its watches).
    pub fn unregister(&mut self, group: &str, plural: &str) {
        let key = (group.to_string(), plural.to_string());
        self.types.remove(&key);
        if let Some(t) = self.tables.remove(&key) {
            for (k, o) in t.objects {
                let entry = (key.clone(), k);
                if let Some(uid) = uid_of(&o) {
                    self.uids.remove(&uid);
                }
                for owner in owner_uids(&o) {
                    if let Some(set) = self.owned.get_mut(&owner) {
                        set.remove(&entry);
                    }
                }
            }
        }
    }

    /// Find a type by group and plural.
    pub fn find(&self, group: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .get(&(group.to_string(), plural.to_string()))
            .cloned()
    }

    /// The next resourceVersion.
    pub fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Store an object (create or replace) at a fresh resourceVersion, which this sets.
    pub fn put(&mut self, res: &ResKey, key: ObjKey, mut obj: Value) -> Arc<Value> {
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let obj = Arc::new(obj);
        let window = self.history_window;
        let table = self.tables.entry(res.clone()).or_default();
        let old = table.objects.insert(key.clone(), obj.clone());
        let entry = (res.clone(), key);
        if let Some(o) = &old {
            for owner in owner_uids(o) {
                if let Some(set) = self.owned.get_mut(&owner) {
                    set.remove(&entry);
                }
            }
        }
        for owner in owner_uids(&obj) {
            self.owned.entry(owner).or_default().insert(entry.clone());
        }
        if let Some(uid) = uid_of(&obj) {
            self.uids.insert(uid, entry);
        }
        let table = self.tables.entry(res.clone()).or_default();
        let kind = if old.is_some() {
            EventKind::Modified
        } else {
            EventKind::Added
        };
        table.record(
            Change {
                rv,
                kind,
                object: obj.clone(),
                old,
            },
            window,
        );
        obj
    }

    /// Remove an object; the DELETED event carries a fresh resourceVersion.
    pub fn remove(&mut self, res: &ResKey, key: &ObjKey) -> Option<Arc<Value>> {
        let rv = self.next_rv();
        let window = self.history_window;
        let table = self.tables.get_mut(res)?;
        let old = table.objects.remove(key)?;
        let entry = (res.clone(), key.clone());
        for owner in owner_uids(&old) {
            if let Some(set) = self.owned.get_mut(&owner) {
                set.remove(&entry);
                if set.is_empty() {
                    self.owned.remove(&owner);
                }
            }
        }
        if let Some(uid) = uid_of(&old) {
            self.uids.remove(&uid);
        }
        let table = self.tables.get_mut(res)?;
        let mut last = (*old).clone();
        last["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let last = Arc::new(last);
        table.record(
            Change {
                rv,
                kind: EventKind::Deleted,
                object: last.clone(),
                old: Some(old),
            },
            window,
        );
        Some(last)
    }

    /// Where the object with this uid is stored.
    pub fn locate_uid(&self, uid: &str) -> Option<(ResKey, ObjKey)> {
        self.uids.get(uid).cloned()
    }

    /// The objects whose ownerReferences name this uid.
    pub fn owned_by(&self, uid: &str) -> Vec<(ResKey, ObjKey)> {
        self.owned
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Register a watcher; returns its id.
    pub fn add_watcher(
        &mut self,
        res: &ResKey,
        filter: Filter,
        tx: mpsc::UnboundedSender<WatchMsg>,
    ) -> u64 {
        let id = self.next_watcher;
        self.next_watcher += 1;
        let table = self.tables.entry(res.clone()).or_default();
        match filter.fields.pinned_name() {
            Some(name) => {
                table
                    .by_name
                    .entry(name.to_string())
                    .or_default()
                    .insert(id);
            }
            None => {
                table.unindexed.insert(id);
            }
        }
        table.watchers.insert(id, Watcher { filter, tx });
        id
    }

    /// Drop a watcher.
    pub fn remove_watcher(&mut self, res: &ResKey, id: u64) {
        if let Some(table) = self.tables.get_mut(res) {
            table.drop_watcher(id);
        }
    }
}

impl Table {
    fn drop_watcher(&mut self, id: u64) {
        if let Some(w) = self.watchers.remove(&id) {
            match w.filter.fields.pinned_name() {
                Some(name) => {
                    if let Some(set) = self.by_name.get_mut(name) {
                        set.remove(&id);
                        if set.is_empty() {
                            self.by_name.remove(name);
                        }
                    }
                }
                None => {
                    self.unindexed.remove(&id);
                }
            }
        }
    }

    fn record(&mut self, change: Change, window: usize) {
        let name = change
            .object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut dead = Vec::new();
        let named = self.by_name.get(name).into_iter().flatten();
        for id in named.chain(self.unindexed.iter()) {
            if let Some(w) = self.watchers.get(id)
                && let Some((kind, obj)) = w.filter.translate(&change)
                && w.tx.send((kind, obj, change.rv)).is_err()
            {
                dead.push(*id);
            }
        }
        for id in dead {
            self.drop_watcher(id);
        }
        self.history.push_back(change);
        while self.history.len() > window {
            if let Some(c) = self.history.pop_front() {
                self.compacted = c.rv;
            }
        }
    }
}

/// A random RFC 4122 version 4 UUID.
pub fn uuid() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut x = (t as u64)
        ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(std::process::id()).rotate_left(32);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (a, b) = (next(), next());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

/// Now, as RFC 3339 with second precision (what metav1.Time carries).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}
