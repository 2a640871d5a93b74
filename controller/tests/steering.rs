//! Per-node steering end to end, on the real kube-apiserver with simulated agents and the
//! controller running as its shipped ServiceAccount: a node held with `inplace.dev/hold` is
//! staged but never activated until released, a node skipped with `inplace.dev/skip` keeps
//! the revision it runs and is counted as skipped, and the rollout completes around both.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used)]

mod support;

use inplace_proto::DesiredState;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use support::sim_agent::SimConfig;
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

fn names(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_node_waits_for_its_release_and_a_skipped_node_is_left_alone() {
    let bed = Bed::start_with_shipped_rbac().await;
    let _fleet = bed.fleet(SimConfig::default());
    for name in ["held", "skipped", "worker"] {
        create_node(&bed.client, name, &[]).await;
    }
    annotate_node(&bed.client, "held", "inplace.dev/hold", Some("true")).await;
    annotate_node(&bed.client, "skipped", "inplace.dev/skip", Some("true")).await;
    create_release(&bed.client, "rel", "v2").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 2}),
    )
    .await;

    // Everything that can finish does; the held node is staged and waits.
    let rollout = rollout_when(&bed.client, "ro", "worker updated, held staged", |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.nodes.succeeded == 1 && s.nodes.staged == 1 && s.nodes.skipped == 1)
    })
    .await;
    let status = rollout.status.unwrap();
    assert_eq!(names(&status.held_nodes), ["held"]);
    assert_eq!(names(&status.skipped_nodes), ["skipped"]);
    assert_eq!(status.nodes.failed, 0);
    assert!(has_condition(
        &rollout_now(&bed).await,
        "Complete",
        "False",
        "RollingOut"
    ));
    let held_plan = bed.plans().get("held").await.unwrap();
    assert_eq!(held_plan.spec.desired_state, DesiredState::Staged);
    assert!(
        bed.plans().get_opt("skipped").await.unwrap().is_none(),
        "a node skipped before staging gets no plan"
    );

    // Released: activated, and the rollout completes with the skipped node kept as it was.
    annotate_node(&bed.client, "held", "inplace.dev/hold", None).await;
    let done = rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let status = done.status.unwrap();
    assert_eq!((status.nodes.succeeded, status.nodes.skipped), (2, 1));
    assert!(status.held_nodes.is_empty());
    let (_, _, message) = condition(&rollout_now(&bed).await, "Complete").unwrap();
    assert!(message.contains("1 skipped"), "{message}");
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
}

async fn rollout_now(bed: &Bed) -> inplace_proto::NodeRollout {
    bed.rollouts().get("ro").await.unwrap()
}
