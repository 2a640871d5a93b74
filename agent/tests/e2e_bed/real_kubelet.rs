//! The agent's first kubelet update on a real Kubernetes node (test bed 5): the real kubelet
//! v1.36.1 merged at boot by `systemd-sysext.service`, containerd, and a Pod. v1.36.3 commits
//! and the Node reports it; a v1.36.3 whose kubelet refuses its flags rolls back, also when
//! only the Node is checked (the Node still shows the status of the kubelet before); a kubelet
//! whose restart starts nothing fails its activation without any health check. Then a
//! `Config` artifact sets the kubelet's `maxPods` without a reboot and the Node's capacity
//! shows it; a config the kubelet cannot decode rolls back to the previous file
//! (docs/usage/config-artifacts.md, its node set-up run as written). The Pod keeps
//! its container (ID, process, start time, no restart) through all of it. The stand-in's
//! cases (a kubelet that lies about its version, images systemd-sysext refuses, refusals
//! before any download) stay on the plain node: docs/development/testing.md says why.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::artifact_server::Artifact;
use inplace_tests::docs;
use inplace_tests::kube_node::config::KUBELET_CONFIG_PATH;
use inplace_tests::kube_node::workload::RunningContainer;
use inplace_tests::kube_node::{self, KubeletImage};
use inplace_tests::sysext::{SysextImage, sha256_hex};
use serde_json::json;

use super::{readlink, revision, run};
use crate::real_node::{AgentNode, PATIENCE};

/// The release the node boots with and the patch release it is updated to.
const OLDER: &str = "v1.36.1";
const NEWER: &str = "v1.36.3";

/// What the test's plans share: the node, its Pod as it ran before the first update.
struct Bed {
    node: AgentNode,
    pod: BTreeMap<String, RunningContainer>,
    images: tempfile::TempDir,
}

impl Bed {
    /// Packs the kubelet of `release` as `variant`.
    async fn image(&self, release: &str, variant: KubeletImage) -> SysextImage {
        kube_node::kubelet_sysext(release, variant, self.images.path())
            .await
            .expect("the kubelet is built and packed")
    }

    /// Serves `image` and returns its artifact and where the agent stores it.
    fn sysext(&self, image: &SysextImage) -> (serde_json::Value, String) {
        let file = image.path.file_name().unwrap().to_str().unwrap();
        let server = &self.node.server;
        server.put(&format!("/{file}"), Artifact::file(&image.path).unwrap());
        let artifact = json!({"name": "kubernetes", "type": "Sysext",
            "url": server.url(&format!("/{file}")), "sha256": image.sha256, "size": image.size});
        (artifact, format!("/opt/extensions/kubernetes/{file}"))
    }

    /// A plan for `image` with a kubelet release's checks (`AgentNode::kubelet_checks`).
    fn plan(&self, image: &SysextImage, healthy: bool) -> (NodeUpdatePlan, String) {
        let (artifact, stored) = self.sysext(image);
        let checks = self.node.kubelet_checks(healthy);
        (self.node.plan(vec![artifact], checks), stored)
    }

    /// After `label`: the extension linked is `stored`, the Node is `Ready` on `release`,
    /// and the Pod kept its container.
    async fn assert_runs(&self, stored: &str, release: &str, label: &str) {
        let linked = readlink(&self.node, "/etc/extensions/kubernetes.raw").await;
        assert_eq!(linked, stored, "{label}");
        self.node.wait_node_ready(release, label).await;
        self.node.assert_pods_kept(&self.pod, label).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_update_of_a_real_kubelet_merged_at_boot_commits_rolls_back_and_keeps_the_pod() {
    let images = tempfile::tempdir().unwrap();
    let v1 = kube_node::kubelet_sysext(OLDER, KubeletImage::Working, images.path())
        .await
        .expect("the kubelet is built and packed");
    let node = AgentNode::start_on_kube_node("e2e-kubelet", None, OLDER, &v1).await;
    let unit = node
        .node
        .sh_ok("systemctl is-active systemd-sysext.service || true")
        .await
        .unwrap();
    assert_eq!(unit.trim(), "active", "merged at boot by the unit");
    let pod = node.run_pod().await;
    let bed = Bed { node, pod, images };

    // The patch release commits and the Node reports it.
    let v2 = bed.image(NEWER, KubeletImage::Working).await;
    let (p2, v2_stored) = bed.plan(&v2, true);
    let r2 = run(&bed.node, &p2, Phase::Succeeded, NEWER).await;
    bed.assert_runs(&v2_stored, NEWER, NEWER).await;

    // A kubelet that refuses its flags rolls back to the committed one.
    let refuses = bed.image(NEWER, KubeletImage::RefusesToStart).await;
    let (p3, _) = bed.plan(&refuses, false);
    run(&bed.node, &p3, Phase::RolledBack, "refuses to start").await;
    let (reason, message) = bed.node.ready().await;
    assert_eq!(reason, "RolledBack", "{message}");
    assert!(
        message.contains("HealthCheckFailed")
            && (message.contains("kubelet.service") || message.contains("/healthz")),
        "{message}"
    );
    bed.assert_runs(&v2_stored, NEWER, "after refuses to start")
        .await;

    // The same broken kubelet checked by the Node alone: the Node goes on showing the status
    // the kubelet before it posted (Ready, on the same version) until the node lifecycle
    // controller notices; only a status the restarted kubelet posted counts. The spec is
    // replaced whole, so that none of the checks before stays.
    let (artifact, _) = bed.sysext(&refuses);
    let node_checks = json!({"nodeKubeletVersion": true, "nodeReady": true,
        "window": "3s", "timeout": "20s"});
    let mut p3_by_the_node = bed.node.plan(vec![artifact], node_checks);
    p3_by_the_node.spec.content.kubernetes_version = Some(NEWER.into());
    bed.node.replace_spec(&p3_by_the_node).await;
    let label = "refuses, Node checks alone";
    bed.node
        .wait_final(Phase::RolledBack, &revision(&p3_by_the_node), label)
        .await;
    let (reason, message) = bed.node.ready().await;
    assert_eq!(reason, "RolledBack", "{message}");
    assert!(
        message.contains("HealthCheckFailed")
            && message.contains("before kubelet.service started at"),
        "{message}"
    );
    bed.assert_runs(&v2_stored, NEWER, "after refuses, Node checks alone")
        .await;

    // A kubelet whose restart starts nothing, in a plan with no health check at all: the
    // spec is replaced whole, so that none of the checks before stays.
    let never = bed.image(NEWER, KubeletImage::NeverStarts).await;
    let (artifact, _) = bed.sysext(&never);
    let p4 = bed.node.plan(vec![artifact], json!({}));
    bed.node.replace_spec(&p4).await;
    bed.node
        .wait_final(Phase::RolledBack, &revision(&p4), "never starts")
        .await;
    let (reason, message) = bed.node.ready().await;
    assert_eq!(reason, "RolledBack", "{message}");
    assert!(
        message.contains("UnitFailed") && message.contains("kubelet.service did not start"),
        "{message}"
    );
    bed.assert_runs(&v2_stored, NEWER, "after never starts")
        .await;
    let status = bed.node.api.get(bed.node.name()).await.unwrap().status;
    assert_eq!(
        status.and_then(|s| s.current_revision),
        Some(r2),
        "the patch release is still the committed revision"
    );

    let (kubelet, _) = bed.sysext(&v2);
    kubelet_config_changes(&bed, &kubelet, &v2_stored).await;
    bed.node.node.poweroff().await.unwrap();
}

/// A directory of kubelet drop-ins a Config directory replaces (the kubelet of this bed
/// reads none: the tree's swap, owner and rollback are what is shown).
const DROPINS: &str = "/etc/kubernetes/kubelet.conf.d";

/// The page whose configuration procedure the kubelet config case runs as written.
const CONFIG_PAGE: &str = "../docs/usage/config-artifacts.md";

/// Writes each file the page's § On the nodes shows at the path its first line names, and
/// restarts the agent as the page says.
async fn allow_config_as_the_page_says(node: &inplace_tests::nspawn::Node) {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join(CONFIG_PAGE);
    for language in ["toml", "ini"] {
        let block = docs::fenced_block(&page, "## On the nodes: allow it", language).unwrap();
        let path = block.lines().next().and_then(|l| l.strip_prefix("# "));
        let path = path.expect("the block's first line names its file");
        node.write_file(path, block.as_bytes(), 0o644)
            .await
            .unwrap();
    }
    node.systemctl(&["daemon-reload"]).await.unwrap();
    node.systemctl(&["restart", "inplace-agent.service"])
        .await
        .unwrap();
}

/// A `Config` artifact changing the kubelet's `maxPods` without a reboot: applied, the
/// kubelet restarted, the Node's capacity shows it; a config the kubelet refuses rolls back
/// to the previous bytes. `kubelet` (stored at `stored`) stays in each plan: a plan lists
/// every artifact the node runs, and one left out would be removed. The Pod keeps its
/// container throughout.
async fn kubelet_config_changes(bed: &Bed, kubelet: &serde_json::Value, stored: &str) {
    let node = &bed.node.node;
    allow_config_as_the_page_says(node).await;
    let before = String::from_utf8(node.read_file(KUBELET_CONFIG_PATH).await.unwrap()).unwrap();
    assert!(!before.contains("maxPods"), "{before}");
    assert_eq!(bed.node_pods().await, "110", "the kubelet's default");

    // Readable by root and a group of the node's, as § Mode and owner shows: the agent,
    // holding no capability, has PID 1 give the file its group.
    node.exec_ok(&["groupadd", "--system", "kubelet-config"])
        .await
        .unwrap();
    // Beside it a directory tree replacing the directory that is there (§ Directories).
    node.sh(&format!(
        "mkdir -p {DROPINS} && echo old > {DROPINS}/10-old.conf"
    ))
    .await
    .unwrap();
    let more = format!("{before}maxPods: 150\n");
    let private = json!({"mode": "0640", "owner": "root:kubelet-config"});
    let tree = super::tarball(&[("50-pods.conf", b"# maxPods: 150\n", 0o640)]);
    let path = "/dropins-1/kubelet.conf.d.tar.gz";
    bed.node.server.put_bytes(path, tree.clone());
    let dropins = json!({"name": "kubelet-dropins", "type": "Config", "directory": true,
        "url": bed.node.server.url(path), "sha256": sha256_hex(&tree), "path": DROPINS,
        "owner": "root:kubelet-config"});
    let mut p5 = bed.config_plan(kubelet, "maxpods-150", more.as_bytes(), true, private);
    p5.spec
        .content
        .artifacts
        .push(serde_json::from_value(dropins).unwrap());
    run(&bed.node, &p5, Phase::Succeeded, "maxPods 150").await;
    let stat = ["stat", "-L", "-c", "%a %U:%G", KUBELET_CONFIG_PATH];
    let attributes = node.exec_ok(&stat).await.unwrap();
    assert_eq!(attributes.trim(), "640 root:kubelet-config");
    let tree_stat =
        format!("stat -c '%F' {DROPINS}; stat -c '%a %U:%G' {DROPINS}/50-pods.conf; ls {DROPINS}");
    let tree_now =
        || async { String::from_utf8(node.sh(&tree_stat).await.unwrap().stdout).unwrap() };
    let committed_tree = "symbolic link\n640 root:kubelet-config\n50-pods.conf\n";
    assert_eq!(tree_now().await, committed_tree);
    let deadline = Instant::now() + PATIENCE;
    while bed.node_pods().await != "150" {
        assert!(
            Instant::now() < deadline,
            "the Node's capacity never showed maxPods 150\n{}",
            bed.node.kube_diagnostics().await
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let applied = node.read_file(KUBELET_CONFIG_PATH).await.unwrap();
    assert_eq!(String::from_utf8(applied).unwrap(), more);
    bed.assert_runs(stored, NEWER, "maxPods 150").await;

    // A value the kubelet cannot decode: it exits, /healthz never answers, rolled back.
    let broken = format!("{before}maxPods: lots\n");
    let p6 = bed.config_plan(
        kubelet,
        "maxpods-broken",
        broken.as_bytes(),
        false,
        json!({}),
    );
    run(&bed.node, &p6, Phase::RolledBack, "maxPods lots").await;
    let (reason, message) = bed.node.ready().await;
    assert_eq!(reason, "RolledBack", "{message}");
    let restored = node.read_file(KUBELET_CONFIG_PATH).await.unwrap();
    assert_eq!(
        String::from_utf8(restored).unwrap(),
        more,
        "the previous bytes"
    );
    let attributes = node.exec_ok(&stat).await.unwrap();
    assert_eq!(
        attributes.trim(),
        "640 root:kubelet-config",
        "the previous file's"
    );
    bed.assert_runs(stored, NEWER, "after maxPods lots").await;
    assert_eq!(bed.node_pods().await, "150");
}

impl Bed {
    /// A plan of `kubelet` and the kubelet's configuration as `bytes` (served under
    /// `/<tag>/`, with the fields of `attributes`: mode, owner), the kubelet restarted and
    /// checked (`AgentNode::kubelet_checks`).
    fn config_plan(
        &self,
        kubelet: &serde_json::Value,
        tag: &str,
        bytes: &[u8],
        healthy: bool,
        attributes: serde_json::Value,
    ) -> NodeUpdatePlan {
        let server = &self.node.server;
        let path = format!("/{tag}/kubelet-config.yaml");
        server.put_bytes(&path, bytes.to_vec());
        let mut artifact = json!({"name": "kubelet-config", "type": "Config",
            "url": server.url(&path), "sha256": sha256_hex(bytes),
            "size": bytes.len(), "path": KUBELET_CONFIG_PATH});
        for (field, value) in attributes.as_object().into_iter().flatten() {
            artifact[field] = value.clone();
        }
        self.node.plan(
            vec![kubelet.clone(), artifact],
            self.node.kubelet_checks(healthy),
        )
    }

    /// The Node's `status.capacity.pods`.
    async fn node_pods(&self) -> String {
        let path = "jsonpath={.status.capacity.pods}";
        let name = self.node.name();
        self.node.kubectl(&["get", "node", name, "-o", path]).await
    }
}
