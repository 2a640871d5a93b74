//! A stand-in for kured's daemons: takes and releases kured's reboot lock exactly as kured
//! 1.23.0 does (`pkg/daemonsetlock/daemonsetlock.go`, `DaemonSetSingleLock.Acquire` and
//! `Release`, the lock of kured's default `--concurrency=1`), written from that source and
//! independent of the controller's own reading of it (`decision/kured.rs`).
//!
//! - Acquire: get the DaemonSet; if the annotation is there and its TTL has not passed
//!   (`TTL` 0: never), the lock is held, by this node if its `nodeID` is this node's;
//!   otherwise set the annotation to `{"nodeID", "metadata": {"unschedulable"}, "created",
//!   "TTL"}` and update the DaemonSet (a conflict: wait a second and start over).
//! - Release: get the DaemonSet; the annotation must be there and name this node; delete it
//!   and update (a conflict: wait a second and start over).
//!
//! And kured's multi-holder lock of `--concurrency` above 1 (`DaemonSetMultiLock`):
//! - Acquire: the annotation `{"maxOwners", "locks": [...]}` (absent: no locks); with fewer
//!   than `maxOwners` locks stored, keep them all and add this node's; otherwise keep those
//!   whose TTL has not passed and add this node's only if one was dropped; update (a
//!   conflict: wait a second and start over). The holders are reported joined by commas.
//! - Release: remove this node's first entry, write the rest back.

use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// kured's default lock annotation.
pub const ANNOTATION: &str = "weave.works/kured-node-lock";

/// kured's DaemonSet, as its manifest installs it: `kube-system/kured`.
pub async fn create_daemonset(client: &kube::Client) -> Api<DaemonSet> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "kured", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"name": "kured"}},
            "template": {
                "metadata": {"labels": {"name": "kured"}},
                "spec": {"containers": [{"name": "kured", "image": "kured:1.23.0",
                    "command": ["/usr/bin/kured"]}]}
            }
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &ds).await.unwrap();
    api
}

/// The lock annotation's value now.
pub async fn lock_value(api: &Api<DaemonSet>) -> Option<String> {
    let ds = api.get("kured").await.unwrap();
    ds.metadata
        .annotations
        .and_then(|a| a.get(ANNOTATION).cloned())
}

fn ttl_expired(value: &Value) -> bool {
    let ttl = value["TTL"].as_i64().unwrap_or(0);
    if ttl <= 0 {
        return false;
    }
    let created: Timestamp = value["created"].as_str().unwrap().parse().unwrap();
    Timestamp::now().duration_since(created) >= SignedDuration::from_nanos(ttl)
}

/// kured's `Acquire` for `node`: `(acquired, holder)`.
pub async fn acquire(api: &Api<DaemonSet>, node: &str, ttl: Duration) -> (bool, String) {
    loop {
        let mut ds = api.get("kured").await.unwrap();
        let annotations = ds.metadata.annotations.get_or_insert_default();
        if let Some(existing) = annotations.get(ANNOTATION) {
            let value: Value = serde_json::from_str(existing).unwrap();
            if !ttl_expired(&value) {
                let holder = value["nodeID"].as_str().unwrap().to_owned();
                return (holder == node, holder);
            }
        }
        let value = json!({
            "nodeID": node,
            "metadata": {"unschedulable": false},
            "created": Timestamp::now().to_string(),
            "TTL": i64::try_from(ttl.as_nanos()).unwrap(),
        });
        annotations.insert(ANNOTATION.to_owned(), value.to_string());
        match api.replace("kured", &PostParams::default(), &ds).await {
            Ok(_) => return (true, node.to_owned()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("kured's Acquire: {e}"),
        }
    }
}

/// kured's `Release` for `node`.
pub async fn release(api: &Api<DaemonSet>, node: &str) {
    loop {
        let mut ds = api.get("kured").await.unwrap();
        let annotations = ds.metadata.annotations.get_or_insert_default();
        let existing = annotations
            .get(ANNOTATION)
            .expect("kured's Release: lock not held");
        let value: Value = serde_json::from_str(existing).unwrap();
        assert_eq!(value["nodeID"], node, "kured's Release: not lock holder");
        annotations.remove(ANNOTATION);
        match api.replace("kured", &PostParams::default(), &ds).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("kured's Release: {e}"),
        }
    }
}

/// kured's multi-holder `Acquire` for `node` with `--concurrency=max_owners`:
/// `(acquired, holders joined by commas)`.
pub async fn acquire_shared(api: &Api<DaemonSet>, node: &str, max_owners: usize) -> (bool, String) {
    loop {
        let mut ds = api.get("kured").await.unwrap();
        let annotations = ds.metadata.annotations.get_or_insert_default();
        let stored: Vec<Value> = annotations
            .get(ANNOTATION)
            .map(|v| serde_json::from_str::<Value>(v).unwrap())
            .and_then(|v| v["locks"].as_array().cloned())
            .unwrap_or_default();
        let mut locks = if stored.len() < max_owners {
            stored.clone()
        } else {
            stored.iter().filter(|l| !ttl_expired(l)).cloned().collect()
        };
        let room = stored.len() < max_owners || locks.len() < stored.len();
        if !room {
            let holders: Vec<&str> = locks
                .iter()
                .map(|l| l["nodeID"].as_str().unwrap())
                .collect();
            return (false, holders.join(","));
        }
        locks.push(json!({
            "nodeID": node,
            "metadata": {"unschedulable": false},
            "created": Timestamp::now().to_string(),
            "TTL": 0,
        }));
        let holders: Vec<String> = locks
            .iter()
            .map(|l| l["nodeID"].as_str().unwrap().to_owned())
            .collect();
        let value = json!({"maxOwners": max_owners, "locks": locks});
        annotations.insert(ANNOTATION.to_owned(), value.to_string());
        match api.replace("kured", &PostParams::default(), &ds).await {
            Ok(_) => return (true, holders.join(",")),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("kured's multi-lock Acquire: {e}"),
        }
    }
}

/// kured's multi-holder `Release` for `node`.
pub async fn release_shared(api: &Api<DaemonSet>, node: &str) {
    loop {
        let mut ds = api.get("kured").await.unwrap();
        let annotations = ds.metadata.annotations.get_or_insert_default();
        let mut value: Value =
            serde_json::from_str(annotations.get(ANNOTATION).expect("Lock not held")).unwrap();
        let locks = value["locks"].as_array_mut().expect("Lock not held");
        let at = locks
            .iter()
            .position(|l| l["nodeID"] == node)
            .expect("Lock not held");
        locks.remove(at);
        annotations.insert(ANNOTATION.to_owned(), value.to_string());
        match api.replace("kured", &PostParams::default(), &ds).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("kured's multi-lock Release: {e}"),
        }
    }
}

/// The holders of the multi-holder lock now.
pub async fn shared_holders(api: &Api<DaemonSet>) -> Vec<String> {
    let Some(value) = lock_value(api).await else {
        return Vec::new();
    };
    let value: Value = serde_json::from_str(&value).unwrap();
    value["locks"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|l| l["nodeID"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}
