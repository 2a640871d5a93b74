//! The skew guard against the real kube-apiserver (its `/version` is the pinned release's,
//! v1.36.3): a release that brings a kubelet newer than the server, one that skips a minor
//! version, and one that goes down are refused before any plan is written, and go ahead
//! once the rollout allows them. Nodes are simulated: no kubelet runs, so each Node's
//! `status.nodeInfo.kubeletVersion` is written here as its kubelet would report it, and
//! simulated agents (`support::sim_agent`) carry out the plans.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used)]

mod support;

use inplace_proto::{NodeRelease, NodeRollout};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::sim_agent::SimConfig;
use support::*;

/// Creates a release whose `kubernetesVersion` is `version` (its content, and so its
/// revision, differs by version).
async fn create_kubernetes_release(client: &kube::Client, name: &str, version: &str) {
    let mut body = release_json(name, version);
    body["spec"]["kubernetesVersion"] = json!(version);
    let release: NodeRelease = serde_json::from_value(body).unwrap();
    Api::<NodeRelease>::all(client.clone())
        .create(&PostParams::default(), &release)
        .await
        .unwrap();
}

/// Writes the version the node's kubelet reports, as a kubelet does on start.
async fn set_kubelet_version(client: &kube::Client, node: &str, version: &str) {
    Api::<Node>::all(client.clone())
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"kubeletVersion": version}}})),
        )
        .await
        .unwrap();
}

/// The rollout once its `Progressing` condition refuses `release` with `reason`; its message.
async fn refused_with(client: &kube::Client, rollout: &str, release: &str, reason: &str) -> String {
    let named = format!("release {release:?}");
    let found = rollout_when(client, rollout, reason, |r| {
        has_condition(r, "Progressing", "False", reason)
            && condition(r, "Progressing").is_some_and(|(_, _, m)| m.contains(&named))
    })
    .await;
    condition(&found, "Progressing").unwrap().2
}

async fn plan_count(bed: &Bed) -> usize {
    bed.plans()
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len()
}

fn assert_names(message: &str, words: &[&str]) {
    for word in words {
        assert!(message.contains(word), "{word:?} in {message:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_newer_than_the_server_a_skipped_minor_and_a_downgrade_are_refused_until_allowed()
{
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    let server = bed.client.apiserver_version().await.unwrap().git_version;
    for (node, kubelet) in [("worker-1", "v1.34.2"), ("worker-2", "v1.35.4")] {
        create_node(&bed.client, node, &[]).await;
        set_kubelet_version(&bed.client, node, kubelet).await;
    }
    create_kubernetes_release(&bed.client, "kubelet-v1.99.0", "v1.99.0").await;
    create_kubernetes_release(&bed.client, "kubelet-v1.36.3", "v1.36.3").await;
    create_kubernetes_release(&bed.client, "kubelet-v1.35.0", "v1.35.0").await;

    create_rollout(&bed.client, "ro", json!({"release": "kubelet-v1.99.0"})).await;
    let message = refused_with(&bed.client, "ro", "kubelet-v1.99.0", "VersionSkewDenied").await;
    assert_names(
        &message,
        &[
            "\"kubelet-v1.99.0\" brings kubelet v1.99.0",
            &format!("newer than the API server's {server}"),
            "allowVersionSkew",
            "no node is touched",
        ],
    );

    patch_rollout(&bed.client, "ro", json!({"release": "kubelet-v1.36.3"})).await;
    let message = refused_with(&bed.client, "ro", "kubelet-v1.36.3", "VersionSkewDenied").await;
    assert_names(
        &message,
        &[
            "brings kubelet v1.36.3, more than one minor version above the kubelet of 1 node: worker-1 (v1.34.2)",
            "allowVersionSkew",
        ],
    );

    patch_rollout(&bed.client, "ro", json!({"release": "kubelet-v1.35.0"})).await;
    let message = refused_with(&bed.client, "ro", "kubelet-v1.35.0", "DowngradeDenied").await;
    assert_names(
        &message,
        &[
            "brings kubelet v1.35.0, lower than the kubelet of 1 node: worker-2 (v1.35.4)",
            "allowDowngrade",
        ],
    );
    assert_eq!(
        plan_count(&bed).await,
        0,
        "no plan is written while refused"
    );
    let reasons: Vec<String> = events_for(&bed.client, "ro")
        .await
        .into_iter()
        .map(|(reason, _)| reason)
        .collect();
    for wanted in ["VersionSkewDenied", "DowngradeDenied"] {
        assert!(
            reasons.iter().any(|r| r == wanted),
            "{wanted} in {reasons:?}"
        );
    }

    // Allowed: worker-1 skips v1.35, and nobody goes down.
    patch_rollout(
        &bed.client,
        "ro",
        json!({"release": "kubelet-v1.36.3", "allowVersionSkew": true}),
    )
    .await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert_eq!(plan_count(&bed).await, 2);
    let rollout: NodeRollout = bed.rollouts().get("ro").await.unwrap();
    assert!(rollout.spec.allow_version_skew, "the field is stored");
}
