//! The kubelets' part of a pod's deletion, which the test clusters lack. A pod bound to a
//! node is deleted gracefully: the API server only sets `deletionTimestamp`, and the pod stays
//! (Terminating) until the node's kubelet has stopped its containers and deletes it with
//! grace period 0. No kubelet runs next to the test API servers, so an evicted pod would
//! stay forever and a drain waiting for it would never finish. [`PodDeletions`] does that
//! last step at once for every pod whose deletion has begun.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};

/// Finishes every pod deletion, as the pod's kubelet would; stops when dropped.
pub struct PodDeletions {
    task: tokio::task::JoinHandle<()>,
}

impl PodDeletions {
    /// Watches all pods with `client` and deletes, with grace period 0, each one whose
    /// `deletionTimestamp` is set.
    pub fn finish(client: kube::Client) -> PodDeletions {
        let pods: Api<Pod> = Api::all(client.clone());
        let task = tokio::spawn(async move {
            let mut events = watcher(pods, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            loop {
                let pod = match events.try_next().await {
                    Ok(Some(pod)) => pod,
                    Ok(None) => return,
                    Err(_) => continue,
                };
                if pod.metadata.deletion_timestamp.is_none() {
                    continue;
                }
                let (Some(name), Some(namespace)) = (pod.metadata.name, pod.metadata.namespace)
                else {
                    continue;
                };
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: pod.metadata.uid,
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                // Gone already, or another deletion won: nothing left to do either way.
                let _ = Api::<Pod>::namespaced(client.clone(), &namespace)
                    .delete(&name, &params)
                    .await;
            }
        });
        PodDeletions { task }
    }
}

impl Drop for PodDeletions {
    fn drop(&mut self) {
        self.task.abort();
    }
}
