//! A release activated by a reboot (issue 38), rolled out by the real controller over three
//! real Kubernetes nodes with `maxUnavailable: 1`: the release is docs/usage/reboot-updates.md's
//! as written (the real kubelet v1.36.1 → v1.36.3 as a `kubernetes` extension, `activation:
//! {mode: Reboot}`); each node's agent asks logind, the node reboots (systemd-nspawn ends with
//! 133 and the bed boots it again, as a machine comes back), merges the extension at boot and
//! runs the new kubelet; the agent of the new boot verifies and commits. Each node reboots
//! exactly once, in its slot: sampled throughout, never two nodes down at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::docs::fenced_block;
use inplace_tests::install::workspace_binaries;
use inplace_tests::kube_node::cluster::rollout_manifest;
use inplace_tests::kube_node::{self, ClusterOptions, KubeCluster};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_release_reboots_each_node_once_in_its_slot_never_two_down_at_once() {
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
    let mut before = BTreeMap::new();
    for node in &cluster.nodes {
        before.insert(node.name().to_owned(), boot_id(&node.node).await);
    }
    let watch = DownWatch::start(client.clone());
    let started = Instant::now();
    let (release, manifest) = documented_release(&cluster);
    cluster.apply("release", &manifest).unwrap();
    cluster
        .apply("rollout", &rollout_manifest(&release, "None"))
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
    let mut after = BTreeMap::new();
    for node in &cluster.nodes {
        after.insert(node.name().to_owned(), boot_id(&node.node).await);
    }
    cluster.wait_plans("Succeeded", PATIENCE).await.unwrap();
    eprintln!(
        "3 nodes rebooted and committed in {:.0?}",
        started.elapsed()
    );
    for node in &cluster.nodes {
        kube_node::wait_node_ready(&client, node.name(), Some(NEWER), PATIENCE)
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
}
