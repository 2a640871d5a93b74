//! The kubelets' part of a pod's deletion, which the test clusters lack. A pod bound to a
//! node is deleted gracefully: the API server only sets `deletionTimestamp`, and the pod stays
//! (Terminating) until the node's kubelet has stopped its containers and deletes it with
//! grace period 0. No kubelet runs next to the test API servers, so an evicted pod would
//! stay forever and a drain waiting for it would never finish. [`PodDeletions`] does that
//! last step at once for every pod whose deletion has begun, and remembers the grace period
//! each pod was given (`deletionGracePeriodSeconds`), which a kubelet would have waited.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};

/// Finishes every pod deletion, as the pod's kubelet would; stops when dropped.
pub struct PodDeletions {
    task: tokio::task::JoinHandle<()>,
    grace_periods: Arc<Mutex<BTreeMap<String, Option<i64>>>>,
}

impl PodDeletions {
    /// Watches all pods with `client` and deletes, with grace period 0, each one whose
    /// `deletionTimestamp` is set.
    pub fn finish(client: kube::Client) -> PodDeletions {
        let pods: Api<Pod> = Api::all(client.clone());
        let grace_periods = Arc::new(Mutex::new(BTreeMap::new()));
        let seen = Arc::clone(&grace_periods);
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
                if let Ok(mut seen) = seen.lock() {
                    seen.entry(format!("{namespace}/{name}"))
                        .or_insert(pod.metadata.deletion_grace_period_seconds);
                }
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
        PodDeletions {
            task,
            grace_periods,
        }
    }

    /// The grace period the pod `namespace/name` was deleted with, once its deletion began
    /// (`Some(None)`: a deletion without one).
    pub fn grace_period(&self, pod: &str) -> Option<Option<i64>> {
        self.grace_periods.lock().ok()?.get(pod).copied()
    }
}

impl Drop for PodDeletions {
    fn drop(&mut self) {
        self.task.abort();
    }
}
