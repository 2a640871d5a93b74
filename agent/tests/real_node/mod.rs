//! The real agent on a real nspawn node, shared by the suites that run it there
//! (`e2e_nspawn.rs`, `crash_matrix.rs`, `containment.rs`): the agent installed the way a
//! package would (the binary, the shipped unit and tmpfiles, a config allowing the test's
//! artifact server, the kubelet's kubeconfig), started under the shipped unit, and the waits
//! and reads the suites make on the plan.
//!
//! The API is the real kube-apiserver of the pinned release by default (a case only the
//! emulator can produce passes one to [`AgentNode::start_on`]). The CRDs and the agent's
//! shipped RBAC and admission policy (`packaging/kubernetes/agent`) are applied, and the
//! node's `/etc/kubernetes/kubelet.conf` is its own kubelet identity (`system:node:NAME`,
//! x509): the agent runs with exactly what a cluster grants it, never as an admin.
//!
//! Two kinds of node: a plain systemd host whose kubelet is whatever unit a suite puts there
//! ([`AgentNode::start`]), or a real Kubernetes node with the real kubelet, containerd and a
//! Pod ([`AgentNode::start_on_kube_node`], in `real_kubelet.rs`); both install and start the
//! agent the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inplace_proto::{ActivationMode, NodeUpdatePlan, Phase};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::install;
use inplace_tests::nspawn::{Node, NodeOptions};
use inplace_tests::plans::{self, Seen};
use inplace_tests::test_api::TestApi;
use kube::api::{Patch, PatchParams, PostParams};

mod real_kubelet;

/// How long a plan may take to reach a final phase on a loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(180);

/// One booted node running the agent, with the API (CRDs, the agent's RBAC and admission
/// policy applied) and an artifact server on host loopback (the node shares the host's
/// network).
pub struct AgentNode {
    pub test_api: TestApi,
    /// Plans, as an admin.
    pub api: kube::Api<NodeUpdatePlan>,
    pub server: ArtifactServer,
    pub node: Node,
    /// Images, the admin kubeconfig for `kubectl`.
    pub work: tempfile::TempDir,
    /// The real kubelet's `/healthz` URL, on a real Kubernetes node.
    pub kubelet_healthz: Option<String>,
}

impl AgentNode {
    /// Boots a node named after `prefix`, installs the agent with `unit_drop_in` (if any) as
    /// a drop-in of its unit, and starts it.
    pub async fn start(prefix: &str, unit_drop_in: Option<&str>) -> AgentNode {
        let test_api = TestApi::start().await.expect("the API server starts");
        Self::start_on(test_api, prefix, unit_drop_in).await
    }

    /// [`Self::start`] against `test_api` (the emulator, for its injected faults).
    pub async fn start_on(
        test_api: TestApi,
        prefix: &str,
        unit_drop_in: Option<&str>,
    ) -> AgentNode {
        Self::start_booting(test_api, prefix, unit_drop_in, NodeOptions::default()).await
    }

    /// [`Self::start_on`] with a node booted with `options` (e.g. [`with_bpf`]).
    pub async fn start_booting(
        test_api: TestApi,
        prefix: &str,
        unit_drop_in: Option<&str>,
        options: NodeOptions,
    ) -> AgentNode {
        let setup = Setup::prepare(test_api, tempfile::tempdir().unwrap()).await;
        let name = Node::unique_name(prefix);
        let node = Node::boot(&name, options).await.expect("node boots");
        let identity = setup.test_api.node_kubeconfig_yaml(&name).unwrap();
        setup.start_agent(node, &identity, unit_drop_in).await
    }

    /// The node's (and its plan's) name.
    pub fn name(&self) -> &str {
        self.node.name()
    }

    /// An Active plan for this node: `artifacts` (JSON, as in the API), `kubelet.service`
    /// restarted after the swap, `health_checks`.
    pub fn plan(
        &self,
        artifacts: Vec<serde_json::Value>,
        health_checks: serde_json::Value,
    ) -> NodeUpdatePlan {
        let name = self.name();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "inplace.dev/v1alpha1",
            "kind": "NodeUpdatePlan",
            "metadata": {"name": name},
            "spec": {
                "nodeName": name,
                "desiredState": "Active",
                "artifacts": artifacts,
                "activation": {"restartUnits": ["kubelet.service"]},
                "healthChecks": health_checks,
            }
        }))
        .unwrap()
    }

    /// Creates the node's plan with `plan`'s spec, or merges `plan`'s spec into the one
    /// there (a field `plan` leaves out keeps its value: [`AgentNode::replace_spec`] drops it).
    pub async fn apply(&self, plan: &NodeUpdatePlan) {
        if self.api.get_opt(self.name()).await.unwrap().is_none() {
            self.api.create(&PostParams::default(), plan).await.unwrap();
            return;
        }
        let patch = serde_json::json!({"spec": plan.spec});
        self.api
            .patch(self.name(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    /// Replaces the spec of the node's plan with `plan`'s, whole: none of the health checks
    /// or settings of the spec before stays.
    pub async fn replace_spec(&self, plan: &NodeUpdatePlan) {
        let replace = serde_json::json!([{"op": "replace", "path": "/spec", "value": plan.spec}]);
        let patch: json_patch::Patch = serde_json::from_value(replace).unwrap();
        self.api
            .patch(
                self.name(),
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
            .unwrap();
    }

    /// Waits until the status reports `want` for `revision`. When `want` is `RolledBack`,
    /// seeing `Succeeded` for that revision on the way fails at once: an unhealthy revision
    /// must never be reported successful, not even for a moment.
    pub async fn wait_final(&self, want: Phase, revision: &str, label: &str) {
        let check = |status: &inplace_proto::NodeUpdatePlanStatus| {
            if want == Phase::RolledBack && plans::reports(status, Phase::Succeeded, revision) {
                Seen::Wrong("an unhealthy revision was reported Succeeded".to_owned())
            } else if plans::reports(status, want, revision) {
                Seen::Done(())
            } else {
                Seen::Wait
            }
        };
        if let Err(unmet) = plans::wait_status(&self.api, self.name(), PATIENCE, check).await {
            panic!(
                "{label}: never reached {want:?}: {unmet}\n{}",
                self.diagnostics().await
            );
        }
    }

    /// The plan's status and the agent's journal tail, for failure messages.
    pub async fn diagnostics(&self) -> String {
        let status = self.api.get(self.name()).await.ok().and_then(|p| p.status);
        let journal = self
            .node
            .journal("inplace-agent.service", 120)
            .await
            .unwrap_or_default();
        format!("status: {status:?}\nagent journal:\n{journal}")
    }

    /// Writes `text` into the agent's config fragment `path` (under `/etc/inplace/agent.d`)
    /// and restarts the agent to read it.
    pub async fn configure_agent(&self, path: &str, text: &str) {
        self.node
            .write_file(path, text.as_bytes(), 0o644)
            .await
            .unwrap();
        self.node
            .systemctl(&["restart", "inplace-agent.service"])
            .await
            .unwrap();
    }

    /// The agent's journal as its messages only, all of it or from `since` on
    /// ([`Node::messages`]).
    pub async fn agent_messages(&self, since: Option<&str>) -> String {
        self.node
            .messages("inplace-agent.service", since)
            .await
            .expect("the agent's journal")
    }

    /// Waits until the file at `path` on the node (a partial download) holds `at_least`
    /// bytes; its size then.
    pub async fn wait_file_size(&self, path: &str, at_least: u64) -> u64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let size = self.node.file_size(path).await.unwrap();
            if size >= at_least {
                return size;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{path} never reached {at_least} bytes: {}",
                self.diagnostics().await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The `Ready` condition's reason and message.
    pub async fn ready(&self) -> (String, String) {
        let status = self.api.get(self.name()).await.unwrap().status.unwrap();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .expect("a Ready condition");
        (ready.reason.clone(), ready.message.clone())
    }

    /// The real `kubectl` of the pinned release as an admin; panics with its stderr when it
    /// fails.
    pub async fn kubectl(&self, args: &[&str]) -> String {
        let kubectl = inplace_tests::apiserver::kubectl().expect("the pinned kubectl");
        let out = tokio::process::Command::new(kubectl)
            .env("KUBECONFIG", self.work.path().join("admin.kubeconfig"))
            .env("HOME", self.work.path())
            .arg("--cache-dir")
            .arg(self.work.path().join("kubectl-cache"))
            .args(args)
            .kill_on_drop(true)
            .output()
            .await
            .expect("kubectl runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// `phase reason` of the node's plan, read with `kubectl get`.
    pub async fn phase_and_reason_by_kubectl(&self) -> String {
        self.kubectl(&[
            "get",
            "nodeupdateplan",
            self.name(),
            "-o",
            r#"jsonpath={.status.phase} {.status.conditions[?(@.type=="Ready")].reason}"#,
        ])
        .await
    }
}

/// What every node of a suite needs besides the node itself: the API with the agent's
/// objects, the artifact server and the work directory.
struct Setup {
    test_api: TestApi,
    api: kube::Api<NodeUpdatePlan>,
    server: ArtifactServer,
    work: tempfile::TempDir,
}

impl Setup {
    /// Applies the CRDs and the agent's RBAC and admission policy, starts an artifact server
    /// and writes the admin kubeconfig into `work`.
    async fn prepare(test_api: TestApi, work: tempfile::TempDir) -> Setup {
        inplace_tests::prereq::require_nspawn().expect("prerequisites");
        inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");
        test_api
            .install_agent_objects()
            .await
            .expect("the CRDs and the agent's RBAC and admission policy apply");
        let api = kube::Api::all(test_api.client().await.unwrap());
        let server = ArtifactServer::start().await.unwrap();
        test_api
            .write_admin_kubeconfig(&work.path().join("admin.kubeconfig"))
            .unwrap();
        Setup {
            test_api,
            api,
            server,
            work,
        }
    }

    /// Installs the agent on the booted `node` with `identity` as the kubelet's kubeconfig
    /// and `unit_drop_in`, and starts it.
    async fn start_agent(
        self,
        node: Node,
        identity: &str,
        unit_drop_in: Option<&str>,
    ) -> AgentNode {
        let agent = Path::new(env!("CARGO_BIN_EXE_inplace-agent"));
        install::put_agent(&node, agent, &self.server.url("/"), identity)
            .await
            .unwrap();
        if let Some(drop_in) = unit_drop_in {
            node.write_file(AGENT_DROP_IN, drop_in.as_bytes(), 0o644)
                .await
                .unwrap();
        }
        let started = install::start_agent(&node).await;
        let bed = self.into_bed(node);
        if let Err(e) = started {
            panic!("{e}\n{}", bed.diagnostics().await);
        }
        bed
    }

    /// The bed of `node`, on which the agent is installed.
    fn into_bed(self, node: Node) -> AgentNode {
        AgentNode {
            test_api: self.test_api,
            api: self.api,
            server: self.server,
            node,
            work: self.work,
            kubelet_healthz: None,
        }
    }
}

/// `plan`, activated by a reboot (`activation.mode: Reboot`) instead of its unit restarts.
pub fn by_reboot(mut plan: NodeUpdatePlan) -> NodeUpdatePlan {
    plan.spec.content.activation.mode = Some(ActivationMode::Reboot);
    plan
}

/// Where a suite's drop-in for the agent's unit goes.
const AGENT_DROP_IN: &str = "/etc/systemd/system/inplace-agent.service.d/test.conf";

/// Options for a node whose systemd can enforce `IPAddressDeny=`: systemd-nspawn withholds
/// the `bpf` system call and `CAP_BPF` by default, and systemd then ignores the setting
/// without a word (a denied connection succeeds).
pub fn with_bpf() -> NodeOptions {
    NodeOptions {
        extra_nspawn_args: vec![
            "--capability=CAP_BPF,CAP_PERFMON".to_owned(),
            "--system-call-filter=bpf".to_owned(),
        ],
        ..NodeOptions::default()
    }
}

/// The stand-in kubelet (`inplace-tests`' `fake-kubelet` binary), built for this test run:
/// cargo builds a dependency's binaries only when asked, and a stale copy would test old
/// code. A no-op when it is up to date (`inplace_tests::workspace_build`).
pub async fn fake_kubelet_binary() -> PathBuf {
    tokio::task::spawn_blocking(|| inplace_tests::workspace_build::workspace_bin("fake-kubelet"))
        .await
        .unwrap()
        .expect("the fake kubelet builds")
}
