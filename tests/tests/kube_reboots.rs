//! A release activated by a reboot (issue 38), rolled out by the real controller over three
//! real Kubernetes nodes with `maxUnavailable: 1`: the release is docs/usage/reboot-updates.md's
//! as written (the real kubelet v1.36.1 → v1.36.3 as a `kubernetes` extension, `activation:
//! {mode: Reboot}`); each node's agent asks logind, the node reboots (systemd-nspawn ends with
//! 133 and the bed boots it again, as a machine comes back), merges the extension at boot and
//! runs the new kubelet; the agent of the new boot verifies and commits. Each node reboots
//! exactly once, in its slot: sampled throughout, never two nodes down at once. The rollout
//! says `disruption: Drain`, and the nodes run a DaemonSet and a Deployment with a
//! PodDisruptionBudget: each node is drained before it reboots (every web Pod is evicted and
//! replaced, none ever stopped by a reboot, the budget holds), its DaemonSet Pod runs again
//! after the boot in a new container, and every node is uncordoned at the end.
//!
//! Then, on the same nodes, a second reboot release whose kubelet cannot start (its drop-in
//! passes a flag the real kubelet refuses): the first node reboots into it, fails its health
//! checks after the boot, reboots back into v1.36.3 and reports `RolledBack`; the rollout
//! halts, and the other two nodes never reboot.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::docs::fenced_block;
use inplace_tests::install::workspace_binaries;
use inplace_tests::kube_node::cluster::{Activation, rollout_manifest};
use inplace_tests::kube_node::kubelet::KUBELET_DROP_IN_PATH;
use inplace_tests::kube_node::workload::{
    RunningContainer, RunningPodsWatch, check_web_replaced, run_drained_workload,
    running_containers, wait_uncordoned_on,
};
use inplace_tests::kube_node::{self, ClusterOptions, KubeCluster, KubeletImage};
use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::api::{Api, ListParams};

/// How long the whole rollout, three reboots in turn, may take on a loaded 2-core machine.
const PATIENCE: Duration = Duration::from_secs(1200);

/// The page whose release the test rolls out.
const PAGE: &str = "../docs/usage/reboot-updates.md";

/// The release the nodes boot with and the one the documented release brings.
const OLDER: &str = "v1.36.1";
const NEWER: &str = "v1.36.3";

/// The page's release, its two placeholders (the image's address and sha256) filled with
/// the bed's served image of [`NEWER`]: the NodeRelease `kubelet-v1.36.3-by-reboot`, and its
/// manifest.
fn documented_release(cluster: &KubeCluster) -> (String, String) {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE);
    let block = fenced_block(&page, "# Updates that need a reboot", "yaml").unwrap();
    let image = cluster.image(NEWER).unwrap();
    let documented = "https://files.example/kubernetes-v1.36.3-x86-64.raw";
    assert!(block.contains(documented), "{block}");
    let served = cluster.server.url(&format!("/{}", file_name(&image.path)));
    let spec: String = block
        .replace(documented, &served)
        .replace("<64 hex digits>", &image.sha256)
        .lines()
        .map(|l| format!("  {l}\n"))
        .collect();
    let name = format!("kubelet-{NEWER}-by-reboot");
    let manifest = format!(
        "apiVersion: inplace.dev/v1alpha1\nkind: NodeRelease\nmetadata:\n  name: {name}\n\
         spec:\n  version: {NEWER}\n  kubernetesVersion: {NEWER}\n{spec}"
    );
    (name, manifest)
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// What the sampler saw: the most nodes down at once (with the set), which nodes were ever
/// down, and each Node's boot IDs in the order its kubelet reported them.
#[derive(Debug, Default)]
struct Seen {
    most_down: BTreeSet<String>,
    ever_down: BTreeSet<String>,
    boot_ids: BTreeMap<String, Vec<String>>,
    samples: usize,
}

/// Samples the Nodes and the plans every 250 ms. A node is down while its Node is not
/// `Ready` or its plan is in its activation (`Activating`, `Verifying`, `RollingBack`): a
/// rebooting node's kubelet is gone, but its Node keeps the last `Ready` it posted.
struct DownWatch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl DownWatch {
    fn start(client: kube::Client) -> DownWatch {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let nodes: Api<NodeObject> = Api::all(client.clone());
            let plans: Api<NodeUpdatePlan> = Api::all(client);
            loop {
                if let (Ok(nodes), Ok(plans)) = (
                    nodes.list(&ListParams::default()).await,
                    plans.list(&ListParams::default()).await,
                ) {
                    let mut seen = record.lock().unwrap_or_else(|e| e.into_inner());
                    seen.record(&nodes.items, &plans.items);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        DownWatch { seen, task }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for DownWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Seen {
    fn record(&mut self, nodes: &[NodeObject], plans: &[NodeUpdatePlan]) {
        let mut down = BTreeSet::new();
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let status = node.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if !ready {
                down.insert(name.clone());
            }
            let boot = status.node_info.map(|i| i.boot_id).unwrap_or_default();
            let boots = self.boot_ids.entry(name).or_default();
            if !boot.is_empty() && boots.last() != Some(&boot) {
                boots.push(boot);
            }
        }
        for plan in plans {
            let phase = plan.status.as_ref().and_then(|s| s.phase);
            if matches!(
                phase,
                Some(Phase::Activating | Phase::Verifying | Phase::RollingBack)
            ) {
                down.insert(plan.spec.node_name.clone());
            }
        }
        self.ever_down.extend(down.iter().cloned());
        if down.len() > self.most_down.len() {
            self.most_down = down;
        }
        self.samples += 1;
    }
}

/// The node's boot ID, as its kernel gives it to this boot.
async fn boot_id(node: &inplace_tests::nspawn::Node) -> String {
    let id = node.read_file("/proc/sys/kernel/random/boot_id").await;
    String::from_utf8(id.unwrap()).unwrap().trim().to_owned()
}

/// Every node's boot ID, by name.
async fn boot_ids(cluster: &KubeCluster) -> BTreeMap<String, String> {
    let mut ids = BTreeMap::new();
    for node in &cluster.nodes {
        ids.insert(node.name().to_owned(), boot_id(&node.node).await);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_release_reboots_each_node_once_and_a_failing_one_reboots_back_and_halts() {
    let work = tempfile::tempdir().unwrap();
    let (agent, controller) = workspace_binaries().await.unwrap();
    let options = ClusterOptions {
        dir: work.path().join("cluster"),
        nodes: 3,
        name_prefix: "reboot".to_owned(),
        kubelet: OLDER.to_owned(),
        agent,
        controller: Some(controller),
        kubelet_path: None,
    };
    let mut cluster = KubeCluster::start(&options, &|step| eprintln!("bed: {step}"))
        .await
        .unwrap();
    let client = cluster.client().await.unwrap();
    let booted = each_node_reboots_once_in_its_slot(&mut cluster, &client).await;
    a_failing_release_reboots_back_and_halts(&mut cluster, &client, &booted).await;
}

/// The documented release over the three nodes: each reboots once, in its slot, and commits.
/// Returns each node's boot ID after it.
async fn each_node_reboots_once_in_its_slot(
    cluster: &mut KubeCluster,
    client: &kube::Client,
) -> BTreeMap<String, String> {
    let (daemons, web) = run_drained_workload(cluster).await.unwrap();
    let web_running = RunningPodsWatch::start(cluster, "app=web").await.unwrap();
    let before = boot_ids(cluster).await;
    let watch = DownWatch::start(client.clone());
    let started = Instant::now();
    let (release, manifest) = documented_release(cluster);
    cluster.apply("release", &manifest).unwrap();
    cluster
        .apply("rollout", &rollout_manifest(&release, "Drain"))
        .unwrap();

    // Nobody reboots a node but its agent: the bed only boots it again once it went down.
    let reboots = cluster.nodes.iter_mut().map(|node| async move {
        let result = node.node.wait_own_reboot(PATIENCE).await;
        (node.name().to_owned(), result)
    });
    for (name, result) in futures::future::join_all(reboots).await {
        if let Err(e) = result {
            panic!("{name}: {e}\n{}", cluster.agent_journals().await);
        }
    }
    let after = boot_ids(cluster).await;
    cluster
        .wait_plans(Phase::Succeeded, PATIENCE)
        .await
        .unwrap();
    eprintln!(
        "3 nodes rebooted and committed in {:.0?}",
        started.elapsed()
    );
    for node in &cluster.nodes {
        kube_node::wait_node_ready(client, node.name(), Some(NEWER), PATIENCE)
            .await
            .unwrap();
        let name = node.name();
        assert_ne!(after[name], before[name], "{name}: a new boot");
        assert_eq!(
            boot_id(&node.node).await,
            after[name],
            "{name}: one reboot only"
        );
        assert_eq!(node.node.merged_extensions().await.unwrap(), ["kubernetes"]);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let fewest = web_running.fewest_running();
    eprintln!("fewest running web Pods through the reboots: {fewest}");
    assert!(
        fewest >= 2,
        "the budget (minAvailable 2) was broken: {fewest}"
    );
    check_web_replaced(cluster, &web).await.unwrap();
    wait_daemons_back(cluster, &daemons).await;
    wait_uncordoned_on(cluster, NEWER).await.unwrap();
    let seen = watch.seen();
    eprintln!(
        "{} samples; most down at once: {:?}",
        seen.samples, seen.most_down
    );
    eprintln!("boot IDs the Nodes reported: {:?}", seen.boot_ids);
    assert!(
        seen.most_down.len() <= 1,
        "two nodes down at once: {seen:?}"
    );
    assert_eq!(
        seen.ever_down.len(),
        3,
        "each node's slot was seen: {seen:?}"
    );
    for (name, ids) in &seen.boot_ids {
        assert_eq!(
            ids,
            &[before[name].clone(), after[name].clone()],
            "{name}: {seen:?}"
        );
    }
    after
}

/// Waits until every DaemonSet Pod of `before` runs again: the same Pod (a drain leaves a
/// DaemonSet's Pods on their node), in a new container (the reboot stopped the old one).
async fn wait_daemons_back(cluster: &KubeCluster, before: &BTreeMap<String, RunningContainer>) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = running_containers(cluster, "app=node-agent").await;
        let back = now.as_ref().is_ok_and(|now| {
            now.len() == before.len()
                && before.iter().all(|(pod, old)| {
                    now.get(pod)
                        .is_some_and(|new| new.pod_uid == old.pod_uid && new.id != old.id)
                })
        });
        if back {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the DaemonSet's Pods are not back in new containers: before {before:?}\nnow {now:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A reboot release whose kubelet refuses to start, over the nodes `booted` left on
/// [`NEWER`]: the first node in its slot reboots into it and back (two new boots), its plan
/// `RolledBack` saying the kubelet's unit failed, its Node `Ready` on [`NEWER`] from the boot
/// back; the rollout `Halted`, the other nodes still in their boot with the release staged.
async fn a_failing_release_reboots_back_and_halts(
    cluster: &mut KubeCluster,
    client: &kube::Client,
    booted: &BTreeMap<String, String>,
) {
    let watch = DownWatch::start(client.clone());
    let manifest = cluster
        .serve_broken_release(NEWER, Activation::Reboot)
        .await
        .unwrap();
    cluster.apply("release-refused", &manifest).unwrap();
    let release = format!("kubelet-{NEWER}-refuses-to-start-by-reboot");
    cluster
        .apply("rollout", &rollout_manifest(&release, "None"))
        .unwrap();

    // Into the failing boot, then back: two reboots, each a new boot ID.
    let first = first_to_reboot(cluster).await;
    let name = cluster.nodes[first].name().to_owned();
    if let Err(e) = cluster.nodes[first].node.wait_own_reboot(PATIENCE).await {
        panic!("{name} back: {e}\n{}", cluster.agent_journals().await);
    }
    let back = boot_id(&cluster.nodes[first].node).await;
    assert_ne!(back, booted[&name], "{name}: a new boot");

    let described = cluster
        .wait_halted("kubelets", PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("the rollout did not halt: {e}"));
    let plans = cluster.plans().unwrap();
    let rollouts = cluster.kubectl(&["get", "noderollouts"]).unwrap();
    eprintln!("{rollouts}\n{described}\n{plans}");
    assert!(
        described.contains("TooManyFailures") && described.contains(&name),
        "{described}"
    );
    let plan = |node: &str| {
        plans
            .lines()
            .find(|l| l.starts_with(&format!("{node} ")))
            .unwrap_or_else(|| panic!("no plan of {node}: {plans}"))
            .to_owned()
    };
    // The plan says what failed: the kubelet's unit never stayed up in the new boot.
    let failed = plan(&name);
    assert!(
        failed.starts_with(&format!("{name} RolledBack RolledBack: "))
            && failed.contains("kubelet.service"),
        "{plans}"
    );
    wait_node_on_boot(client, &name, &back).await;
    let node = &cluster.nodes[first].node;
    assert_eq!(
        boot_id(node).await,
        back,
        "{name}: no reboot after the one back"
    );
    assert_eq!(node.merged_extensions().await.unwrap(), ["kubernetes"]);
    assert_eq!(
        node.exec_ok(&["cat", &format!("/{KUBELET_DROP_IN_PATH}")])
            .await
            .unwrap(),
        KubeletImage::Working.drop_in(),
        "{name}: the previous (working) image is merged again"
    );
    for other in cluster.nodes.iter().filter(|n| n.name() != name) {
        let other_name = other.name();
        assert_eq!(
            boot_id(&other.node).await,
            booted[other_name],
            "{other_name}: never rebooted"
        );
        let line = plan(other_name);
        let phase = line.split(' ').nth(1).unwrap_or_default();
        assert!(
            ["Pending", "Downloading", "Staged"].contains(&phase),
            "{other_name}: not past Staged: {plans}"
        );
    }
    let seen = watch.seen();
    eprintln!("boot IDs the Nodes reported: {:?}", seen.boot_ids);
    assert!(
        seen.most_down.len() <= 1,
        "two nodes down at once: {seen:?}"
    );
    assert_eq!(
        seen.ever_down,
        BTreeSet::from([name.clone()]),
        "only the first node's slot: {seen:?}"
    );
    // The failing boot's kubelet never ran, so it never reported that boot.
    for (node, ids) in &seen.boot_ids {
        let want = if *node == name {
            vec![booted[node].clone(), back.clone()]
        } else {
            vec![booted[node].clone()]
        };
        assert_eq!(ids, &want, "{node}: {seen:?}");
    }
}

/// The index of the first node to reboot by itself (and be booted again).
async fn first_to_reboot(cluster: &mut KubeCluster) -> usize {
    let waits = cluster
        .nodes
        .iter_mut()
        .map(|node| Box::pin(node.node.wait_own_reboot(PATIENCE)));
    let (result, first, others) = futures::future::select_all(waits).await;
    drop(others);
    if let Err(e) = result {
        panic!("no node rebooted: {e}\n{}", cluster.agent_journals().await);
    }
    first
}

/// Waits until the Node `name` is `Ready` on [`NEWER`] as reported from the boot `boot`
/// (a Node keeps the last `Ready` its kubelet posted, from before a reboot too).
async fn wait_node_on_boot(client: &kube::Client, name: &str, boot: &str) {
    let nodes: Api<NodeObject> = Api::all(client.clone());
    let deadline = Instant::now() + PATIENCE;
    loop {
        let node = nodes.get(name).await.ok();
        let status = node.and_then(|n| n.status).unwrap_or_default();
        let info = status.node_info.clone().unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if ready && info.boot_id == boot && info.kubelet_version == NEWER {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} not Ready on {NEWER} from boot {boot}: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
