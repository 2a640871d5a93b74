//! Per-node steering end to end, on the real kube-apiserver with simulated agents and the
//! controller running as its shipped ServiceAccount (so its RBAC must allow every Event):
//! a node held with `inplace.dev/hold` is staged but never activated until released, a node
//! skipped with `inplace.dev/skip` keeps the revision it runs and is counted as skipped, a
//! failed node that is skipped un-halts the rollout, and the rollout completes around them.
//! `kubectl describe node` (the pinned release's kubectl) shows each node's own story. The
//! controller's own pass-over, too: a node whose `kubernetes.io/arch` has no build in the
//! release is skipped, and `kubectl get` / `describe` say which and why.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use inplace_proto::{DesiredState, Phase};
use inplace_tests::fixtures::ReleaseFixture;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use support::sim_agent::{Failure, SimConfig};
use support::*;

/// Sets (`Some`) or removes (`None`) one annotation on a Node, as `kubectl annotate` does.
async fn annotate_node(client: &kube::Client, node: &str, key: &str, value: Option<&str>) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap();
}

/// Simulated agents where node `broken` rolls back (`HealthCheckFailed`) — until a retry is
/// honoured, when `fixed_by_retry`.
fn broken_fleet_config(fixed_by_retry: bool) -> SimConfig {
    let mut config = SimConfig::default();
    config
        .failures
        .insert("broken".into(), Failure::rolled_back("HealthCheckFailed"));
    if fixed_by_retry {
        config.fixed_by_retry.insert("broken".into());
    }
    config
}

/// Release `rel` and rollout `ro` over every node, halting on the first failure.
async fn roll_out(bed: &Bed, max_unavailable: i32) {
    create_release(&bed.client, "rel", "v2").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": max_unavailable, "maxFailures": 0}),
    )
    .await;
}

fn names(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

/// `kubectl describe KIND NAME` once it names every one of `reasons` among its Events.
async fn described_with(bed: &Bed, kind: &str, name: &str, reasons: &[&str]) -> String {
    let real = bed.api.real().expect("the real API server");
    let mut last = String::new();
    for _ in 0..60 {
        last = real.run_kubectl(&["describe", kind, name]).unwrap();
        if reasons.iter().all(|r| last.contains(r)) {
            return last;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let all = real
        .run_kubectl(&["get", "events", "-A", "-o", "wide"])
        .unwrap();
    panic!("kubectl describe {kind} {name} does not show {reasons:?}:\n{last}\n{all}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_skipped_and_failed_nodes_are_steered_and_each_node_tells_its_story() {
    let bed = Bed::start_with_shipped_rbac().await;
    let _fleet = bed.fleet(broken_fleet_config(false));
    for name in ["broken", "held", "skipped", "worker"] {
        create_node(&bed.client, name, &[]).await;
    }
    annotate_node(&bed.client, "held", "inplace.dev/hold", Some("true")).await;
    annotate_node(&bed.client, "skipped", "inplace.dev/skip", Some("true")).await;
    roll_out(&bed, 2).await;

    // broken rolls back and halts the rollout; worker updates; held waits staged.
    let rollout = rollout_when(&bed.client, "ro", "halted, worker updated", |r| {
        has_condition(r, "Halted", "True", "TooManyFailures")
            && r.status.as_ref().is_some_and(|s| {
                s.nodes.succeeded == 1 && s.nodes.staged == 1 && s.nodes.skipped == 1
            })
    })
    .await;
    let status = rollout.status.unwrap();
    assert_eq!(names(&status.held_nodes), ["held"]);
    assert_eq!(names(&status.skipped_nodes), ["skipped"]);
    let held_plan = bed.plans().get("held").await.unwrap();
    assert_eq!(held_plan.spec.desired_state, DesiredState::Staged);
    assert!(
        bed.plans().get_opt("skipped").await.unwrap().is_none(),
        "a node skipped before staging gets no plan"
    );

    // Skipping the broken node un-halts the rollout; released, held is activated.
    annotate_node(&bed.client, "broken", "inplace.dev/skip", Some("true")).await;
    rollout_when(&bed.client, "ro", "un-halted", |r| {
        has_condition(r, "Halted", "False", "AsExpected")
    })
    .await;
    annotate_node(&bed.client, "held", "inplace.dev/hold", None).await;
    let done = rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let status = done.status.unwrap();
    assert_eq!((status.nodes.succeeded, status.nodes.skipped), (2, 2));
    assert_eq!((status.nodes.failed, status.held_nodes.len()), (0, 0));
    let (_, _, message) = condition(&done_now(&bed).await, "Complete").unwrap();
    assert!(message.contains("2 skipped"), "{message}");
    let reasons: Vec<String> = events_for(&bed.client, "ro")
        .await
        .into_iter()
        .map(|(reason, _)| reason)
        .collect();
    for reason in ["NodeHeld", "NodeSkipped", "NodeReleased"] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "{reason} in {reasons:?}"
        );
    }

    // Each node's own story, where a person looks for it.
    described_with(
        &bed,
        "node",
        "held",
        &[
            "InplaceHeld",
            "InplaceReleased",
            "InplaceActivated",
            "InplaceSucceeded",
        ],
    )
    .await;
    described_with(
        &bed,
        "node",
        "broken",
        &["InplaceActivated", "InplaceRolledBack", "InplaceSkipped"],
    )
    .await;
    described_with(&bed, "node", "skipped", &["InplaceSkipped"]).await;
    described_with(
        &bed,
        "nodeupdateplan",
        "held",
        &["InplaceActivated", "InplaceSucceeded"],
    )
    .await;
}

async fn done_now(bed: &Bed) -> inplace_proto::NodeRollout {
    bed.rollouts().get("ro").await.unwrap()
}

/// `inplace.dev/retry` end to end: a node that rolled back halts the rollout; the token a
/// person sets on its plan (with the pinned kubectl, as docs/usage shows) un-halts it, the
/// controller moves the plan back to `Staged`, the agent honours the token once and stages
/// again, and the node is granted, activated and succeeds. The token is set while the
/// controller is down: the agent waits for the plan to say `Staged`, and the new controller
/// finds everything on the plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_node_retried_with_a_token_is_staged_again_and_updated() {
    let mut bed = Bed::start_with_shipped_rbac().await;
    let _fleet = bed.fleet(broken_fleet_config(true));
    for name in ["broken", "worker"] {
        create_node(&bed.client, name, &[]).await;
    }
    roll_out(&bed, 1).await;
    // Whichever node stages first is granted first: worker may have succeeded already.
    rollout_when(&bed.client, "ro", "halted by broken", |r| {
        has_condition(r, "Halted", "True", "TooManyFailures")
            && r.status.as_ref().is_some_and(|s| s.nodes.failed == 1)
    })
    .await;

    // The token is set while no controller runs: the agent must not act on it while the
    // plan still says Active (that would activate without a slot).
    bed.stop_controller().await;
    let real = bed.api.real().expect("the real API server");
    real.run_kubectl(&[
        "annotate",
        "nodeupdateplan",
        "broken",
        "inplace.dev/retry=t1",
        "--overwrite",
    ])
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let waiting = bed.plans().get("broken").await.unwrap();
    assert_eq!(waiting.spec.desired_state, DesiredState::Active);
    assert_eq!(waiting.status.unwrap().retry_honoured, None);
    let config = shipped_controller_identity(&bed.api).await;
    let (_metrics, _stop, _controller) = start_controller(config, test_settings());
    let done = rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let status = done.status.unwrap();
    assert_eq!((status.nodes.succeeded, status.nodes.failed), (2, 0));
    let plan = bed.plans().get("broken").await.unwrap();
    let plan_status = plan.status.unwrap();
    assert_eq!(plan_status.retry_honoured.as_deref(), Some("t1"));
    assert_eq!(plan_status.phase, Some(Phase::Succeeded));
}

/// The architecture preflight through the API: a release built for amd64 and arm64, nodes
/// labelled `kubernetes.io/arch` amd64, arm64 and riscv64. The riscv64 node gets no plan and
/// is counted as skipped, not failed (`maxFailures: 0` would halt on it); the others update
/// and the rollout completes; `NodesUnsupported` names the node and its architecture, with a
/// Warning Event, and `kubectl get noderollouts` counts it under SKIPPED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_build_for_its_architecture_is_passed_over_and_the_rest_completes() {
    let bed = Bed::start_with_shipped_rbac().await;
    let _fleet = bed.fleet(SimConfig::default());
    for (name, arch) in [("x86", "amd64"), ("arm", "arm64"), ("riscv", "riscv64")] {
        create_node(&bed.client, name, &[("kubernetes.io/arch", arch)]).await;
    }
    ReleaseFixture::kubelet("rel", "v2", "v1.31.2")
        .artifact(json!({
            "name": "kubernetes", "type": "Sysext", "architecture": "amd64",
            "url": "https://extensions.example/kubernetes-v2-x86-64.raw",
            "sha256": "4f0c".repeat(16),
            "otherArchitectures": [{
                "architecture": "arm64",
                "url": "https://extensions.example/kubernetes-v2-arm64.raw",
                "sha256": "5e1d".repeat(16),
            }],
        }))
        .create(&bed.client)
        .await
        .unwrap();
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 2, "maxFailures": 0}),
    )
    .await;

    let done = rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let (status, reason, message) = condition(&done, "NodesUnsupported").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ArchitectureUnsupported")
    );
    assert!(
        message.contains("built for amd64, arm64): riscv (riscv64);"),
        "{message}"
    );
    let status = done.status.unwrap();
    let counts = &status.nodes;
    assert_eq!((counts.succeeded, counts.skipped, counts.failed), (2, 1, 0));
    assert_eq!(names(&status.skipped_nodes), ["riscv"]);
    assert!(
        bed.plans().get_opt("riscv").await.unwrap().is_none(),
        "a node without a build for its architecture gets no plan"
    );
    assert!(
        events_for(&bed.client, "ro")
            .await
            .iter()
            .any(|(reason, note)| reason == "ArchitectureUnsupported" && note.contains("riscv")),
        "a Warning Event names the node"
    );

    let real = bed.api.real().expect("the real API server");
    let table = real.run_kubectl(&["get", "noderollouts", "ro"]).unwrap();
    let (header, row) = table.trim().split_once('\n').expect("a header and a row");
    let skipped_column = header.split_whitespace().position(|c| c == "SKIPPED");
    let row: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(skipped_column.map(|i| row[i]), Some("1"), "{table}");
    described_with(
        &bed,
        "noderollout",
        "ro",
        &["NodesUnsupported", "riscv (riscv64)"],
    )
    .await;
}
