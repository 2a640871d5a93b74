//! Draining a node before activation. Cluster API does not drain for in-place updates
//! (cluster-api#13497), so the extension does when configured. The drain itself belongs to
//! the controller (Eviction API, PodDisruptionBudget-aware); this crate only needs the
//! trait, and keeps the ordering: the plan stays `Staged` until the drain is done, then
//! becomes `Active`, and the node is uncordoned once the update is done. [`CordonAndEvict`]
//! turns any eviction pass (the controller's `drain_pass`) into a [`Drainer`]: cordon, pass
//! after pass, a timeout, uncordon.

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Where a drain stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainStatus {
    /// Every pod that must go is gone; the node may be disrupted.
    Drained,
    /// Still evicting; the message says what is left ("3 pods left, 1 blocked by a PDB").
    InProgress(String),
    /// The drain cannot finish (for example past its timeout); the message says why.
    Failed(String),
}

/// Drains and uncordons nodes of a workload cluster. Every call must return quickly (a hook
/// answers within seconds): start or continue the drain and report where it stands, and be
/// idempotent, because `UpdateMachine` asks again and again.
#[async_trait]
pub trait Drainer: Send + Sync {
    /// Cordon `node` and evict its pods (or continue doing so).
    async fn drain(&self, workload: &kube::Client, node: &str) -> DrainStatus;
    /// Make `node` schedulable again after a successful update (idempotent).
    async fn uncordon(&self, workload: &kube::Client, node: &str) -> Result<(), String>;
}

/// A drainer for setups that configure no drain: every node counts as drained at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDrain;

#[async_trait]
impl Drainer for NoDrain {
    async fn drain(&self, _workload: &kube::Client, _node: &str) -> DrainStatus {
        DrainStatus::Drained
    }

    async fn uncordon(&self, _workload: &kube::Client, _node: &str) -> Result<(), String> {
        Ok(())
    }
}

/// The result of one eviction pass over a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainPass {
    /// Pods still on the node that must go (evicted now, or still terminating).
    pub remaining: usize,
    /// Evictions refused, with why (`namespace/pod: Cannot evict pod as it would violate
    /// the pod's disruption budget`).
    pub blocked: Vec<String>,
}

/// One eviction pass: evict what must go from `node`, count what is left. The controller's
/// `drain_pass` (Eviction API, PDB-aware) fits here.
pub type EvictionPass = Arc<
    dyn Fn(kube::Client, String) -> BoxFuture<'static, Result<DrainPass, String>> + Send + Sync,
>;

/// When the extension started draining a node (RFC 3339), on the Node.
pub const DRAIN_STARTED_ANNOTATION: &str = "inplace.dev/capi-drain-started";
/// Present when the extension cordoned the node (so uncordon leaves a node alone that
/// someone else had cordoned).
pub const CORDONED_ANNOTATION: &str = "inplace.dev/capi-cordoned";

/// Cordon, then one eviction pass per call until the node is empty or `timeout` has passed
/// since the first call; uncordon afterwards. The start time lives in an annotation on the
/// Node, so it survives restarts of the extension and needs no memory here.
pub struct CordonAndEvict {
    pass: EvictionPass,
    timeout: std::time::Duration,
}

impl CordonAndEvict {
    /// Drains with `pass`, giving up after `timeout`.
    pub fn new(pass: EvictionPass, timeout: std::time::Duration) -> Self {
        CordonAndEvict { pass, timeout }
    }
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

#[async_trait]
impl Drainer for CordonAndEvict {
    async fn drain(&self, workload: &kube::Client, node_name: &str) -> DrainStatus {
        let nodes: Api<Node> = Api::all(workload.clone());
        let node = match nodes.get(node_name).await {
            Ok(node) => node,
            Err(error) => return DrainStatus::InProgress(format!("reading the node: {error}")),
        };
        let now = Timestamp::now();
        let started = match annotation(&node, DRAIN_STARTED_ANNOTATION)
            .and_then(|t| t.parse::<Timestamp>().ok())
        {
            Some(started) => started,
            None => {
                let already_cordoned = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false);
                let mut annotations = serde_json::Map::new();
                annotations.insert(DRAIN_STARTED_ANNOTATION.into(), json!(now.to_string()));
                if !already_cordoned {
                    annotations.insert(CORDONED_ANNOTATION.into(), json!("true"));
                }
                let patch = json!({
                    "metadata": {"annotations": annotations},
                    "spec": {"unschedulable": true},
                });
                if let Err(error) = nodes
                    .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    return DrainStatus::InProgress(format!("cordoning: {error}"));
                }
                now
            }
        };
        let pass = match (self.pass)(workload.clone(), node_name.to_owned()).await {
            Ok(pass) => pass,
            Err(error) => return DrainStatus::InProgress(format!("evicting: {error}")),
        };
        if pass.remaining == 0 {
            return DrainStatus::Drained;
        }
        let blocked = if pass.blocked.is_empty() {
            String::new()
        } else {
            format!("; blocked: {}", pass.blocked.join("; "))
        };
        let elapsed = now.duration_since(started).unsigned_abs();
        if elapsed >= self.timeout {
            DrainStatus::Failed(format!(
                "not drained within {}s: {} pods left{blocked}",
                self.timeout.as_secs(),
                pass.remaining
            ))
        } else {
            DrainStatus::InProgress(format!("{} pods left{blocked}", pass.remaining))
        }
    }

    async fn uncordon(&self, workload: &kube::Client, node_name: &str) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(workload.clone());
        let node = nodes.get(node_name).await.map_err(|e| e.to_string())?;
        if annotation(&node, DRAIN_STARTED_ANNOTATION).is_none() {
            return Ok(());
        }
        let mut patch = json!({"metadata": {"annotations": {
            DRAIN_STARTED_ANNOTATION: null,
            CORDONED_ANNOTATION: null,
        }}});
        if annotation(&node, CORDONED_ANNOTATION).is_some() {
            patch["spec"] = json!({"unschedulable": null});
        }
        nodes
            .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
