//! Draining a node before activation. Cluster API does not drain for in-place updates
//! (cluster-api#13497), so the extension does when configured, with the one drain every
//! inplace caller uses (`inplace-drain`: Eviction API, PodDisruptionBudget-aware, the one
//! cordon record). This module keeps the extension's ordering: the plan stays `Staged`
//! until the drain is done, then becomes `Active`, and the node is uncordoned once the
//! update is done. [`CordonAndEvict`] is the [`Drainer`]: cordon, pass after pass, the one
//! drain clock ([`DrainClock`]: a timeout, then `Halt` or `Force`), uncordon.

use std::sync::Arc;

use async_trait::async_trait;
use inplace_drain::cordon;
use inplace_drain::{DrainClock, DrainError, DrainOptions, DrainVerdict, EvictionApi, Evictions};
use inplace_proto::OnDrainTimeout;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PatchParams};
use serde_json::json;

pub use inplace_drain::cordon::CORDONED_ANNOTATION;

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
    /// Make `node` schedulable again after the update (idempotent); a node inplace did not
    /// cordon stays as it is.
    async fn uncordon(&self, workload: &kube::Client, node: &str) -> Result<(), DrainError>;
}

/// A drainer for setups that configure no drain: every node counts as drained at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDrain;

#[async_trait]
impl Drainer for NoDrain {
    async fn drain(&self, _workload: &kube::Client, _node: &str) -> DrainStatus {
        DrainStatus::Drained
    }

    async fn uncordon(&self, _workload: &kube::Client, _node: &str) -> Result<(), DrainError> {
        Ok(())
    }
}

/// When the extension started draining a node (RFC 3339), on the Node.
pub const DRAIN_STARTED_ANNOTATION: &str = "inplace.dev/capi-drain-started";

/// Cordon, then one eviction pass per call until the node is empty or `timeout` has passed
/// since the first call; then, per `on_timeout`, fail (`Halt`) or delete what is left and
/// wait up to another `timeout` (`Force`); uncordon afterwards. The start time lives in an
/// annotation on the Node, so it survives restarts of the extension and needs no memory here.
pub struct CordonAndEvict {
    evictions: Arc<dyn Evictions>,
    timeout: std::time::Duration,
    on_timeout: OnDrainTimeout,
}

impl CordonAndEvict {
    /// Drains through the Eviction API; after `timeout`, `on_timeout` applies.
    pub fn new(timeout: std::time::Duration, on_timeout: OnDrainTimeout) -> Self {
        CordonAndEvict::with_evictions(Arc::new(EvictionApi), timeout, on_timeout)
    }

    /// Drains with `evictions` (tests put in their own passes).
    pub fn with_evictions(
        evictions: Arc<dyn Evictions>,
        timeout: std::time::Duration,
        on_timeout: OnDrainTimeout,
    ) -> Self {
        CordonAndEvict {
            evictions,
            timeout,
            on_timeout,
        }
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
                let already_cordoned = is_unschedulable(&node);
                let mut annotations = if already_cordoned {
                    serde_json::Map::new()
                } else {
                    cordon::record()
                };
                annotations.insert(DRAIN_STARTED_ANNOTATION.into(), json!(now.to_string()));
                if let Err(error) = cordon::patch_node(
                    &nodes,
                    &PatchParams::default(),
                    node_name,
                    Some(true),
                    annotations,
                )
                .await
                {
                    return DrainStatus::InProgress(error.to_string());
                }
                now
            }
        };
        let clock = DrainClock {
            started,
            timeout: self.timeout,
            on_timeout: self.on_timeout,
        };
        let options = DrainOptions {
            force: clock.forces(now),
            ..DrainOptions::default()
        };
        let pass = match self.evictions.pass(workload, node_name, &options).await {
            Ok(pass) => pass,
            Err(error) => return DrainStatus::InProgress(error.to_string()),
        };
        let blocked = if pass.blocked.is_empty() {
            String::new()
        } else {
            format!("; blocked: {}", pass.blocked.join("; "))
        };
        let timeout = self.timeout.as_secs();
        let left = pass.remaining;
        match clock.verdict(now, left == 0) {
            DrainVerdict::Drained => DrainStatus::Drained,
            DrainVerdict::Evicting { .. } => {
                DrainStatus::InProgress(format!("{left} pods left{blocked}"))
            }
            DrainVerdict::Forcing { .. } => DrainStatus::InProgress(format!(
                "not drained within {timeout}s: {left} pods left, deleted without eviction \
                 (drain-on-timeout Force){blocked}"
            )),
            // `Skip` cannot apply to a Machine (Config::validate refuses it): as `Halt`.
            DrainVerdict::TimedOut { forced: false } | DrainVerdict::Skipped => {
                DrainStatus::Failed(format!(
                    "not drained within {timeout}s: {left} pods left{blocked}"
                ))
            }
            DrainVerdict::TimedOut { forced: true } => DrainStatus::Failed(format!(
                "not drained within {timeout}s, nor {timeout}s after its remaining pods were \
                 deleted: {left} pods left{blocked}"
            )),
        }
    }

    async fn uncordon(&self, workload: &kube::Client, node_name: &str) -> Result<(), DrainError> {
        let nodes: Api<Node> = Api::all(workload.clone());
        let node = nodes
            .get(node_name)
            .await
            .map_err(|source| DrainError::ReadNode {
                node: node_name.to_owned(),
                source,
            })?;
        let ours = cordon::is_recorded(node.metadata.annotations.as_ref());
        if annotation(&node, DRAIN_STARTED_ANNOTATION).is_none() && !ours {
            return Ok(());
        }
        let mut annotations = cordon::forget();
        annotations.insert(DRAIN_STARTED_ANNOTATION.into(), serde_json::Value::Null);
        // A node someone else cordoned keeps its cordon; only our annotations go.
        cordon::patch_node(
            &nodes,
            &PatchParams::default(),
            node_name,
            ours.then_some(false),
            annotations,
        )
        .await
    }
}

fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}
