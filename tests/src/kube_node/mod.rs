//! Real Kubernetes nodes (test bed 5): nspawn nodes running containerd, runc and the CNI
//! plugins of the root filesystem, and the real kubelet built from Kubernetes' own Go module
//! at several releases ([`kubelet`]), packaged as a `kubernetes` system extension the way
//! Flatcar's sysext-bakery does. Each kubelet registers its Node with the real API server as
//! `system:node:NAME`, and Pods run from images built and imported locally
//! ([`config::WORKLOAD_IMAGE`]). See docs/development/test-beds.md § Real Kubernetes nodes.

pub mod cluster;
pub mod config;
pub mod kubelet;
mod node;
pub mod rollout;
pub mod workload;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;

pub use cluster::{ClusterOptions, KubeCluster};
pub use config::KubeletPorts;
pub use kubelet::{KUBELET_RELEASES, KubeletImage, kubelet_binary, kubelet_sysext, node_images};
pub use node::{KubeNode, KubeNodeConfig, healthz_ok};

use crate::{Error, Result};

/// The Node's `Ready` condition status (`True`, `False`, `Unknown`) and its kubelet version,
/// as the API server has them; `None` before the kubelet registered it.
pub async fn node_state(client: &kube::Client, name: &str) -> Result<Option<(String, String)>> {
    let nodes: kube::Api<NodeObject> = kube::Api::all(client.clone());
    let node = nodes
        .get_opt(name)
        .await
        .map_err(|e| Error::Invalid(format!("reading Node {name}: {e}")))?;
    Ok(node.and_then(|n| n.status).map(|status| {
        let ready = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status)
            .unwrap_or_else(|| "Unknown".to_owned());
        let version = status
            .node_info
            .map(|info| info.kubelet_version)
            .unwrap_or_default();
        (ready, version)
    }))
}

/// Waits until the Node `name` is `Ready` with kubelet `version` (any version when `None`).
pub async fn wait_node_ready(
    client: &kube::Client,
    name: &str,
    version: Option<&str>,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match node_state(client, name).await {
            Ok(Some((ready, kubelet))) => {
                if ready == "True" && version.is_none_or(|v| v == kubelet) {
                    return Ok(());
                }
                format!("Ready={ready}, kubelet {kubelet}")
            }
            Ok(None) => "not registered".to_owned(),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!(
                    "Node {name} Ready on kubelet {} (last: {last})",
                    version.unwrap_or("any"),
                ),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
