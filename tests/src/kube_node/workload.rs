//! A workload on real nodes and what the tests prove about it: a Deployment spread over the
//! nodes (one Pod each, `hostNetwork`, the locally imported image) with a PodDisruptionBudget,
//! and a snapshot of its containers as the API server and each node's containerd see them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::KubeCluster;
use crate::{Error, Result};

/// How the Deployment `web` spreads its Pods over the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// Exactly one per node (`whenUnsatisfiable: DoNotSchedule`): a Pod stays where it is.
    OnePerNode,
    /// As even as the scheduler can (`ScheduleAnyway`): an evicted Pod's replacement may land
    /// on a node that already runs one.
    Preferred,
}

/// The Deployment `web` and its PodDisruptionBudget (`minAvailable: replicas - 1`), in
/// `namespace`.
pub fn web_manifest(namespace: &str, replicas: usize, spread: Spread) -> String {
    let when = match spread {
        Spread::OnePerNode => "DoNotSchedule",
        Spread::Preferred => "ScheduleAnyway",
    };
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: {namespace}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 5
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: {when}
        labelSelector:
          matchLabels: {{app: web}}
      containers:
      - name: web
        image: {image}
        imagePullPolicy: Never
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: web
  namespace: {namespace}
spec:
  minAvailable: {min}
  selector:
    matchLabels: {{app: web}}
",
        image = super::config::WORKLOAD_IMAGE,
        min = replicas.saturating_sub(1),
    )
}

/// The DaemonSet `node-agent`: one Pod on every node, which a drain leaves alone.
pub fn daemonset_manifest() -> String {
    format!(
        "apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: node-agent
  namespace: default
spec:
  selector:
    matchLabels: {{app: node-agent}}
  template:
    metadata:
      labels: {{app: node-agent}}
    spec:
      hostNetwork: true
      terminationGracePeriodSeconds: 5
      containers:
      - name: node-agent
        image: {image}
        imagePullPolicy: Never
",
        image = super::config::WORKLOAD_IMAGE,
    )
}

/// Applies [`web_manifest`] with one Pod per node of `cluster`, waits for the rollout, and
/// returns its containers.
pub async fn run_workload(cluster: &KubeCluster) -> Result<BTreeMap<String, RunningContainer>> {
    cluster.apply(
        "web",
        &web_manifest("default", cluster.nodes.len(), Spread::OnePerNode),
    )?;
    cluster.kubectl(&["rollout", "status", "deployment/web", "--timeout=300s"])?;
    running_containers(cluster, "app=web").await
}

/// The workload a drain meets: the DaemonSet `node-agent` (one Pod on every node, which a
/// drain leaves alone) and the Deployment `web`, one Pod per node as far as the scheduler can
/// keep it so, with its PodDisruptionBudget. Waits until both run; returns their containers
/// (the DaemonSet's, then web's).
pub async fn run_drained_workload(
    cluster: &KubeCluster,
) -> Result<(
    BTreeMap<String, RunningContainer>,
    BTreeMap<String, RunningContainer>,
)> {
    let replicas = cluster.nodes.len();
    cluster.apply("node-agent", &daemonset_manifest())?;
    cluster.apply("web", &web_manifest("default", replicas, Spread::Preferred))?;
    for workload in ["daemonset/node-agent", "deployment/web"] {
        cluster.kubectl(&["rollout", "status", workload, "--timeout=300s"])?;
    }
    Ok((
        running_containers(cluster, "app=node-agent").await?,
        running_containers(cluster, "app=web").await?,
    ))
}

/// Checks that every Pod of `web` (the Deployment of [`run_drained_workload`], whose Pods
/// were `before`) was evicted and replaced: as many run as before, none of them an old Pod,
/// none ever restarted (a Pod a reboot had stopped would have been).
pub async fn check_web_replaced(
    cluster: &KubeCluster,
    before: &BTreeMap<String, RunningContainer>,
) -> Result<()> {
    cluster.kubectl(&["rollout", "status", "deployment/web", "--timeout=300s"])?;
    let after = running_containers(cluster, "app=web").await?;
    let replaced = after.len() == before.len()
        && after
            .values()
            .all(|c| c.restarts == "0" && !before.values().any(|b| b.pod_uid == c.pod_uid));
    if !replaced {
        return Err(Error::Invalid(format!(
            "not every web Pod was evicted and replaced by one that never restarted:\nbefore {before:?}\nafter {after:?}"
        )));
    }
    Ok(())
}

/// Waits (up to a minute) until every Node is schedulable again (a drain cordons it, the
/// rollout uncordons it once the node's plan ended) and runs kubelet `version`.
pub async fn wait_uncordoned_on(cluster: &KubeCluster, version: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let nodes = cluster.kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.unschedulable} {.status.nodeInfo.kubeletVersion}{\"\\n\"}{end}",
        ])?;
        let on_version = format!("  {version}");
        if nodes.lines().all(|line| line.ends_with(&on_version)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Invalid(format!(
                "not every Node is uncordoned on {version} (NAME UNSCHEDULABLE VERSION):\n{nodes}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Checks that the workload of [`run_workload`] still runs in the containers of `before`
/// (the same Pods, containers and processes, never restarted) and that every node is `Ready`
/// on kubelet `version` in `kubectl get nodes` (printed).
pub async fn check_pods_kept(
    cluster: &KubeCluster,
    before: &BTreeMap<String, RunningContainer>,
    version: &str,
) -> Result<()> {
    let after = running_containers(cluster, "app=web").await?;
    if before != &after {
        return Err(Error::Invalid(format!(
            "the Pods' containers changed through the kubelet swap:\nbefore {before:?}\nafter {after:?}"
        )));
    }
    if let Some((pod, _)) = after.iter().find(|(_, c)| c.restarts != "0") {
        return Err(Error::Invalid(format!("{pod} restarted: {after:?}")));
    }
    let nodes = cluster.kubectl(&["get", "nodes"])?;
    eprintln!("{nodes}");
    for node in &cluster.nodes {
        let line = nodes.lines().find(|l| l.starts_with(node.name()));
        if !line.is_some_and(|l| l.contains(" Ready ") && l.trim_end().ends_with(version)) {
            return Err(Error::Invalid(format!(
                "node {} is not Ready on {version}:\n{nodes}",
                node.name()
            )));
        }
    }
    Ok(())
}

/// One running container of a Pod, as the API server and its node's containerd report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningContainer {
    /// The Pod's UID: a deleted and recreated Pod has another.
    pub pod_uid: String,
    /// The node it runs on.
    pub node: String,
    /// containerd's container ID.
    pub id: String,
    /// `state.running.startedAt`.
    pub started_at: String,
    /// `restartCount`.
    pub restarts: String,
    /// The container's process as containerd's task list has it.
    pub pid: String,
}

/// The first container of every Pod labelled `selector` in `default`, by Pod name; an error
/// names a Pod that is not running.
pub async fn running_containers(
    cluster: &KubeCluster,
    selector: &str,
) -> Result<BTreeMap<String, RunningContainer>> {
    let listing = cluster.kubectl(&pod_listing_args("default", selector))?;
    containers_of(&listing, |node| async move {
        let host = cluster
            .nodes
            .iter()
            .find(|n| n.name() == node)
            .ok_or_else(|| Error::Invalid(format!("a Pod on unknown node {node}")))?;
        host.node
            .exec_ok(&["ctr", "-n", "k8s.io", "tasks", "ls"])
            .await
    })
    .await
}

/// kubectl's arguments that list the Pods labelled `selector` in `namespace` the way
/// [`containers_of`] reads them.
pub fn pod_listing_args<'a>(namespace: &'a str, selector: &'a str) -> [&'a str; 8] {
    [
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        selector,
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName} {.status.containerStatuses[0].containerID} {.status.containerStatuses[0].state.running.startedAt} {.status.containerStatuses[0].restartCount}{"\n"}{end}"#,
    ]
}

/// The running containers of a [`pod_listing_args`] listing, each with its process as
/// `tasks_on(NODE)` (the output of `ctr -n k8s.io tasks ls` on that node) shows it; an error
/// names a Pod that is not running or a container containerd does not run.
pub async fn containers_of<F, Fut>(
    listing: &str,
    tasks_on: F,
) -> Result<BTreeMap<String, RunningContainer>>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<String>>,
{
    let mut found = BTreeMap::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [pod, uid, node, id, started_at, restarts] = fields[..] else {
            return Err(Error::Invalid(format!(
                "a Pod that is not running: {line:?}\n{listing}"
            )));
        };
        let id = id.trim_start_matches("containerd://").to_owned();
        let tasks = tasks_on(node.to_owned()).await?;
        let pid = tasks
            .lines()
            .find(|l| l.starts_with(&id))
            .and_then(|l| l.split_whitespace().nth(1))
            .ok_or_else(|| {
                Error::Invalid(format!("containerd on {node} has no task {id}:\n{tasks}"))
            })?
            .to_owned();
        found.insert(
            pod.to_owned(),
            RunningContainer {
                pod_uid: uid.to_owned(),
                node: node.to_owned(),
                id,
                started_at: started_at.to_owned(),
                restarts: restarts.to_owned(),
                pid,
            },
        );
    }
    Ok(found)
}

/// Samples every node's `Ready` condition every 250 ms until dropped, and keeps the longest
/// time each one was not `True`.
pub struct ReadinessWatch {
    longest: std::sync::Arc<std::sync::Mutex<BTreeMap<String, Duration>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadinessWatch {
    /// Starts watching the cluster's nodes.
    pub async fn start(cluster: &KubeCluster) -> Result<ReadinessWatch> {
        let client = cluster.client().await?;
        let names: Vec<String> = cluster.nodes.iter().map(|n| n.name().to_owned()).collect();
        let longest = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let record = longest.clone();
        let task = tokio::spawn(async move {
            let mut since: BTreeMap<String, Instant> = BTreeMap::new();
            loop {
                for name in &names {
                    let ready = matches!(
                        super::node_state(&client, name).await,
                        Ok(Some((ref r, _))) if r == "True"
                    );
                    let mut longest = record.lock().unwrap_or_else(|e| e.into_inner());
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
        Ok(ReadinessWatch { longest, task })
    }

    /// The longest time each node was not `Ready` so far.
    pub fn longest_not_ready(&self) -> BTreeMap<String, Duration> {
        self.longest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for ReadinessWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Samples the Pods labelled `selector` in `default` every 250 ms until dropped, and keeps
/// the fewest of them running and not being deleted at any moment: what a drain's evictions
/// took away. Counted from the Pods, not from a Deployment's availability, which also drops
/// when a loaded machine delays a Node's heartbeat past the node lifecycle controller's grace
/// period.
pub struct RunningPodsWatch {
    fewest: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningPodsWatch {
    /// Starts counting the Pods labelled `selector`.
    pub async fn start(cluster: &KubeCluster, selector: &str) -> Result<RunningPodsWatch> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(cluster.client().await?, "default");
        let fewest = std::sync::Arc::new(AtomicUsize::new(usize::MAX));
        let record = fewest.clone();
        let listed = kube::api::ListParams::default().labels(selector);
        let task = tokio::spawn(async move {
            loop {
                if let Ok(list) = pods.list(&listed).await {
                    let running = list
                        .items
                        .iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .filter(|p| {
                            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                        })
                        .count();
                    record.fetch_min(running, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Ok(RunningPodsWatch { fewest, task })
    }

    /// The fewest Pods seen running so far.
    pub fn fewest_running(&self) -> usize {
        self.fewest.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for RunningPodsWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
