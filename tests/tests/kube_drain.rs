//! `disruption: Drain` meeting real kubelets: the controller cordons each node and evicts its
//! Pods through the Eviction API, the real kubelet stops their containers and deletes them (no
//! stand-in plays the kubelet here), the PodDisruptionBudget holds (an eviction that would
//! break it waits until a replacement runs: never fewer Pods running than it allows), the
//! Deployment's replacements run on the other
//! nodes, and the DaemonSet's Pods stay, their containers running through the kubelet swap.

use std::time::Duration;

use inplace_proto::Phase;
use inplace_tests::install::workspace_binaries;
use inplace_tests::kube_node::cluster::rollout_manifest;
use inplace_tests::kube_node::workload::{
    RunningPodsWatch, check_web_replaced, run_drained_workload, running_containers,
    wait_uncordoned_on,
};
use inplace_tests::kube_node::{ClusterOptions, KubeCluster};

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
    let (daemons, web) = run_drained_workload(&cluster).await.unwrap();
    assert_eq!((daemons.len(), web.len()), (3, 3));

    // The fewest web Pods running at any moment of the rollout: what the drain's evictions
    // take away (the budget says at least 2).
    let web_running = RunningPodsWatch::start(&cluster, "app=web").await.unwrap();
    cluster
        .apply("release", &cluster.release_manifest("v1.36.3").unwrap())
        .unwrap();
    cluster
        .apply("rollout", &rollout_manifest("kubelet-v1.36.3", "Drain"))
        .unwrap();
    cluster
        .wait_plans(Phase::Succeeded, Duration::from_secs(900))
        .await
        .unwrap();

    let fewest = web_running.fewest_running();
    eprintln!("fewest running web Pods during the rollout: {fewest}");
    assert!(
        fewest >= 2,
        "the budget (minAvailable 2) was broken: {fewest}"
    );
    check_web_replaced(&cluster, &web).await.unwrap();
    assert_eq!(
        running_containers(&cluster, "app=node-agent")
            .await
            .unwrap(),
        daemons,
        "the DaemonSet's Pods were left alone and kept their containers"
    );
    wait_uncordoned_on(&cluster, "v1.36.3").await.unwrap();
}
