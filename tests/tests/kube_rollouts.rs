//! The promise at the centre, on real nodes: a NodeRollout updates each node's real kubelet in
//! place (its `kubernetes` sysext image swapped by the real agent, the kubelet restarted) while
//! the node's Pods keep running — same containers, same processes, never restarted, never
//! deleted — and `kubectl get nodes` shows the new version; a kubelet that cannot start rolls
//! back to the one before with the Pods untouched, and halts the rollout. The same holds for a
//! kubelet shipped as a bare binary (`Binary` artifact) and for containerd itself.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use inplace_proto::Phase;
use inplace_tests::apiserver::bin_dir;
use inplace_tests::docs::shell_block;
use inplace_tests::install::workspace_binaries;
use inplace_tests::kube_node::cluster::{Activation, rollout_manifest};
use inplace_tests::kube_node::workload::{
    self, ReadinessWatch, RunningContainer, running_containers,
};
use inplace_tests::kube_node::{self, ClusterOptions, KubeCluster};

/// How long a rollout over real nodes may take on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(600);

/// Where the quickstart's cluster lives; the test puts its own directory there.
const QUICKSTART_DIR: &str = "/var/tmp/inplace-cluster";

async fn cluster(work: &Path, prefix: &str, nodes: usize, kubelet: &str) -> KubeCluster {
    start(&options(work, prefix, nodes, kubelet).await).await
}

async fn options(work: &Path, prefix: &str, nodes: usize, kubelet: &str) -> ClusterOptions {
    let (agent, controller) = workspace_binaries().await.unwrap();
    ClusterOptions {
        dir: work.join("cluster"),
        nodes,
        name_prefix: prefix.to_owned(),
        kubelet: kubelet.to_owned(),
        agent,
        controller: Some(controller),
        kubelet_path: None,
    }
}

async fn start(options: &ClusterOptions) -> KubeCluster {
    KubeCluster::start(options, &|step| eprintln!("bed: {step}"))
        .await
        .unwrap()
}

async fn run_workload(cluster: &KubeCluster) -> BTreeMap<String, RunningContainer> {
    workload::run_workload(cluster).await.unwrap()
}

/// The same containers, processes and Pods, never restarted; the nodes `Ready` on `version`
/// in `kubectl get nodes`.
async fn assert_pods_kept(
    cluster: &KubeCluster,
    before: &BTreeMap<String, RunningContainer>,
    version: &str,
) {
    workload::check_pods_kept(cluster, before, version)
        .await
        .unwrap();
}

fn assert_readiness_bounded(watch: &ReadinessWatch) {
    let longest = watch.longest_not_ready();
    eprintln!("longest time not Ready per node: {longest:?}");
    for (node, time) in longest {
        assert!(
            time < Duration::from_secs(120),
            "{node} not Ready for {time:?}"
        );
    }
}

/// docs/usage/quickstart.md § On real Kubernetes nodes, by hand, its two blocks run as written on a
/// cluster of three nodes started by the code behind `inplace-testbed cluster`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_updates_real_kubelets_in_place_while_their_pods_keep_running() {
    let work = tempfile::tempdir().unwrap();
    let cluster = cluster(work.path(), "patch", 3, "v1.36.1").await;
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/quickstart.md");
    let run_block = |heading: &str, before: &str| {
        let block = format!("{before}\n{}", shell_block(&page, heading).unwrap()).replace(
            QUICKSTART_DIR,
            &work.path().join("cluster").display().to_string(),
        );
        let path = format!("{}:{}", bin_dir().display(), std::env::var("PATH").unwrap());
        let out = std::process::Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
            .env("PATH", path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{heading}: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{heading}:\n{stdout}");
        stdout
    };
    let workload = run_block("### Run a workload", "");
    assert!(workload.contains("web-"), "{workload}");
    let before = running_containers(&cluster, "app=web").await.unwrap();
    assert_eq!(before.len(), 3, "{before:?}");

    let watch = ReadinessWatch::start(&cluster).await.unwrap();
    let started = Instant::now();
    // The second block goes on in the first one's shell: its `export` line first.
    let exports = shell_block(&page, "### Run a workload")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("export "))
        .unwrap()
        .to_owned();
    let shown = run_block("### Update every kubelet in place", &exports);
    eprintln!(
        "3 nodes updated in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(shown.contains("v1.36.3"), "{shown}");
    assert_pods_kept(&cluster, &before, "v1.36.3").await;
    assert_readiness_bounded(&watch);
}

/// The minor upgrade, v1.35.4 → v1.36.3 (kubelet one minor behind the API server: allowed
/// skew), the same way; then a reboot brings a node back on the new kubelet (the extension
/// merged at boot) with its Pod running again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minor_kubelet_upgrade_keeps_the_pods_running_and_survives_a_reboot() {
    let work = tempfile::tempdir().unwrap();
    let mut cluster = cluster(work.path(), "minor", 2, "v1.35.4").await;
    let before = run_workload(&cluster).await;
    let watch = ReadinessWatch::start(&cluster).await.unwrap();
    cluster
        .apply("release", &cluster.release_manifest("v1.36.3").unwrap())
        .unwrap();
    cluster
        .apply("rollout", &rollout_manifest("kubelet-v1.36.3", "None"))
        .unwrap();
    cluster
        .wait_plans(Phase::Succeeded, PATIENCE)
        .await
        .unwrap();
    assert_pods_kept(&cluster, &before, "v1.36.3").await;
    assert_readiness_bounded(&watch);
    drop(watch);

    let rebooted = cluster.nodes[0].name().to_owned();
    let took = cluster.nodes[0].node.reboot_and_wait().await.unwrap();
    let client = cluster.client().await.unwrap();
    // The Node may still say Ready from before the reboot: wait for the new kubelet's word.
    cluster.nodes[0]
        .wait_kubelet_healthy(Duration::from_secs(180))
        .await
        .unwrap();
    kube_node::wait_node_ready(&client, &rebooted, Some("v1.36.3"), PATIENCE)
        .await
        .unwrap();
    let merged = cluster.nodes[0].node.merged_extensions().await.unwrap();
    assert_eq!(merged, ["kubernetes"]);
    let version = cluster.nodes[0]
        .node
        .exec_ok(&["kubelet", "--version"])
        .await
        .unwrap();
    assert_eq!(version.trim(), "Kubernetes v1.36.3");
    // The kubelet starts the Pod's containers again: the same Pod, a new container.
    let (pod, old) = before.iter().find(|(_, c)| c.node == rebooted).unwrap();
    let deadline = Instant::now() + PATIENCE;
    let container = loop {
        if let Ok(now) = running_containers(&cluster, "app=web").await
            && let Some(c) = now.get(pod)
            && c.id != old.id
        {
            break c.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{pod} never ran again after the reboot"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!("rebooted {rebooted} in {took:?}; {pod} runs again: {container:?}");
    assert_eq!(
        container.pod_uid, old.pod_uid,
        "the same Pod, not a new one"
    );
}

/// containerd itself swapped in place: a `containerd` extension and a restart of
/// `containerd.service` by the agent; the running containers stay (their shims keep them),
/// the kubelet reconnects, and the Pods stay `Running` with the same containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_swapped_in_place_keeps_the_containers_running() {
    let work = tempfile::tempdir().unwrap();
    let cluster = cluster(work.path(), "runtime", 1, "v1.36.3").await;
    let before = run_workload(&cluster).await;
    let shim_before = cluster.nodes[0]
        .node
        .sh_ok("pgrep -x containerd-shim | sort")
        .await
        .unwrap();
    let containerd_before = cluster.nodes[0]
        .node
        .systemctl(&["show", "-p", "MainPID", "containerd.service"])
        .await
        .unwrap();
    cluster
        .apply(
            "release",
            &cluster.serve_containerd_release().await.unwrap(),
        )
        .unwrap();
    cluster
        .apply("rollout", &rollout_manifest("containerd", "None"))
        .unwrap();
    cluster
        .wait_plans(Phase::Succeeded, PATIENCE)
        .await
        .unwrap();
    let node = &cluster.nodes[0].node;
    assert_eq!(
        node.merged_extensions().await.unwrap(),
        ["containerd", "kubernetes"]
    );
    let containerd_after = node
        .systemctl(&["show", "-p", "MainPID", "containerd.service"])
        .await
        .unwrap();
    assert_ne!(
        containerd_before, containerd_after,
        "containerd was restarted"
    );
    assert_eq!(
        node.sh_ok("pgrep -x containerd-shim | sort").await.unwrap(),
        shim_before,
        "the shims kept running"
    );
    assert_pods_kept(&cluster, &before, "v1.36.3").await;
}

/// A release whose kubelet cannot start (its drop-in passes a flag the kubelet refuses): the
/// health checks fail, the agent puts the previous kubelet back, the Node is `Ready` on the old
/// version with the same containers, and the rollout halts before the second node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_that_cannot_start_rolls_back_with_the_pods_untouched_and_halts_the_rollout() {
    let work = tempfile::tempdir().unwrap();
    let cluster = cluster(work.path(), "broken", 2, "v1.36.1").await;
    let before = run_workload(&cluster).await;
    let release = cluster
        .serve_broken_release("v1.36.3", Activation::Restart)
        .await
        .unwrap();
    cluster.apply("release", &release).unwrap();
    cluster
        .apply(
            "rollout",
            &rollout_manifest("kubelet-v1.36.3-refuses-to-start", "None"),
        )
        .unwrap();

    let described = cluster
        .wait_halted("kubelets", PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("the rollout did not halt: {e}"));
    let plans = cluster.plans().unwrap();
    eprintln!("{described}\n{plans}");
    assert!(described.contains("Halted"), "{described}");
    let rolled_back: Vec<&str> = plans
        .lines()
        .filter(|l| l.contains(" RolledBack "))
        .collect();
    assert_eq!(rolled_back.len(), 1, "{plans}");
    // The plan says what failed: the kubelet's unit never stayed up.
    assert!(
        rolled_back[0].contains(" RolledBack: ") && rolled_back[0].contains("kubelet.service"),
        "{plans}"
    );
    assert_pods_kept(&cluster, &before, "v1.36.1").await;
}

/// The kubelet as a bare binary (`Binary` artifact), the way a node without system extensions
/// keeps it in `/opt/bin`: the agent puts the v1.36.3 kubelet behind `/opt/bin/kubelet` and
/// restarts it, the Node reports v1.36.3 with the Pod's container kept; then a "kubelet" that
/// exits at start is rolled back to the v1.36.3 binary, the Pod still untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_binary_artifact_is_swapped_in_place_and_a_broken_one_rolls_back() {
    let work = tempfile::tempdir().unwrap();
    let kubelet_path = Path::new("/opt/bin/kubelet");
    let mut options = options(work.path(), "binary", 1, "v1.36.1").await;
    options.kubelet_path = Some(kubelet_path.to_owned());
    let cluster = start(&options).await;
    let before = run_workload(&cluster).await;
    let node = &cluster.nodes[0].node;
    assert_eq!(
        node.exec_ok(&["readlink", "/opt/bin/kubelet"])
            .await
            .unwrap()
            .trim(),
        "/usr/bin/kubelet",
        "the node boots on the image's kubelet behind /opt/bin"
    );

    let binary = kube_node::kubelet_binary("v1.36.3").await.unwrap();
    let release = cluster
        .serve_kubelet_binary("kubelet-binary", "v1.36.3", &binary, kubelet_path, "3m")
        .unwrap();
    cluster.apply("release", &release).unwrap();
    cluster
        .apply("rollout", &rollout_manifest("kubelet-binary", "None"))
        .unwrap();
    cluster
        .wait_plans(Phase::Succeeded, PATIENCE)
        .await
        .unwrap();
    assert_pods_kept(&cluster, &before, "v1.36.3").await;
    let installed = node
        .exec_ok(&["readlink", "-f", "/opt/bin/kubelet"])
        .await
        .unwrap();
    let sum = node
        .exec_ok(&["sha256sum", installed.trim()])
        .await
        .unwrap();
    let want = inplace_tests::sysext::sha256_hex(&std::fs::read(&binary).unwrap());
    assert!(
        sum.starts_with(&want),
        "/opt/bin/kubelet → {installed}: {sum}"
    );

    let broken = work.path().join("kubelet-exits");
    std::fs::write(
        &broken,
        "#!/bin/sh\necho 'this kubelet exits at start' >&2\nexit 1\n",
    )
    .unwrap();
    let release = cluster
        .serve_kubelet_binary(
            "kubelet-binary-exits",
            "v1.36.3",
            &broken,
            kubelet_path,
            "15s",
        )
        .unwrap();
    cluster.apply("release-exits", &release).unwrap();
    cluster
        .apply("rollout", &rollout_manifest("kubelet-binary-exits", "None"))
        .unwrap();
    cluster
        .wait_plans(Phase::RolledBack, PATIENCE)
        .await
        .unwrap();
    assert_eq!(
        node.exec_ok(&["readlink", "-f", "/opt/bin/kubelet"])
            .await
            .unwrap(),
        installed,
        "the v1.36.3 binary is back behind /opt/bin/kubelet"
    );
    assert_pods_kept(&cluster, &before, "v1.36.3").await;
}
