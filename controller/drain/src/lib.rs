//! One drain for every inplace caller — the rollout controller and the Cluster API
//! extension — the way `kubectl drain --ignore-daemonsets --delete-emptydir-data --force`
//! drains: DaemonSet pods and mirror (static) pods stay, finished pods are ignored, every
//! other pod is evicted through the Eviction API, and PodDisruptionBudgets are respected
//! (an eviction they refuse is retried on the next pass until the caller's timeout).
//! [`DrainOptions`] adds what a caller may ask for: pods to leave alone (a label selector),
//! the grace period sent with each eviction, and a forced pass that deletes without the
//! Eviction API (PodDisruptionBudgets ignored; the rollout's `onTimeout: Force`).
//!
//! * [`pod_disposition`]: what a drain does with one pod (pure);
//! * [`drain_pass`]: one round of evictions over a node, and what is left
//!   ([`DrainProgress`]), behind the [`Evictions`] trait so callers can be tested without
//!   pods. An eviction (or forced deletion) the API server refuses — a budget's 429, a pod
//!   under two budgets (500), an admission webhook, missing RBAC (403) — blocks that pod
//!   and is retried on the next pass: it never fails the pass, so one node's drain never
//!   stops a caller's other nodes; the caller's drain timeout decides;
//! * [`cordon`]: cordoning, and the one record that inplace (not a person) cordoned a node;
//! * [`clock`]: the one drain clock — when a pass forces and where a drain stands after
//!   its timeout (`onTimeout`).
//!
//! A pass never waits for pods to go: callers run one pass each time they look at a node
//! and look again while pods remain, so a reconcile or a hook answers within moments.

pub mod clock;
pub mod cordon;

pub use clock::{DrainClock, DrainVerdict};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::{Selector, SelectorExt};

/// The annotation the kubelet puts on mirror pods of static pods.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What a drain does with one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodDisposition {
    /// Left alone: a DaemonSet would recreate it at once.
    DaemonSet,
    /// Left alone: a mirror of a static pod, which the API cannot remove.
    Mirror,
    /// Left alone: the caller's selector of pods to keep matches it.
    Kept,
    /// Left alone: it already ran to completion.
    Finished,
    /// Already being deleted: wait for it to go.
    Leaving,
    /// To be evicted.
    Evict,
}

/// How a drain pass treats the pods it finds. The default is `kubectl drain
/// --ignore-daemonsets --delete-emptydir-data --force`: every pod but DaemonSet and mirror
/// pods is evicted with its own grace period.
#[derive(Debug, Clone, Default)]
pub struct DrainOptions {
    /// Pods whose labels match are left alone: neither evicted nor waited for.
    pub keep: Option<Selector>,
    /// Sent with each eviction (and forced deletion) instead of each pod's own
    /// `terminationGracePeriodSeconds`.
    pub grace_period_seconds: Option<u32>,
    /// Delete the pods outright instead of evicting them: PodDisruptionBudgets are not
    /// consulted. Only for a caller whose user opted in.
    pub force: bool,
}

/// Decides what the drain does with `pod`. Pods the drain never removes (DaemonSet, mirror,
/// kept by the selector) are judged before a pending deletion, so they are never waited
/// for either.
pub fn pod_disposition(pod: &Pod, options: &DrainOptions) -> PodDisposition {
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
    if options
        .keep
        .as_ref()
        .is_some_and(|keep| keep.matches(pod.labels()))
    {
        return PodDisposition::Kept;
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

/// The result of one drain pass over a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainProgress {
    /// Pods that still have to leave the node (evicted or deleted now, or still
    /// terminating).
    pub remaining: usize,
    /// Evictions refused (a PodDisruptionBudget, usually; or any answer of the API server
    /// but 404), one line per pod:
    /// `namespace/pod: Cannot evict pod as it would violate the pod's disruption budget`.
    pub blocked: Vec<String>,
}

/// Why a drain pass could not finish. A refused eviction (any answer of the API server but
/// 404) is not an error: it is reported in [`DrainProgress::blocked`] and retried on the
/// next pass.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The pods on the node could not be listed.
    #[error("listing the pods on node {node}: {source}")]
    ListPods {
        /// The node.
        node: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// An eviction (or a forced deletion) got no answer from the API server (the
    /// connection failed): the whole pass is retried.
    #[error("{action} pod {pod}: {source}")]
    Evict {
        /// `evicting`, or `deleting` in a forced pass.
        action: &'static str,
        /// `namespace/name`.
        pod: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The node could not be read.
    #[error("reading node {node}: {source}")]
    ReadNode {
        /// The node.
        node: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Cordoning, uncordoning or annotating the node failed.
    #[error("{action} node {node}: {source}")]
    Cordon {
        /// `cordoning`, `uncordoning` or `annotating`.
        action: &'static str,
        /// The node.
        node: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

impl DrainError {
    /// A short, stable label (for metrics and logs): `list_pods`, `evict`, `read_node` or
    /// `cordon`.
    pub fn kind(&self) -> &'static str {
        match self {
            DrainError::ListPods { .. } => "list_pods",
            DrainError::Evict { .. } => "evict",
            DrainError::ReadNode { .. } => "read_node",
            DrainError::Cordon { .. } => "cordon",
        }
    }

    /// The client's error underneath.
    pub fn kube_error(&self) -> &kube::Error {
        match self {
            DrainError::ListPods { source, .. }
            | DrainError::Evict { source, .. }
            | DrainError::ReadNode { source, .. }
            | DrainError::Cordon { source, .. } => source,
        }
    }
}

/// One drain pass over `node`: evicts (or, forced, deletes) what should go and counts what
/// remains. Evictions refused (429 from a PodDisruptionBudget, or any other answer but 404)
/// are reported in `blocked`;
/// `on_eviction` is called for every eviction or deletion sent (the caller's write metric).
pub async fn drain_pass(
    client: &kube::Client,
    node: &str,
    options: &DrainOptions,
    on_eviction: &(dyn Fn() + Sync),
) -> Result<DrainProgress, DrainError> {
    let all: Api<Pod> = Api::all(client.clone());
    let pods = all
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|source| DrainError::ListPods {
            node: node.to_owned(),
            source,
        })?;
    tracing::debug!(node, pods = pods.items.len(), "drain pass");
    let mut progress = DrainProgress::default();
    for pod in &pods.items {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        match pod_disposition(pod, options) {
            PodDisposition::DaemonSet
            | PodDisposition::Mirror
            | PodDisposition::Kept
            | PodDisposition::Finished => {}
            PodDisposition::Leaving => progress.remaining += 1,
            PodDisposition::Evict => {
                let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
                on_eviction();
                tracing::debug!(node, pod = name, force = options.force, "evicting");
                let sent = if options.force {
                    let delete = DeleteParams {
                        grace_period_seconds: options.grace_period_seconds,
                        ..DeleteParams::default()
                    };
                    api.delete(name, &delete).await.map(|_| ())
                } else {
                    evict(&api, pod, options.grace_period_seconds).await
                };
                match sent {
                    Ok(()) => progress.remaining += 1,
                    Err(kube::Error::Api(status)) if status.is_not_found() => {}
                    // A budget (429), or a refusal a later pass may not meet: two budgets
                    // over the pod (500), a webhook, RBAC (403). The pod stays; the caller's
                    // drain timeout decides, for this node alone.
                    Err(kube::Error::Api(status)) => {
                        progress.remaining += 1;
                        let refused = refusal(&status);
                        let line = if status.code == 429 {
                            format!("{namespace}/{name}: {refused}")
                        } else {
                            let action = if options.force {
                                "deletion"
                            } else {
                                "eviction"
                            };
                            format!(
                                "{namespace}/{name}: {action} refused ({}): {refused}",
                                status.code
                            )
                        };
                        progress.blocked.push(line);
                    }
                    Err(source) => {
                        return Err(DrainError::Evict {
                            action: if options.force {
                                "deleting"
                            } else {
                                "evicting"
                            },
                            pod: format!("{namespace}/{name}"),
                            source,
                        });
                    }
                }
            }
        }
    }
    Ok(progress)
}

/// Evicts `pod` through the Eviction API with `grace_period_seconds`. Built here rather than
/// with kube's `Api::evict`, which sends its delete options under the key `delete_options`:
/// the API server ignores that key, and the grace period was lost.
async fn evict(
    api: &Api<Pod>,
    pod: &Pod,
    grace_period_seconds: Option<u32>,
) -> Result<(), kube::Error> {
    let name = pod.name_any();
    let eviction = Eviction {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: pod.metadata.namespace.clone(),
            ..ObjectMeta::default()
        },
        delete_options: grace_period_seconds.map(|seconds| DeleteOptions {
            grace_period_seconds: Some(i64::from(seconds)),
            ..DeleteOptions::default()
        }),
    };
    api.create_subresource::<_, serde_json::Value>(
        "eviction",
        &name,
        &PostParams::default(),
        &eviction,
    )
    .await
    .map(|_| ())
}

/// Why an eviction was refused: the message, with the causes (the budget) when given.
fn refusal(status: &kube::core::Status) -> String {
    let causes: Vec<&str> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| c.message.as_str())
        .filter(|m| !m.is_empty())
        .collect();
    if causes.is_empty() {
        status.message.clone()
    } else {
        format!("{} ({})", status.message, causes.join("; "))
    }
}

/// One drain pass over a node, as a trait: [`EvictionApi`] is the real one; tests of a
/// caller's ordering put in their own.
#[async_trait]
pub trait Evictions: Send + Sync {
    /// Evict (or, with `options.force`, delete) what must go from `node`, count what is left.
    async fn pass(
        &self,
        client: &kube::Client,
        node: &str,
        options: &DrainOptions,
    ) -> Result<DrainProgress, DrainError>;
}

/// [`drain_pass`] through the Eviction API.
#[derive(Debug, Clone, Copy, Default)]
pub struct EvictionApi;

#[async_trait]
impl Evictions for EvictionApi {
    async fn pass(
        &self,
        client: &kube::Client,
        node: &str,
        options: &DrainOptions,
    ) -> Result<DrainProgress, DrainError> {
        drain_pass(client, node, options, &|| {}).await
    }
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
                    for (mk, mv) in v.as_object().into_iter().flatten() {
                        b["metadata"][mk] = mv.clone();
                    }
                } else {
                    b.insert(k.clone(), v.clone());
                }
            }
        }
        serde_json::from_value(base).expect("a pod")
    }

    fn pod_disposition(pod: &Pod) -> PodDisposition {
        super::pod_disposition(pod, &DrainOptions::default())
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

    #[test]
    fn daemonset_and_mirror_pods_are_never_waited_for_even_while_terminating() {
        let leaving = json!("2026-11-22T03:00:00Z");
        assert_eq!(
            pod_disposition(&pod(json!({"metadata": {
                "annotations": {MIRROR_ANNOTATION: "x"}, "deletionTimestamp": leaving}}))),
            PodDisposition::Mirror
        );
        assert_eq!(
            pod_disposition(&pod(json!({"metadata": {"deletionTimestamp": leaving,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                     "name": "ds", "uid": "u", "controller": true}]}}))),
            PodDisposition::DaemonSet
        );
        // Owned by a DaemonSet without being its controller: an ordinary pod.
        assert_eq!(
            pod_disposition(&pod(json!({"metadata": {"ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u"}
            ]}}))),
            PodDisposition::Evict
        );
    }

    #[test]
    fn pods_the_selector_keeps_are_neither_evicted_nor_waited_for() {
        let keep: Selector = [("inplace.dev/skip".to_owned(), "true".to_owned())]
            .into_iter()
            .collect();
        let options = DrainOptions {
            keep: Some(keep),
            ..DrainOptions::default()
        };
        let labelled = |extra: serde_json::Value| {
            let mut p = pod(extra);
            p.metadata
                .labels
                .get_or_insert_default()
                .insert("inplace.dev/skip".into(), "true".into());
            p
        };
        assert_eq!(
            super::pod_disposition(&labelled(json!({})), &options),
            PodDisposition::Kept
        );
        assert_eq!(
            super::pod_disposition(
                &labelled(json!({"metadata": {"deletionTimestamp": "2026-11-22T03:00:00Z"}})),
                &options
            ),
            PodDisposition::Kept,
            "a kept pod that is leaving anyway is not waited for"
        );
        assert_eq!(
            super::pod_disposition(&pod(json!({})), &options),
            PodDisposition::Evict
        );
        assert_eq!(
            pod_disposition(&labelled(json!({}))),
            PodDisposition::Evict,
            "no selector, no exception"
        );
    }
}
