//! A Node's `Ready` condition, as the rollout's health gate reads it
//! (`decision/health.rs`): the cached Node keeps that condition and nothing else of its
//! status ([`keep_ready_condition_only`]), and [`readiness`] reads it.

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};

use crate::decision::Readiness;

/// The Node condition the gate reads.
const READY: &str = "Ready";

/// Drops every part of a Node's status but its `Ready` condition's type, status, reason
/// and message (no heartbeat times: 30,000 cached Nodes stay small, and the cache holds
/// nothing the gate does not read).
pub fn keep_ready_condition_only(status: Option<NodeStatus>) -> Option<NodeStatus> {
    let ready = status?.conditions?.into_iter().find(|c| c.type_ == READY)?;
    Some(NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: ready.type_,
            status: ready.status,
            reason: ready.reason,
            message: ready.message,
            ..NodeCondition::default()
        }]),
        ..NodeStatus::default()
    })
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
    fn the_cache_keeps_the_ready_condition_and_reads_the_same() {
        let full = node(json!({
            "conditions": [condition("MemoryPressure", "False", "x"), condition("Ready", "False", "KubeletNotReady")],
            "images": [{"names": ["big"], "sizeBytes": 1}],
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "k",
                         "osImage": "o", "containerRuntimeVersion": "c", "kubeletVersion": "v",
                         "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        }));
        let slim = Node {
            status: keep_ready_condition_only(full.status.clone()),
            ..full.clone()
        };
        assert_eq!(readiness(&slim), readiness(&full));
        let status = slim.status.unwrap();
        assert!(status.images.is_none() && status.node_info.is_none());
        let kept = status.conditions.unwrap();
        assert_eq!(kept.len(), 1);
        assert!(kept[0].last_heartbeat_time.is_none());
    }
}
