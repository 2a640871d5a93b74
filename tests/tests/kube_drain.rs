//! `disruption: Drain` meeting real kubelets: the controller cordons each node and evicts its
//! Pods through the Eviction API, the real kubelet stops their containers and deletes them (no
//! stand-in plays the kubelet here), the PodDisruptionBudget holds (an eviction that would
//! break it waits until a replacement runs), the Deployment's replacements run on the other
//! nodes, and the DaemonSet's Pods stay, their containers running through the kubelet swap.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use inplace_tests::install::workspace_binaries;
use inplace_tests::kube_node::cluster::rollout_manifest;
use inplace_tests::kube_node::workload::{
    Spread, daemonset_manifest, running_containers, web_manifest,
};
use inplace_tests::kube_node::{ClusterOptions, KubeCluster};
use k8s_openapi::api::apps::v1::Deployment;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_evicts_through_real_kubelets_holds_the_budget_and_leaves_daemonset_pods() {
    let work = tempfile::tempdir().unwrap();
    let (agent, controller) = workspace_binaries().await.unwrap();
    let options = ClusterOptions {
        dir: work.path().join("cluster"),
        nodes: 3,
        name_prefix: "drain".to_owned(),
        kubelet: "v1.36.1".to_owned(),
        agent,
        controller: Some(controller),
    };
    let cluster = KubeCluster::start(&options, &|step| eprintln!("bed: {step}"))
        .await
        .unwrap();
    cluster.apply("node-agent", &daemonset_manifest()).unwrap();
    cluster
        .apply("web", &web_manifest(3, Spread::Preferred))
        .unwrap();
    for workload in ["daemonset/node-agent", "deployment/web"] {
        cluster
            .kubectl(&["rollout", "status", workload, "--timeout=300s"])
            .unwrap();
    }
    let daemons = running_containers(&cluster, "app=node-agent")
        .await
        .unwrap();
    let web = running_containers(&cluster, "app=web").await.unwrap();
    assert_eq!((daemons.len(), web.len()), (3, 3));

    // The fewest available web Pods at any moment of the rollout (the budget says 2).
    let fewest = Arc::new(AtomicI32::new(i32::MAX));
    let deployments: kube::Api<Deployment> =
        kube::Api::namespaced(cluster.client().await.unwrap(), "default");
    let record = fewest.clone();
    let sampler = tokio::spawn(async move {
        loop {
            if let Ok(d) = deployments.get("web").await {
                let available = d.status.and_then(|s| s.available_replicas).unwrap_or(0);
                record.fetch_min(available, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    cluster
        .apply("release", &cluster.release_manifest("v1.36.3").unwrap())
        .unwrap();
    cluster
        .apply("rollout", &rollout_manifest("kubelet-v1.36.3", "Drain"))
        .unwrap();
    cluster
        .wait_plans("Succeeded", Duration::from_secs(900))
        .await
        .unwrap();
    sampler.abort();
    cluster
        .kubectl(&["rollout", "status", "deployment/web", "--timeout=300s"])
        .unwrap();

    let fewest = fewest.load(Ordering::Relaxed);
    eprintln!("fewest available web Pods during the rollout: {fewest}");
    assert!(
        fewest >= 2,
        "the budget (minAvailable 2) was broken: {fewest}"
    );
    let web_after = running_containers(&cluster, "app=web").await.unwrap();
    assert_eq!(web_after.len(), 3, "{web_after:?}");
    assert!(
        web_after
            .values()
            .all(|c| !web.values().any(|b| b.pod_uid == c.pod_uid)),
        "every web Pod was evicted and replaced: before {web:?}\nafter {web_after:?}"
    );
    assert_eq!(
        running_containers(&cluster, "app=node-agent")
            .await
            .unwrap(),
        daemons,
        "the DaemonSet's Pods were left alone and kept their containers"
    );
    let nodes = cluster
        .kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.unschedulable} {.status.nodeInfo.kubeletVersion}{\"\\n\"}{end}",
        ])
        .unwrap();
    for line in nodes.lines() {
        assert!(
            line.ends_with("  v1.36.3"),
            "uncordoned, on v1.36.3: {line:?}"
        );
    }
}
