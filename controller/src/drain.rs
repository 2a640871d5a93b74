//! Draining a node through the Eviction API, the way `kubectl drain --ignore-daemonsets
//! --delete-emptydir-data --force` does: DaemonSet pods and mirror (static) pods stay,
//! finished pods are ignored, every other pod is evicted, and PodDisruptionBudgets are
//! respected (an eviction they refuse is retried on the next pass until `drainTimeout`).
//!
//! One pass is one round of evictions; the rollout reconcile runs a pass each time it looks
//! at a node that is waiting for its drain, and requeues itself while pods remain.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, ListParams};

use crate::decision::DrainProgress;
use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// The annotation the kubelet puts on mirror pods of static pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What a drain does with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodDisposition {
    /// Left alone: a DaemonSet would recreate it at once.
    DaemonSet,
    /// Left alone: a mirror of a static pod, which the API cannot remove.
    Mirror,
    /// Left alone: it already ran to completion.
    Finished,
    /// Already being deleted: wait for it to go.
    Leaving,
    /// To be evicted.
    Evict,
}

/// Decides what the drain does with `pod`.
pub fn pod_disposition(pod: &Pod) -> PodDisposition {
    let meta = &pod.metadata;
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return PodDisposition::Mirror;
    }
    if meta
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
    {
        return PodDisposition::DaemonSet;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return PodDisposition::Finished;
    }
    if meta.deletion_timestamp.is_some() {
        return PodDisposition::Leaving;
    }
    PodDisposition::Evict
}

/// One drain pass over `node`: evicts what should go and counts what remains. Evictions
/// refused with 429 (a PodDisruptionBudget) are reported in `blocked`.
pub async fn drain_pass(
    client: &kube::Client,
    node: &str,
    metrics: &Metrics,
) -> Result<DrainProgress> {
    let all: Api<Pod> = Api::all(client.clone());
    let pods = all
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(Error::kube(format!("listing the pods on node {node}")))?;
    tracing::debug!(node, pods = pods.items.len(), "drain pass");
    let mut progress = DrainProgress::default();
    for pod in &pods.items {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        match pod_disposition(pod) {
            PodDisposition::DaemonSet | PodDisposition::Mirror | PodDisposition::Finished => {}
            PodDisposition::Leaving => progress.remaining += 1,
            PodDisposition::Evict => {
                let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
                metrics.wrote("eviction");
                tracing::debug!(node, pod = name, "evicting");
                match api.evict(name, &EvictParams::default()).await {
                    Ok(_) => progress.remaining += 1,
                    Err(kube::Error::Api(status)) if status.is_not_found() => {}
                    Err(kube::Error::Api(status)) if status.code == 429 => {
                        progress.remaining += 1;
                        let causes: Vec<String> = status
                            .details
                            .iter()
                            .flat_map(|d| d.causes.iter())
                            .map(|c| c.message.clone())
                            .filter(|m| !m.is_empty())
                            .collect();
                        let why = if causes.is_empty() {
                            status.message.clone()
                        } else {
                            format!("{} ({})", status.message, causes.join("; "))
                        };
                        progress.blocked.push(format!("{namespace}/{name}: {why}"));
                    }
                    Err(source) => {
                        return Err(Error::Kube {
                            action: format!("evicting pod {namespace}/{name}"),
                            source,
                        });
                    }
                }
            }
        }
    }
    Ok(progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut base = json!({"metadata": {"name": "p", "namespace": "default"}});
        if let (Some(b), Some(e)) = (base.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                if k == "metadata" {
                    for (mk, mv) in v.as_object().unwrap() {
                        b["metadata"][mk] = mv.clone();
                    }
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn pods_are_handled_as_kubectl_drain_does() {
        assert_eq!(pod_disposition(&pod(json!({}))), PodDisposition::Evict);
        assert_eq!(
            pod_disposition(&pod(
                json!({"metadata": {"annotations": {MIRROR_ANNOTATION: "x"}}})
            )),
            PodDisposition::Mirror
        );
        assert_eq!(
            pod_disposition(&pod(json!({"metadata": {"ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u", "controller": true}
            ]}}))),
            PodDisposition::DaemonSet
        );
        assert_eq!(
            pod_disposition(&pod(json!({"metadata": {"ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}
            ]}}))),
            PodDisposition::Evict
        );
        assert_eq!(
            pod_disposition(&pod(json!({"status": {"phase": "Succeeded"}}))),
            PodDisposition::Finished
        );
        assert_eq!(
            pod_disposition(&pod(
                json!({"metadata": {"deletionTimestamp": "2026-11-22T03:00:00Z"}})
            )),
            PodDisposition::Leaving
        );
    }
}
