use serde_json::json;

use super::*;

fn node(name: &str, labels: serde_json::Value) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }))
    .unwrap()
}

fn release() -> NodeRelease {
    serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
        "metadata": {"name": "rel", "generation": 1},
        "spec": {
            "version": "v1",
            "artifacts": [{"name": "kubernetes", "type": "Sysext",
                "url": "https://extensions.example/k.raw", "sha256": "4f0c".repeat(16), "size": 1000}],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"units": ["kubelet.service"], "window": "1s", "timeout": "1m"},
        },
    }))
    .unwrap()
}

fn rollout(spec: serde_json::Value) -> NodeRollout {
    serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": "ro"}, "spec": spec,
    }))
    .unwrap()
}

#[test]
fn waves_follow_the_slots() {
    let nodes: Vec<Node> = (1..=5)
        .map(|i| node(&format!("w-{i}"), json!({})))
        .collect();
    let release = release();
    let cluster = Cluster {
        nodes: &nodes,
        plans: &[],
        rollouts: &[],
        release: Some(&release),
        api_server_version: None,
        now: "2026-11-28T12:00:00Z".parse().unwrap(),
    };
    let preview = preview(
        &rollout(json!({"release": "rel", "maxUnavailable": 2})),
        &cluster,
    )
    .unwrap();
    let waves: Vec<Vec<String>> = preview.waves.iter().map(|w| w.nodes.clone()).collect();
    assert_eq!(waves, [vec!["w-1", "w-2"], vec!["w-3", "w-4"], vec!["w-5"]]);
}
