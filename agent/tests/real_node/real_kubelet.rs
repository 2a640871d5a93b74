//! The agent on a real Kubernetes node (test bed 5, `inplace_tests::kube_node`): the real
//! control plane with the scheduler and the workload controllers, the real kubelet merged from
//! its `kubernetes` extension with containerd beside it, and a Pod running there. The agent
//! runs with the kubelet's own kubeconfig (`system:node:NAME`), which the node already holds,
//! and is installed at boot as its package lays it out (`inplace_tests::install::add_agent`,
//! as `inplace-testbed cluster` does), the binary being this package's test build.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use inplace_tests::apiserver::ApiServer;
use inplace_tests::install;
use inplace_tests::kube_node::workload::{
    RunningContainer, Spread, containers_of, pod_listing_args, web_manifest,
};
use inplace_tests::kube_node::{self, KubeNode, KubeNodeConfig};
use inplace_tests::nspawn::{Node, NodeFile, NodeOptions};
use inplace_tests::sysext::SysextImage;
use inplace_tests::test_api::TestApi;

use super::{AGENT_DROP_IN, AgentNode, PATIENCE, Setup};

/// Where the workload runs.
const NAMESPACE: &str = "default";

impl AgentNode {
    /// Boots a real Kubernetes node named after `prefix` with `image` (a `kubernetes`
    /// extension with the kubelet of `release`: `kube_node::kubelet_sysext`) merged, waits
    /// until its Node is `Ready` on that release, installs the agent with `unit_drop_in` (if
    /// any) and starts it.
    pub async fn start_on_kube_node(
        prefix: &str,
        unit_drop_in: Option<&str>,
        release: &str,
        image: &SysextImage,
    ) -> AgentNode {
        let work = tempfile::tempdir().unwrap();
        let server = ApiServer::start_for_kubelets(&work.path().join("api"))
            .await
            .expect("the control plane starts");
        let test_api = TestApi::Real(server);
        let name = Node::unique_name(prefix);
        let config = KubeNodeConfig {
            kubeconfig_yaml: test_api.node_kubeconfig_yaml(&name).unwrap(),
            ca_pem: test_api.real().unwrap().ca_pem().unwrap(),
            kubelet_image: image.clone(),
            images_dir: kube_node::node_images().await.unwrap(),
            ports: KubeNodeConfig::free_ports().unwrap(),
            // The image's /usr/bin/kubelet: the matrix swaps whole extensions.
            kubelet_path: None,
            name: name.clone(),
        };
        let setup = Setup::prepare(test_api, work).await;
        // Installed at boot, as a package in the image would be: once the kubelet's extension
        // is merged, /usr is read-only. No kubeconfig of the agent's own: the kubelet's
        // (`KubeNodeConfig`) is its identity.
        let mut options = NodeOptions::default();
        let agent = Path::new(env!("CARGO_BIN_EXE_inplace-agent"));
        install::add_agent(&mut options, agent, &setup.server.url("/"))
            .await
            .unwrap();
        if let Some(drop_in) = unit_drop_in {
            options
                .files
                .push(NodeFile::new(AGENT_DROP_IN, drop_in, 0o644));
        }
        let kube = KubeNode::boot(&config, options)
            .await
            .expect("the Kubernetes node boots and its kubelet answers");
        let healthz = kube.healthz_url();
        let mut bed = setup.into_bed(kube.node);
        bed.kubelet_healthz = Some(healthz);
        bed.node
            .wait_active("inplace-agent.service", Duration::from_secs(60))
            .await
            .expect("the agent starts under its hardened unit (Type=notify: READY sent)");
        bed.wait_node_ready(release, "the node's first kubelet")
            .await;
        bed
    }

    /// The checks a kubelet release has, for a plan on this node: the unit steady, the Node
    /// `Ready`, and the new kubelet's own `/healthz`. A kubelet that cannot start crash-loops
    /// (`Restart=always`, never `failed`), and the Node keeps `Ready` from the old kubelet's
    /// last heartbeat for its 40 s grace: only `/healthz` is never answered by a broken
    /// kubelet, however long a loaded machine stretches its short life (with the unit and
    /// `Ready` alone, a broken kubelet that stayed up through a 3 s window was committed).
    /// Only the timeout ends a broken kubelet's check: short, well inside that grace, so the
    /// Node stays `Ready` and its Pod is never evicted; 5 s, past the 3 s window, since
    /// nothing a broken kubelet does in more time changes the verdict (the crash matrix's six
    /// rollback cases each wait it out).
    pub fn kubelet_checks(&self, healthy: bool) -> serde_json::Value {
        let healthz = self
            .kubelet_healthz
            .as_deref()
            .expect("a real Kubernetes node");
        serde_json::json!({"units": ["kubelet.service"], "nodeReady": true,
            "http": [{"url": healthz}],
            "window": "3s", "timeout": if healthy { "60s" } else { "5s" }})
    }

    /// Waits until the Node is `Ready` with the kubelet of `release`.
    pub async fn wait_node_ready(&self, release: &str, label: &str) {
        let client = self.test_api.client().await.unwrap();
        if let Err(e) =
            kube_node::wait_node_ready(&client, self.name(), Some(release), PATIENCE).await
        {
            panic!("{label}: {e}\n{}", self.kube_diagnostics().await);
        }
    }

    /// The Node is `Ready` and the Pods of `web` are those of `before`: the same Pod,
    /// container ID, process and start time, never restarted.
    pub async fn assert_pods_kept(&self, before: &BTreeMap<String, RunningContainer>, label: &str) {
        let client = self.test_api.client().await.unwrap();
        let state = kube_node::node_state(&client, self.name()).await.unwrap();
        assert!(
            matches!(&state, Some((ready, _)) if ready == "True"),
            "{label}: the Node is Ready: {state:?}\n{}",
            self.kube_diagnostics().await
        );
        let now = self.pods().await;
        assert_eq!(
            &now, before,
            "{label}: the Pod kept its container through the kubelet swaps"
        );
        assert!(now.values().all(|c| c.restarts == "0"), "{label}: {now:?}");
    }

    /// Runs the Deployment `web` (one Pod, `hostNetwork`, the locally imported image) on the
    /// node and returns its container once it runs.
    pub async fn run_pod(&self) -> BTreeMap<String, RunningContainer> {
        let manifest = self.work.path().join("web.yaml");
        std::fs::write(&manifest, web_manifest(NAMESPACE, 1, Spread::OnePerNode)).unwrap();
        self.kubectl(&["apply", "-f", &manifest.display().to_string()])
            .await;
        self.kubectl(&[
            "rollout",
            "status",
            "deployment/web",
            "-n",
            NAMESPACE,
            "--timeout=300s",
        ])
        .await;
        self.pods().await
    }

    /// The container of every Pod of `web`, as the API server and the node's containerd
    /// report it (container ID, its process, start time, restart count).
    pub async fn pods(&self) -> BTreeMap<String, RunningContainer> {
        let listing = self.kubectl(&pod_listing_args(NAMESPACE, "app=web")).await;
        let found = containers_of(&listing, |node| async move {
            assert_eq!(node, self.name(), "the Pod runs on this node");
            self.node
                .exec_ok(&["ctr", "-n", "k8s.io", "tasks", "ls"])
                .await
        })
        .await;
        match found {
            Ok(found) => found,
            Err(e) => panic!("{e}\n{}", self.kube_diagnostics().await),
        }
    }

    /// The journal tails of containerd and the kubelet, for failure messages.
    pub async fn kube_diagnostics(&self) -> String {
        let mut text = String::new();
        for unit in ["containerd.service", "kubelet.service"] {
            let journal = self.node.journal(unit, 40).await.unwrap_or_default();
            text.push_str(&format!("--- {unit}\n{journal}\n"));
        }
        text
    }
}
