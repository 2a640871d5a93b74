//! A Node's `Ready` condition, as the rollout's health gate reads it
//! (`decision/health.rs`), and its kubelet's version, as the skew guard reads it
//! (`decision/version_skew.rs`): the cached Node keeps those and its machine ID (a FleetLock
//! client's key) and nothing else of its status ([`slim_status`]); [`readiness`] and [`kubelet_version`] read them.

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, NodeSystemInfo};

use crate::decision::Readiness;

/// The Node condition the gate reads.
const READY: &str = "Ready";

/// Drops every part of a Node's status but its `Ready` condition's type, status, reason
/// and message, `nodeInfo.kubeletVersion` and `nodeInfo.machineID` (no heartbeat times:
/// 30,000 cached Nodes stay small, and the cache holds nothing the controller does not read).
pub fn slim_status(status: Option<NodeStatus>) -> Option<NodeStatus> {
    let status = status?;
    let ready = status
        .conditions
        .and_then(|conditions| conditions.into_iter().find(|c| c.type_ == READY));
    // The machine ID maps a FleetLock client (zincati) to its Node (`rollout/fleetlock.rs`).
    let kept_info = status
        .node_info
        .map(|info| (info.kubelet_version, info.machine_id));
    if ready.is_none() && kept_info.is_none() {
        return None;
    }
    Some(NodeStatus {
        conditions: ready.map(|ready| {
            vec![NodeCondition {
                type_: ready.type_,
                status: ready.status,
                reason: ready.reason,
                message: ready.message,
                ..NodeCondition::default()
            }]
        }),
        node_info: kept_info.map(|(kubelet_version, machine_id)| NodeSystemInfo {
            kubelet_version,
            machine_id,
            ..NodeSystemInfo::default()
        }),
        ..NodeStatus::default()
    })
}

/// The version the node's kubelet reports (`status.nodeInfo.kubeletVersion`); `None`
/// when it reports none (a Node no kubelet registered).
pub fn kubelet_version(node: &Node) -> Option<String> {
    let info = node.status.as_ref()?.node_info.as_ref()?;
    Some(info.kubelet_version.clone()).filter(|v| !v.is_empty())
}

/// The node's readiness: Ready only when its `Ready` condition is True. False and Unknown
/// (the node lifecycle controller's word for a kubelet that stopped reporting) are not,
/// nor is a Node without the condition: nothing vouches for it.
pub fn readiness(node: &Node) -> Readiness {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == READY));
    match ready {
        Some(c) if c.status == "True" => Readiness::Ready,
        Some(c) => Readiness::NotReady {
            why: match c.reason.as_deref() {
                Some(reason) if !reason.is_empty() => format!("Ready={} ({reason})", c.status),
                _ => format!("Ready={}", c.status),
            },
        },
        None => Readiness::NotReady {
            why: "no Ready condition".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn node(status: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n"}, "status": status})).unwrap()
    }

    fn condition(type_: &str, status: &str, reason: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason,
               "lastHeartbeatTime": "2026-11-26T00:00:00Z", "message": "m"})
    }

    #[test]
    fn only_a_true_ready_condition_is_ready() {
        let ready = node(json!({"conditions": [condition("Ready", "True", "KubeletReady")]}));
        assert_eq!(readiness(&ready), Readiness::Ready);
        let not = node(json!({"conditions": [condition("Ready", "False", "KubeletNotReady")]}));
        assert_eq!(
            readiness(&not),
            Readiness::NotReady {
                why: "Ready=False (KubeletNotReady)".into()
            }
        );
        let unknown = node(json!({"conditions": [condition("Ready", "Unknown", "")]}));
        assert_eq!(
            readiness(&unknown),
            Readiness::NotReady {
                why: "Ready=Unknown".into()
            }
        );
        let other = node(json!({"conditions": [condition("DiskPressure", "False", "x")]}));
        assert_eq!(
            readiness(&other),
            Readiness::NotReady {
                why: "no Ready condition".into()
            }
        );
        assert_eq!(
            readiness(&node(json!(null))),
            Readiness::NotReady {
                why: "no Ready condition".into()
            }
        );
    }

    #[test]
    fn the_cache_keeps_the_ready_condition_the_kubelet_version_and_the_machine_id() {
        let full = node(json!({
            "conditions": [condition("MemoryPressure", "False", "x"), condition("Ready", "False", "KubeletNotReady")],
            "images": [{"names": ["big"], "sizeBytes": 1}],
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "k",
                         "osImage": "o", "containerRuntimeVersion": "c", "kubeletVersion": "v1.36.3",
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        }));
        let slim = Node {
            status: slim_status(full.status.clone()),
            ..full.clone()
        };
        assert_eq!(readiness(&slim), readiness(&full));
        assert_eq!(kubelet_version(&slim).as_deref(), Some("v1.36.3"));
        assert_eq!(kubelet_version(&slim), kubelet_version(&full));
        let status = slim.status.unwrap();
        assert!(status.images.is_none());
        let info = status.node_info.unwrap();
        assert_eq!(info.machine_id, "m", "a FleetLock client is found by it");
        assert!(info.system_uuid.is_empty() && info.kernel_version.is_empty());
        let kept = status.conditions.unwrap();
        assert_eq!(kept.len(), 1);
        assert!(kept[0].last_heartbeat_time.is_none());
    }
}
