//! One node running the agent from its own sysext image, as the agent-switch suites set it
//! up (`agent_self_update.rs`, `agent_switch_crash.rs`): the install, the plans they order
//! as the controller writes them, the waits and the checks of what runs.

use std::path::Path;

use inplace_proto::{NodeUpdatePlan, Phase, UpdateContent};
use inplace_tests::agent_images::{ReleaseKey, sha256_hex};
use inplace_tests::artifact_server::{Artifact, ArtifactServer};
use inplace_tests::install;
use inplace_tests::nspawn::Node;
use inplace_tests::test_api::TestApi;
use kube::api::{Patch, PatchParams};

use super::packaging::{PATIENCE, install_ensure_sysext, write_kubelet_identity};

/// The node's policy for these tests (docs/usage/agent-updates.md): switches allowed (to
/// lower versions too with `allow_downgrade`), a short deadline for the new agent
/// (`confirm_timeout` seconds), images only from the test's server.
fn node_policy(prefix: &str, confirm_timeout: u64, allow_downgrade: bool) -> String {
    // The key only where it is on: the default needs no key (and agents built before it
    // existed refuse it).
    let downgrade = if allow_downgrade {
        "allow_downgrade = true\n"
    } else {
        ""
    };
    format!(
        "[policy]\nallowed_url_prefixes = [\"{prefix}\"]\nallow_http = true\n\
         [self_update]\nallow = true\nconfirm_timeout = \"{confirm_timeout}s\"\n{downgrade}"
    )
}

/// A stand-in kubelet, enabled: it starts again with a node that boots again, and its main
/// process's start time says whether anything restarted it.
const KUBELET_UNIT: &str = "[Service]\nExecStart=/bin/sleep infinity\n\
                            [Install]\nWantedBy=multi-user.target\n";

/// The agent's `image` installed as flatcar.md installs it (merged at boot too), the guard
/// units outside its image, the node's identity, the release key and the policy of
/// [`node_policy`]; a stand-in kubelet.
pub async fn install_agent(
    node: &Node,
    test_api: &TestApi,
    key: &ReleaseKey,
    prefix: &str,
    image: &Path,
    confirm_timeout: u64,
    allow_downgrade: bool,
) {
    for file in install::agent_image_files(image).await.unwrap() {
        node.write_file(&file.path, &file.contents, file.mode)
            .await
            .unwrap();
    }
    write_kubelet_identity(node, test_api).await;
    install_ensure_sysext(node).await;
    node.write_file(
        "/etc/inplace/keys/broken-agents.pub",
        key.public_file().unwrap().as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    node.write_file(
        "/etc/inplace/agent.d/50-agent-updates.toml",
        node_policy(prefix, confirm_timeout, allow_downgrade).as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    node.write_file(
        "/etc/systemd/system/kubelet.service",
        KUBELET_UNIT.as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    let name = image.file_name().unwrap().to_str().unwrap();
    node.sh_ok(&install::agent_image_install_script(
        name,
        &["kubelet.service"],
    ))
    .await
    .expect("the agent, the guard's path unit and the kubelet start");
    node.wait_active("inplace-agent.service", PATIENCE)
        .await
        .expect("the agent starts");
}

/// When the kubelet's main process started (µs since boot): unchanged within a boot means
/// never restarted.
pub async fn kubelet_start(node: &Node) -> String {
    node.systemctl(&[
        "show",
        "-p",
        "ExecMainStartTimestampMonotonic",
        "-p",
        "ActiveState",
        "kubelet.service",
    ])
    .await
    .unwrap()
}

/// Publishes the image and its signature under `/<case>/`, and writes the node's plan for
/// it as the controller writes one from a NodeRelease with `spec.agent`. Returns the
/// revision (one per case: the URL is part of it).
pub async fn order(
    plans: &kube::Api<NodeUpdatePlan>,
    node: &Node,
    server: &ArtifactServer,
    key: &ReleaseKey,
    (image, version): (&Path, &str),
    case: &str,
) -> String {
    let file = format!("{case}/{}", image.file_name().unwrap().to_str().unwrap());
    let signature = key.sign(image, version).unwrap();
    server.put(&format!("/{file}"), Artifact::file(image).unwrap());
    server.put(
        &format!("/{file}.minisig"),
        Artifact::file(&signature).unwrap(),
    );
    let bytes = std::fs::read(image).unwrap();
    let content: UpdateContent = serde_json::from_value(serde_json::json!({
        "agent": {
            "version": version,
            "url": server.url(&format!("/{file}")),
            "sha256": sha256_hex(&bytes),
            "size": bytes.len(),
            "signatureUrl": server.url(&format!("/{file}.minisig")),
        }
    }))
    .unwrap();
    let revision = inplace_proto::revision_of(&content);
    let plan = serde_json::json!({
        "apiVersion": "inplace.dev/v1alpha1",
        "kind": "NodeUpdatePlan",
        "metadata": {"name": node.name()},
        "spec": {
            "nodeName": node.name(),
            "revision": revision,
            "release": format!("agent-{version}"),
            "desiredState": "Active",
            "agent": content.agent,
        }
    });
    plans
        .patch(
            node.name(),
            &PatchParams::apply("agent-self-update-test").force(),
            &Patch::Apply(plan),
        )
        .await
        .unwrap();
    revision
}

pub async fn wait_phase(
    plans: &kube::Api<NodeUpdatePlan>,
    node: &Node,
    revision: &str,
    phase: Phase,
) -> inplace_proto::NodeUpdatePlanStatus {
    // The confirm timeout, the guard's restore and a restart on a loaded machine.
    match inplace_tests::plans::wait_phase(plans, node.name(), phase, revision, PATIENCE).await {
        Ok(status) => status,
        Err(unmet) => {
            let agent = node
                .journal("inplace-agent.service", 80)
                .await
                .unwrap_or_default();
            let guard = node
                .journal("inplace-agent-guard.service", 40)
                .await
                .unwrap_or_default();
            // The agent refuses a switch while the path unit is not active: why it is not.
            let unit = "inplace-agent-guard.path";
            let path_state = node
                .systemctl(&["show", "-p", "ActiveState,SubState,Result", unit])
                .await
                .unwrap_or_default();
            let path_journal = node.journal(unit, 20).await.unwrap_or_default();
            panic!(
                "the plan never reached {phase:?}: {unmet}\n{agent}\n{guard}\n{path_state}{path_journal}"
            );
        }
    }
}

/// The merged agent is `version`, from `image`'s bytes, and running; the kubelet's main
/// process is the one that started before any switch.
pub async fn assert_running(node: &Node, version: &str, image: &Path, kubelet_started: &str) {
    assert_eq!(
        kubelet_start(node).await,
        kubelet_started,
        "the kubelet was restarted"
    );
    node.wait_active("inplace-agent.service", PATIENCE)
        .await
        .expect("the agent runs");
    let merged = node.sh_ok("inplace-agent --version").await.unwrap();
    assert_eq!(merged.trim(), format!("inplace-agent {version}"));
    let link = node
        .sh_ok("sha256sum \"$(readlink -f /etc/extensions/inplace-agent.raw)\"")
        .await
        .unwrap();
    let want = sha256_hex(&std::fs::read(image).unwrap());
    assert!(
        link.starts_with(&want),
        "the link is not at {image:?}: {link}"
    );
}
