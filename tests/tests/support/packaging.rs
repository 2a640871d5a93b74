//! Helpers shared by the node-packaging tests: building packages, the API server, waiting.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inplace_proto::NodeUpdatePlan;
use inplace_tests::nspawn::Node;
use inplace_tests::plans::{Seen, wait_status};
use inplace_tests::test_api::TestApi;

/// How long any one step may take on a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(180);

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The agent binary of this workspace, built first (a no-op when current).
pub fn agent_binary() -> PathBuf {
    workspace_binary("inplace-agent")
}

/// `bin` of this workspace, built first in this test's own target directory and profile
/// (`inplace_tests::workspace_build`: a no-op when the workspace's test build made it).
pub fn workspace_binary(bin: &str) -> PathBuf {
    inplace_tests::workspace_build::workspace_bin(bin).expect("the workspace builds")
}

/// The real API server with the CRDs and the agent's shipped RBAC and admission policy, and
/// the plans as its admin: the packaged agent runs with its node's kubelet identity only.
pub async fn api_for_agents() -> (TestApi, kube::Api<NodeUpdatePlan>) {
    let test_api = TestApi::start().await.expect("the API server starts");
    test_api
        .install_agent_objects()
        .await
        .expect("the CRDs and the agent's RBAC and admission policy apply");
    let api = kube::Api::all(test_api.client().await.unwrap());
    (test_api, api)
}

/// The node's kubelet identity (`system:node:<name>`) as `/etc/kubernetes/kubelet.conf`,
/// where kubeadm writes it when the node joins: the packaged agent's default credential.
pub async fn write_kubelet_identity(node: &Node, test_api: &TestApi) {
    node.write_file(
        "/etc/kubernetes/kubelet.conf",
        test_api
            .node_kubeconfig_yaml(node.name())
            .unwrap()
            .as_bytes(),
        0o600,
    )
    .await
    .unwrap();
}

/// Flatcar's own boot step, which its images ship: systemd 252 reads unit files before
/// systemd-sysext merges `/usr` at boot, so after the merge systemd is reloaded and the boot
/// targets queued again, and the units an extension ships (the agent's) start when enabled.
pub async fn install_ensure_sysext(node: &Node) {
    node.copy_from_host(
        repo().join("tests/bench/units/ensure-sysext.service"),
        "/etc/systemd/system/ensure-sysext.service",
        0o644,
    )
    .await
    .unwrap();
    node.symlink(
        "/etc/systemd/system/ensure-sysext.service",
        "/etc/systemd/system/sysinit.target.wants/ensure-sysext.service",
    )
    .await
    .unwrap();
}

/// Runs a cached tool installer (`tests/butane/build.sh`, `tests/ansible/install.sh`) with
/// `<this test's target directory>/<under>` as its destination, the place `make node-tools`
/// fills for the default target directory, and returns that path.
pub fn node_tool(installer: &str, under: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dest = exe.ancestors().nth(3).unwrap().join(under);
    let ran = std::process::Command::new(repo().join(installer))
        .arg(&dest)
        .output()
        .expect("the installer runs");
    assert!(
        ran.status.success(),
        "{installer}: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    dest
}

pub fn build(script: &str, out: &Path) -> PathBuf {
    let output = std::process::Command::new(repo().join(script))
        .arg(agent_binary())
        .arg(env!("CARGO_PKG_VERSION"))
        .arg(out)
        .output()
        .expect("the builder runs");
    assert!(
        output.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// A plan the default policy refuses (its URL is outside `allowed_url_prefixes`): the agent
/// must report `PolicyDenied` for its revision without touching the node.
pub fn refused_plan(node: &str) -> NodeUpdatePlan {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "inplace.dev/v1alpha1",
        "kind": "NodeUpdatePlan",
        "metadata": {"name": node},
        "spec": {
            "nodeName": node,
            "desiredState": "Active",
            "artifacts": [
                {"name": "kubernetes", "type": "Sysext",
                 "url": "https://not-allowed.invalid/kubernetes.raw",
                 "sha256": "0".repeat(64), "size": 1},
            ],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"units": ["kubelet.service"], "window": "3s", "timeout": "60s"},
        }
    }))
    .unwrap()
}

pub async fn wait_reported(api: &kube::Api<NodeUpdatePlan>, node: &Node, revision: &str) {
    let denied = |status: &inplace_proto::NodeUpdatePlanStatus| {
        if status.target_revision.as_deref() == Some(revision)
            && status.conditions.iter().any(|c| c.reason == "PolicyDenied")
        {
            Seen::Done(())
        } else {
            Seen::Wait
        }
    };
    if let Err(unmet) = wait_status(api, node.name(), PATIENCE, denied).await {
        let journal = node
            .journal("inplace-agent.service", 80)
            .await
            .unwrap_or_default();
        panic!("the packaged agent never reported PolicyDenied: {unmet}\n{journal}");
    }
}
