//! `disruption: Drain` meeting real kubelets: the controller cordons each node and evicts its
//! Pods through the Eviction API, the real kubelet stops their containers and deletes them (no
//! stand-in plays the kubelet here), the PodDisruptionBudget holds (an eviction that would
//! break it waits until a replacement runs: never fewer Pods running than it allows), the
//! Deployment's replacements run on the other
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
use k8s_openapi::api::core::v1::Pod;

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
        kubelet_path: None,
    };
    let cluster = KubeCluster::start(&options, &|step| eprintln!("bed: {step}"))
        .await
        .unwrap();
    cluster.apply("node-agent", &daemonset_manifest()).unwrap();
    cluster
        .apply("web", &web_manifest("default", 3, Spread::Preferred))
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

    // The fewest web Pods running and not being deleted at any moment of the rollout: what the
    // drain's evictions take away (the budget says at least 2). Counted from the Pods, not
    // from the Deployment's availability, which also drops when a loaded machine delays a
    // Node's heartbeat past the node lifecycle controller's grace period.
    let fewest = Arc::new(AtomicI32::new(i32::MAX));
    let pods: kube::Api<Pod> = kube::Api::namespaced(cluster.client().await.unwrap(), "default");
    let record = fewest.clone();
    let sampler = tokio::spawn(async move {
        let web = kube::api::ListParams::default().labels("app=web");
        loop {
            if let Ok(list) = pods.list(&web).await {
                let running = list
                    .items
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count();
                record.fetch_min(
                    i32::try_from(running).unwrap_or(i32::MAX),
                    Ordering::Relaxed,
                );
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
    eprintln!("fewest running web Pods during the rollout: {fewest}");
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
