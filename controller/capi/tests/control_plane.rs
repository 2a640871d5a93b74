//! Control-plane Machines over HTTPS, against a real self-hosted management cluster:
//! a Machine labelled `cluster.x-k8s.io/control-plane` (as KubeadmControlPlane labels every
//! Machine it owns) is not claimed, and not updated, with a release that does not say it
//! updates control-plane nodes; with one that does, it is claimed and updated like a worker.

use crate::common;

use common::*;
use serde_json::{Value, json};

const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// The Machine KubeadmControlPlane hands to the hooks, at `version` on node-1: the worker
/// Machine of the golden request, relabelled as KCP labels its Machines.
fn control_plane_machine(version: &str) -> Value {
    let mut machine = machine(version, Some("node-1"));
    let labels = &mut machine["metadata"]["labels"];
    labels
        .as_object_mut()
        .unwrap()
        .remove("cluster.x-k8s.io/deployment-name");
    labels[CONTROL_PLANE_LABEL] = json!("");
    labels["cluster.x-k8s.io/control-plane-name"] = json!("c1-control-plane");
    machine["metadata"]["name"] = json!("c1-control-plane-7xk2q");
    machine
}

async fn can_update(bed: &Bed, from: &str, to: &str) -> Value {
    let infra = update_machine_object("infrastructureMachine");
    let (status, answer) = bed
        .post(
            &format!("{HOOKS}/canupdatemachine/can-update-machine"),
            &can_update_machine_request(
                &control_plane_machine(from),
                &control_plane_machine(to),
                &infra,
                &infra,
            ),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["status"], "Success", "{answer}");
    answer
}

#[tokio::test]
async fn a_control_plane_machine_is_refused_a_release_that_does_not_opt_in() {
    let bed = Bed::start().await;
    let answer = can_update(&bed, "v1.31.1", "v1.31.2").await;
    assert!(answer.get("machinePatch").is_none(), "{answer}");
    assert_eq!(
        answer["message"],
        "not claimed: machine spec.version -> v1.31.2: this is a control-plane Machine (label cluster.x-k8s.io/control-plane) and NodeRelease kubernetes-v1.31.2 does not say it updates control-plane nodes (spec.updatesControlPlane is not true): updating only the kubelet would leave the API server and the other control-plane static Pods at the old version, so Cluster API replaces the Machine instead"
    );

    // Asked to update it all the same (the stored Machine is marked as Cluster API marks
    // it), the extension fails the call with the same reason and writes no plan.
    let answer = bed.update_machine(&control_plane_machine("v1.31.2")).await;
    assert_eq!(answer["status"], "Failure", "{answer}");
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.starts_with("cannot update Machine tenant-a/c1-control-plane-7xk2q in place: this is a control-plane Machine"),
        "{message}"
    );
    assert_eq!(bed.plan_count().await, 0);
    bed.stop().await;
}

#[tokio::test]
async fn a_control_plane_machine_is_claimed_and_updated_with_a_release_that_opts_in() {
    let bed = Bed::start().await;
    release_fixture("kubernetes-v1.31.4-control-plane", "v1.31.4")
        .updates_control_plane()
        .create(&bed.management_client)
        .await
        .unwrap();
    let agent = sim_agents(&bed).await;

    let answer = can_update(&bed, "v1.31.1", "v1.31.4").await;
    let patch = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        answer["machinePatch"]["patch"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&patch).unwrap(),
        json!([{"op": "replace", "path": "/spec/version", "value": "v1.31.4"}])
    );
    assert_eq!(
        answer["message"],
        "claimed machine spec.version v1.31.1 -> v1.31.4 (NodeRelease kubernetes-v1.31.4-control-plane)"
    );

    let desired = control_plane_machine("v1.31.4");
    let mut answers = Vec::new();
    loop {
        let answer = bed.update_machine(&desired).await;
        assert_eq!(answer["status"], "Success", "{answer}");
        answers.push(answer["message"].as_str().unwrap_or_default().to_owned());
        if answer["retryAfterSeconds"] == 0 {
            break;
        }
        assert!(answers.len() < 12, "{answers:?}");
        agent.step().await.unwrap();
    }
    assert!(
        answers
            .last()
            .unwrap()
            .starts_with("node node-1 runs kubernetes-v1.31.4-control-plane"),
        "{answers:?}"
    );
    bed.stop().await;
}
