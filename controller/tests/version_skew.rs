//! The skew guard against the real kube-apiserver (its `/version` is the pinned release's,
//! v1.36.3): a release that brings a kubelet newer than the server, one that skips a minor
//! version, and one that goes down are refused before any plan is written, and go ahead
//! once the rollout allows them; and the fleet rolled back by naming the earlier release,
//! as docs/usage/standalone-rollouts.md § Rolling back the fleet says. Nodes are
//! simulated: no kubelet runs, so each Node's `status.nodeInfo.kubeletVersion` is written
//! here as its kubelet would report it, and simulated agents (`support::sim_agent`) carry
//! out the plans.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::path::Path;

use inplace_proto::{NodeRollout, Phase};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use support::sim_agent::SimConfig;
use support::*;

/// Creates a release whose `kubernetesVersion` is `version` (its content, and so its
/// revision, differs by version).
async fn create_kubernetes_release(client: &kube::Client, name: &str, version: &str) {
    release(name, version)
        .kubernetes_version(version)
        .create(client)
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

/// The commands of docs/usage/standalone-rollouts.md § Rolling back the fleet, each as its
/// words (a single-quoted word kept whole, as the shell does).
fn documented_rollback() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/standalone-rollouts.md"),
    )
    .unwrap();
    let section = &doc[doc.find("### Rolling back the fleet").unwrap()..];
    let block = section.split("```sh\n").nth(1).unwrap();
    let block = &block[..block.find("```").unwrap()];
    block
        .lines()
        .filter(|line| line.starts_with("kubectl "))
        .map(|line| {
            line.split('\'')
                .enumerate()
                .flat_map(|(i, part)| {
                    if i % 2 == 1 {
                        vec![part.to_owned()]
                    } else {
                        part.split_whitespace().map(str::to_owned).collect()
                    }
                })
                .skip(1)
                .collect()
        })
        .collect()
}

/// Runs one documented command with the release's kubectl as the admin.
async fn kubectl(bed: &Bed, words: &[String]) -> String {
    let api = bed.api.clone();
    let words = words.to_vec();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = words.iter().map(String::as_str).collect();
        api.real()
            .expect("the real API server")
            .run_kubectl(&args)
            .unwrap()
    })
    .await
    .unwrap()
}

async fn plan_revisions(bed: &Bed) -> Vec<(Option<String>, Option<String>)> {
    let plans = bed.plans().list(&Default::default()).await.unwrap().items;
    plans
        .into_iter()
        .map(|p| {
            let current = p.status.and_then(|s| s.current_revision);
            (p.spec.revision, current)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_rolls_back_by_naming_the_earlier_release_once_the_downgrade_is_allowed() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    let nodes = ["worker-1", "worker-2"];
    for node in nodes {
        create_node(&bed.client, node, &[]).await;
        set_kubelet_version(&bed.client, node, "v1.31.2").await;
    }
    create_kubernetes_release(&bed.client, "kubernetes-v1.31.2", "v1.31.2").await;
    create_kubernetes_release(&bed.client, "kubernetes-v1.31.3", "v1.31.3").await;
    create_rollout(
        &bed.client,
        "workers",
        json!({"release": "kubernetes-v1.31.3", "maxUnavailable": 1}),
    )
    .await;
    let forward = rollout_when(&bed.client, "workers", "Complete=True at v1.31.3", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let later = forward.status.unwrap().revision;
    for node in nodes {
        set_kubelet_version(&bed.client, node, "v1.31.3").await;
    }

    let commands = documented_rollback();
    assert_eq!(commands.len(), 4, "{commands:?}");
    kubectl(&bed, &commands[0]).await;
    let message = refused_with(
        &bed.client,
        "workers",
        "kubernetes-v1.31.2",
        "DowngradeDenied",
    )
    .await;
    assert_names(
        &message,
        &[
            "brings kubelet v1.31.2, lower than the kubelet of 2 nodes: worker-1 (v1.31.3), worker-2 (v1.31.3)",
            "allowDowngrade",
        ],
    );
    let shown = kubectl(&bed, &commands[1]).await;
    assert!(
        shown.contains("lower than the kubelet of 2 nodes"),
        "{shown}"
    );
    for (revision, current) in plan_revisions(&bed).await {
        assert_eq!(revision, later, "a refused rollback touches no plan");
        assert_eq!(current, later);
    }

    kubectl(&bed, &commands[2]).await;
    let back = rollout_when(&bed.client, "workers", "Complete=True at v1.31.2", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
            && r.status.as_ref().unwrap().revision != later
    })
    .await;
    let earlier = bed
        .releases()
        .get("kubernetes-v1.31.2")
        .await
        .unwrap()
        .status
        .unwrap()
        .revision;
    assert_eq!(back.status.unwrap().revision, earlier);
    for (revision, current) in plan_revisions(&bed).await {
        assert_eq!(
            revision, earlier,
            "the plan names the earlier release again"
        );
        assert_eq!(current, earlier, "and the node runs it");
    }
    for node in nodes {
        let plan = bed.plans().get(node).await.unwrap();
        assert!(plan.spec.allow_downgrade, "the permission reaches the plan");
        assert_eq!(plan.status.unwrap().phase, Some(Phase::Succeeded));
    }
    let shown = kubectl(&bed, &commands[3]).await;
    let row = shown.lines().find(|l| l.starts_with("workers")).unwrap();
    assert!(
        row.contains("kubernetes-v1.31.2") && row.contains("True"),
        "{shown}"
    );
}
