//! Draining a node before activation. Cluster API does not drain for in-place updates
//! (cluster-api#13497), so the extension does when configured. The drain itself belongs to
//! the controller (Eviction API, PodDisruptionBudget-aware); this crate only needs the
//! trait, and keeps the ordering: the plan stays `Staged` until the drain is done, then
//! becomes `Active`, and the node is uncordoned once the update is done.

use async_trait::async_trait;

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
