//! A Machine whose node has no build in the release (issue 39), over HTTPS against a real
//! self-hosted management cluster: `CanUpdateMachine` does not claim it (the stored
//! Machine names its node's architecture, as Cluster API copies it from the Node), so Cluster
//! API replaces it; `UpdateMachine`, asked all the same, fails naming the architecture and
//! writes no plan (the workload Node's `kubernetes.io/arch` says it).

use crate::common;

use common::*;
use inplace_tests::fixtures::ReleaseFixture;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

const RELEASE: &str = "kubernetes-v1.31.5-arm64";

/// The worker Machine at `version` on node-1, an amd64 node, with the status Cluster API
/// keeps for it.
fn amd64_machine(version: &str) -> Value {
    let mut machine = machine(version, Some("node-1"));
    machine["status"]["nodeInfo"] = json!({
        "architecture": "amd64", "operatingSystem": "linux", "bootID": "b1",
        "machineID": "m1", "systemUUID": "s1", "kernelVersion": "6.1.0",
        "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.24",
        "kubeletVersion": version, "kubeProxyVersion": "",
    });
    machine
}

#[tokio::test]
async fn a_machine_whose_node_has_no_build_in_the_release_is_neither_claimed_nor_updated() {
    let bed = Bed::start().await;
    ReleaseFixture::kubelet(RELEASE, "v1.31.5", "v1.31.5")
        .artifact(
            json!({"name": "kubernetes", "type": "Sysext", "architecture": "arm64",
            "url": "https://extensions.example/kubernetes/kubernetes-v1.31.5-arm64.raw",
            "sha256": "4f0c9a1b".repeat(8)}),
        )
        .node_kubelet_version()
        .checked_for("30s", "5m")
        .create(&bed.management_client)
        .await
        .unwrap();
    let label = json!({"metadata": {"labels": {"kubernetes.io/arch": "amd64"}}});
    Api::<Node>::all(bed.workload_client.clone())
        .patch("node-1", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let current = amd64_machine("v1.31.1");
    bed.store_machine(&current).await;

    let infra = update_machine_object("infrastructureMachine");
    let (status, answer) = bed
        .post(
            &format!("{HOOKS}/canupdatemachine/can-update-machine"),
            &can_update_machine_request(&current, &amd64_machine("v1.31.5"), &infra, &infra),
        )
        .await;
    assert_eq!(
        (status, &answer["status"]),
        (200, &json!("Success")),
        "{answer}"
    );
    assert!(answer.get("machinePatch").is_none(), "{answer}");
    let why = format!(
        "the node runs amd64 and NodeRelease {RELEASE} has no build for it (its artifacts are built for arm64), so Cluster API replaces the Machine instead"
    );
    assert_eq!(
        answer["message"],
        format!("not claimed: machine spec.version -> v1.31.5: {why}")
    );

    let answer = bed.update_machine(&amd64_machine("v1.31.5")).await;
    assert_eq!(answer["status"], "Failure", "{answer}");
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.starts_with("cannot update Machine tenant-a/") && message.ends_with(&why),
        "{message}"
    );
    assert_eq!(bed.plan_count().await, 0);
    bed.stop().await;
}
