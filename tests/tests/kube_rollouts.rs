//! The promise at the centre, on real nodes: a NodeRollout updates each node's real kubelet in
//! place (its `kubernetes` sysext image swapped by the real agent, the kubelet restarted) while
//! the node's Pods keep running — same containers, same processes, never restarted, never
//! deleted — and `kubectl get nodes` shows the new version.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inplace_tests::install::workspace_binaries;
use inplace_tests::kube_node::{self, ClusterOptions, KubeCluster};

/// How long a rollout over three real nodes may take on a loaded 2-core machine.
const ROLLOUT_PATIENCE: Duration = Duration::from_secs(600);

const WORKLOAD: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 5
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        labelSelector:
          matchLabels: {app: web}
      containers:
      - name: web
        image: inplace.test/workload:1
        imagePullPolicy: Never
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: web
  namespace: default
spec:
  minAvailable: 2
  selector:
    matchLabels: {app: web}
";

fn rollout(release: &str) -> String {
    format!(
        "apiVersion: inplace.dev/v1alpha1
kind: NodeRollout
metadata:
  name: kubelets
spec:
  release: kubelet-{release}
  maxUnavailable: 1
  disruption: None
"
    )
}

/// One running container as the API and containerd see it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Container {
    pod_uid: String,
    node: String,
    id: String,
    started_at: String,
    restarts: String,
    pid: String,
}

async fn containers(cluster: &KubeCluster) -> BTreeMap<String, Container> {
    let listing = cluster
        .kubectl(&[
            "get", "pods", "-n", "default", "-l", "app=web", "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].state.running.startedAt} {.status.containerStatuses[0].restartCount}{"\n"}{end}"#,
        ])
        .unwrap();
    let mut found = BTreeMap::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [pod, uid, node, id, started_at, restarts] = fields[..] else {
            panic!("a pod that is not running: {line:?}\n{listing}");
        };
        let id = id.trim_start_matches("containerd://").to_owned();
        let host = cluster.nodes.iter().find(|n| n.name() == node).unwrap();
        let tasks = host
            .node
            .exec_ok(&["ctr", "-n", "k8s.io", "tasks", "ls"])
            .await
            .unwrap();
        let pid = tasks
            .lines()
            .find(|l| l.starts_with(&id))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_else(|| panic!("containerd on {node} has no task {id}:\n{tasks}"))
            .to_owned();
        found.insert(
            pod.to_owned(),
            Container {
                pod_uid: uid.to_owned(),
                node: node.to_owned(),
                id,
                started_at: started_at.to_owned(),
                restarts: restarts.to_owned(),
                pid,
            },
        );
    }
    found
}

/// The longest time each Node's `Ready` condition was not `True`, sampled every 250 ms until
/// the returned flag is set.
fn watch_readiness(
    cluster: &KubeCluster,
    client: kube::Client,
) -> (
    Arc<Mutex<BTreeMap<String, Duration>>>,
    Arc<std::sync::atomic::AtomicBool>,
) {
    let longest = Arc::new(Mutex::new(BTreeMap::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name().to_owned()).collect();
    let (longest2, stop2) = (longest.clone(), stop.clone());
    tokio::spawn(async move {
        let mut since: BTreeMap<String, Instant> = BTreeMap::new();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            for name in &names {
                let ready = matches!(
                    kube_node::node_state(&client, name).await,
                    Ok(Some((ref r, _))) if r == "True"
                );
                let mut longest = longest2.lock().unwrap();
                let entry = longest.entry(name.clone()).or_insert(Duration::ZERO);
                if ready {
                    since.remove(name);
                } else {
                    let start = *since.entry(name.clone()).or_insert_with(Instant::now);
                    *entry = (*entry).max(start.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    (longest, stop)
}

async fn wait_plans_succeeded(cluster: &KubeCluster, release: &str) {
    let deadline = Instant::now() + ROLLOUT_PATIENCE;
    loop {
        let phases = cluster
            .kubectl(&[
                "get",
                "nodeupdateplans",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name} {.status.phase}{"\n"}{end}"#,
            ])
            .unwrap_or_default();
        let succeeded = phases.lines().filter(|l| l.ends_with(" Succeeded")).count();
        let versions = cluster
            .kubectl(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].status.nodeInfo.kubeletVersion}",
            ])
            .unwrap_or_default();
        if succeeded == cluster.nodes.len() && versions.split_whitespace().all(|v| v == release) {
            return;
        }
        if Instant::now() > deadline {
            let rollout = cluster
                .kubectl(&["describe", "noderollout", "kubelets"])
                .unwrap_or_default();
            let mut journals = String::new();
            for node in &cluster.nodes {
                journals.push_str(
                    &node
                        .node
                        .journal("inplace-agent.service", 40)
                        .await
                        .unwrap_or_default(),
                );
            }
            panic!(
                "the rollout to {release} did not finish:\n{phases}\nkubelets: {versions}\n{rollout}\n{journals}"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn apply(cluster: &KubeCluster, name: &str, manifest: &str) {
    let path = cluster
        .admin_kubeconfig()
        .with_file_name(format!("{name}.yaml"));
    std::fs::write(&path, manifest).unwrap();
    cluster
        .kubectl(&["apply", "-f", &path.display().to_string()])
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_keep_running_through_an_in_place_kubelet_patch_update() {
    let work = tempfile::tempdir().unwrap();
    let (agent, controller) = workspace_binaries().await.unwrap();
    let options = ClusterOptions {
        dir: work.path().join("cluster"),
        nodes: 3,
        name_prefix: "patch".to_owned(),
        kubelet: "v1.36.1".to_owned(),
        agent,
        controller: Some(controller),
    };
    let cluster = KubeCluster::start(&options, &|step| eprintln!("bed: {step}"))
        .await
        .unwrap();
    apply(&cluster, "workload", WORKLOAD).await;
    cluster
        .kubectl(&[
            "rollout",
            "status",
            "deployment/web",
            "-n",
            "default",
            "--timeout=300s",
        ])
        .unwrap();
    let before = containers(&cluster).await;
    assert_eq!(before.len(), 3, "{before:?}");
    eprintln!(
        "before: {before:#?}\n{}",
        cluster.kubectl(&["get", "nodes"]).unwrap()
    );

    let client = cluster.client().await.unwrap();
    let (not_ready, stop) = watch_readiness(&cluster, client);
    let started = Instant::now();
    apply(
        &cluster,
        "release",
        &cluster.release_manifest("v1.36.3").unwrap(),
    )
    .await;
    apply(&cluster, "rollout", &rollout("v1.36.3")).await;
    wait_plans_succeeded(&cluster, "v1.36.3").await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "rollout of 3 nodes took {:.1} s; longest time not Ready per node: {:?}",
        started.elapsed().as_secs_f64(),
        not_ready.lock().unwrap()
    );

    let after = containers(&cluster).await;
    assert_eq!(
        before, after,
        "the Pods' containers changed through the kubelet swap"
    );
    assert!(after.values().all(|c| c.restarts == "0"), "{after:?}");
    let nodes = cluster.kubectl(&["get", "nodes"]).unwrap();
    eprintln!("after:\n{nodes}");
    for node in &cluster.nodes {
        let line = nodes.lines().find(|l| l.starts_with(node.name())).unwrap();
        assert!(
            line.contains(" Ready ") && line.ends_with("v1.36.3"),
            "{line}"
        );
    }
    for (node, longest) in not_ready.lock().unwrap().iter() {
        assert!(
            *longest < Duration::from_secs(120),
            "{node} not Ready for {longest:?}"
        );
    }
}
