//! End to end on a real systemd host: a Debian node booted with systemd-nspawn (systemd 252
//! as PID 1, real D-Bus, real systemd-sysext with squashfs images), the real agent binary
//! running under the shipped, hardened unit file, the API emulator and an artifact server
//! on host loopback (the node shares the host's network). Needs root, systemd-nspawn,
//! debootstrap and squashfs-tools; a missing prerequisite fails with an install hint.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use inplace_api_emulator::{Emulator, EmulatorConfig, User};
use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::nspawn::{Node, NodeOptions};
use inplace_tests::sysext::{Incompatibility, SysextBuilder, SysextImage};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;

mod real_node;

const PATIENCE: Duration = Duration::from_secs(180);

/// A kubelet stand-in shipped inside the sysext: healthy sleeps, broken dies after 1 s.
fn kubelet_script(healthy: bool) -> Vec<u8> {
    if healthy {
        b"#!/bin/sh\nexec sleep infinity\n".to_vec()
    } else {
        b"#!/bin/sh\nsleep 1\nexit 1\n".to_vec()
    }
}

async fn image(
    dir: &Path,
    tag: &str,
    healthy: bool,
    broken: Option<Incompatibility>,
) -> SysextImage {
    let mut builder = SysextBuilder::new("kubernetes").file(
        "usr/bin/kubelet-sim",
        kubelet_script(healthy),
        0o755,
    );
    if let Some(how) = broken {
        builder = builder.incompatible(how);
    }
    builder
        .build(&dir.join(format!("kubernetes-{tag}.raw")))
        .await
        .expect("mksquashfs")
}

fn plan(
    node: &str,
    server: &ArtifactServer,
    tag: &str,
    img: &SysextImage,
    kubectl: &[u8],
) -> NodeUpdatePlan {
    plan_with_window(node, server, tag, img, kubectl, "3s")
}

fn plan_with_window(
    node: &str,
    server: &ArtifactServer,
    tag: &str,
    img: &SysextImage,
    kubectl: &[u8],
    window: &str,
) -> NodeUpdatePlan {
    plan_with_checks(node, server, tag, img, kubectl, window, "120s", None)
}

/// `expect_kubelet`: a `kubernetesVersion` whose match the node's `nodeInfo` must report.
#[allow(clippy::too_many_arguments)]
fn plan_with_checks(
    node: &str,
    server: &ArtifactServer,
    tag: &str,
    img: &SysextImage,
    kubectl: &[u8],
    window: &str,
    timeout: &str,
    expect_kubelet: Option<&str>,
) -> NodeUpdatePlan {
    let mut plan = plan_json(node, server, tag, img, kubectl, window, timeout);
    if let Some(version) = expect_kubelet {
        plan["spec"]["kubernetesVersion"] = version.into();
        plan["spec"]["healthChecks"]["nodeKubeletVersion"] = true.into();
    }
    serde_json::from_value(plan).unwrap()
}

fn plan_json(
    node: &str,
    server: &ArtifactServer,
    tag: &str,
    img: &SysextImage,
    kubectl: &[u8],
    window: &str,
    timeout: &str,
) -> serde_json::Value {
    use sha2::Digest;
    serde_json::json!({
        "apiVersion": "inplace.dev/v1alpha1",
        "kind": "NodeUpdatePlan",
        "metadata": {"name": node},
        "spec": {
            "nodeName": node,
            "desiredState": "Active",
            "artifacts": [
                {"name": "kubernetes", "type": "Sysext",
                 "url": server.url(&format!("/{tag}/kubernetes-{tag}.raw")),
                 "sha256": img.sha256, "size": img.size},
                {"name": "kubectl", "type": "Binary",
                 "url": server.url(&format!("/{tag}/kubectl")),
                 "sha256": hex::encode(sha2::Sha256::digest(kubectl)),
                 "path": "/opt/bin/kubectl"},
            ],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"units": ["kubelet.service"], "window": window, "timeout": timeout},
        }
    })
}

async fn wait_for(api: &kube::Api<NodeUpdatePlan>, node: &Node, phase: Phase, revision: &str) {
    let name = node.name().to_owned();
    let revision = revision.to_owned();
    let cond = move |plan: Option<&NodeUpdatePlan>| {
        plan.and_then(|p| p.status.as_ref()).is_some_and(|s| {
            s.phase == Some(phase) && s.target_revision.as_deref() == Some(revision.as_str())
        })
    };
    let found = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Ok(Some(_)) = await_condition(api.clone(), &name, cond.clone()).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    if found.is_err() {
        let status = api.get(&name).await.ok().and_then(|p| p.status);
        let journal = node
            .journal("inplace-agent.service", 80)
            .await
            .unwrap_or_default();
        panic!("never reached {phase:?}; status: {status:?}\nagent journal:\n{journal}");
    }
}

async fn ready_message(api: &kube::Api<NodeUpdatePlan>, name: &str) -> (String, String) {
    let status = api.get(name).await.unwrap().status.unwrap();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    (ready.reason.clone(), ready.message.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_installs_rolls_back_and_refuses_incompatible_images() {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");

    let emulator = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/crds");
    emulator.apply_crd_dir(&crds).await.unwrap();
    let api: kube::Api<NodeUpdatePlan> = kube::Api::all(emulator.client().await.unwrap());
    let server = ArtifactServer::start().await.unwrap();
    let work = tempfile::tempdir().unwrap();

    let name = Node::unique_name("agent");
    let node = Node::boot(&name, NodeOptions::default())
        .await
        .expect("node boots");

    // The agent as a package would install it.
    real_node::install_agent(
        &node,
        &emulator.kubeconfig_yaml(&User::node(&name)),
        &server.url("/"),
    )
    .await;
    let started = node
        .sh("systemd-tmpfiles --create /usr/lib/tmpfiles.d/inplace-agent.conf && systemctl daemon-reload && systemctl start inplace-agent.service")
        .await
        .unwrap();
    if !started.success() {
        let journal = node
            .journal("inplace-agent.service", 80)
            .await
            .unwrap_or_default();
        panic!(
            "the agent did not start: {}\n{journal}",
            started.stderr_text()
        );
    }
    node.wait_active("inplace-agent.service", Duration::from_secs(60))
        .await
        .expect("the agent starts under its hardened unit (Type=notify: READY sent)");

    // A second instance refuses to run.
    let second = node.exec(&["/usr/bin/inplace-agent", "run"]).await.unwrap();
    assert!(!second.success());
    assert!(
        second
            .stderr_text()
            .contains("another inplace-agent is running"),
        "{}",
        second.stderr_text()
    );

    // v1: first install.
    let v1 = image(work.path(), "v1", true, None).await;
    server.put_bytes("/v1/kubernetes-v1.raw", v1.bytes().await.unwrap());
    server.put_bytes("/v1/kubectl", b"#!/bin/sh\necho kubectl-v1\n".to_vec());
    let p1 = plan(&name, &server, "v1", &v1, b"#!/bin/sh\necho kubectl-v1\n");
    let r1 = inplace_proto::revision_of(&p1.spec.content);
    api.create(&PostParams::default(), &p1).await.unwrap();
    wait_for(&api, &node, Phase::Succeeded, &r1).await;
    let link = node
        .exec_ok(&["readlink", "/etc/extensions/kubernetes.raw"])
        .await
        .unwrap();
    assert_eq!(link.trim(), "/opt/extensions/kubernetes/kubernetes-v1.raw");
    assert!(
        node.exists("/usr/lib/extension-release.d/extension-release.kubernetes")
            .await
            .unwrap()
    );
    assert!(node.is_active("kubelet.service").await.unwrap());
    assert_eq!(
        node.exec_ok(&["/opt/bin/kubectl"]).await.unwrap().trim(),
        "kubectl-v1"
    );
    let status_text = node
        .systemctl(&["show", "-p", "StatusText", "inplace-agent.service"])
        .await
        .unwrap();
    assert!(status_text.contains("Succeeded"), "{status_text}");
    // Structured journald fields: the node and the revision are searchable.
    let logs = node
        .exec_ok(&[
            "journalctl",
            "--no-pager",
            "-q",
            &format!("NODE={name}"),
            &format!("REVISION={r1}"),
        ])
        .await
        .unwrap();
    assert!(logs.contains("committed"), "{logs}");

    // v2: kubelet dies after start → rolled back to v1, verified healthy.
    let v2 = image(work.path(), "v2", false, None).await;
    server.put_bytes("/v2/kubernetes-v2.raw", v2.bytes().await.unwrap());
    server.put_bytes("/v2/kubectl", b"#!/bin/sh\necho kubectl-v2\n".to_vec());
    let p2 = plan(&name, &server, "v2", &v2, b"#!/bin/sh\necho kubectl-v2\n");
    let r2 = inplace_proto::revision_of(&p2.spec.content);
    let patch = serde_json::json!({"spec": p2.spec});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&api, &node, Phase::RolledBack, &r2).await;
    let (reason, message) = ready_message(&api, &name).await;
    assert_eq!(reason, "RolledBack");
    assert!(
        message.contains("HealthCheckFailed") && message.contains("kubelet.service"),
        "{message}"
    );
    let link = node
        .exec_ok(&["readlink", "/etc/extensions/kubernetes.raw"])
        .await
        .unwrap();
    assert_eq!(link.trim(), "/opt/extensions/kubernetes/kubernetes-v1.raw");
    assert!(node.is_active("kubelet.service").await.unwrap());
    assert_eq!(
        node.exec_ok(&["/opt/bin/kubectl"]).await.unwrap().trim(),
        "kubectl-v1"
    );

    // v3: an image systemd-sysext skips (wrong ID) → ExtensionNotMerged, rolled back.
    let v3 = image(work.path(), "v3", true, Some(Incompatibility::WrongId)).await;
    server.put_bytes("/v3/kubernetes-v3.raw", v3.bytes().await.unwrap());
    server.put_bytes("/v3/kubectl", b"#!/bin/sh\necho kubectl-v3\n".to_vec());
    let p3 = plan(&name, &server, "v3", &v3, b"#!/bin/sh\necho kubectl-v3\n");
    let r3 = inplace_proto::revision_of(&p3.spec.content);
    let patch = serde_json::json!({"spec": p3.spec});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&api, &node, Phase::RolledBack, &r3).await;
    let (_, message) = ready_message(&api, &name).await;
    assert!(message.contains("ExtensionNotMerged"), "{message}");
    assert!(
        node.exists("/usr/lib/extension-release.d/extension-release.kubernetes")
            .await
            .unwrap()
    );
    assert!(node.is_active("kubelet.service").await.unwrap());
    let status = api.get(&name).await.unwrap().status.unwrap();
    assert_eq!(status.current_revision.as_deref(), Some(r1.as_str()));

    // v4: the agent is killed (SIGKILL) in the middle of the health window; systemd
    // restarts it, it resumes from its journal and commits only after a full window.
    let v4 = image(work.path(), "v4", true, None).await;
    server.put_bytes("/v4/kubernetes-v4.raw", v4.bytes().await.unwrap());
    server.put_bytes("/v4/kubectl", b"#!/bin/sh\necho kubectl-v4\n".to_vec());
    let p4 = plan_with_window(
        &name,
        &server,
        "v4",
        &v4,
        b"#!/bin/sh\necho kubectl-v4\n",
        "20s",
    );
    let r4 = inplace_proto::revision_of(&p4.spec.content);
    let patch = serde_json::json!({"spec": p4.spec});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&api, &node, Phase::Verifying, &r4).await;
    node.systemctl(&["kill", "--signal=SIGKILL", "inplace-agent.service"])
        .await
        .unwrap();
    wait_for(&api, &node, Phase::Succeeded, &r4).await;
    let status = api.get(&name).await.unwrap().status.unwrap();
    assert_eq!(status.current_revision.as_deref(), Some(r4.as_str()));
    // The sandboxed agent can read a boot ID. (Not compared with the node's: nspawn
    // overlays the container's boot_id, and ProtectKernelTunables' remount of /proc/sys
    // shows the kernel's own, which is what a real host has anyway.)
    let boot_id = status.boot_id.clone().unwrap_or_default();
    assert_eq!(boot_id.len(), 36, "{boot_id:?}");
    assert_eq!(
        status.attempts,
        Some(2),
        "the interrupted activation counts"
    );
    let link = node
        .exec_ok(&["readlink", "/etc/extensions/kubernetes.raw"])
        .await
        .unwrap();
    assert_eq!(link.trim(), "/opt/extensions/kubernetes/kubernetes-v4.raw");
    assert!(
        node.exists("/opt/extensions/kubernetes/kubernetes-v1.raw")
            .await
            .unwrap(),
        "previous revision kept"
    );

    // v5: the Node object must report the plan's kubelet version. The API says v1.31.2
    // (written by the test in the kubelet's place); a plan expecting v1.32.0 is rolled
    // back after its timeout, one expecting v1.31.2 commits.
    let admin = emulator.client().await.unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin);
    let node_object = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
    }))
    .unwrap();
    nodes
        .create(&PostParams::default(), &node_object)
        .await
        .unwrap();
    let info = serde_json::json!({"status": {"nodeInfo": {
        "kubeletVersion": "v1.31.2", "architecture": "amd64", "bootID": "",
        "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
        "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""}}});
    nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&info))
        .await
        .unwrap();
    let kubectl5 = b"#!/bin/sh\necho kubectl-v5\n";
    server.put_bytes("/v4/kubectl5", kubectl5.to_vec());
    let mut p5 = plan_with_checks(
        &name,
        &server,
        "v4",
        &v4,
        kubectl5,
        "1s",
        "6s",
        Some("v1.32.0"),
    );
    p5.spec.content.artifacts[1].url = server.url("/v4/kubectl5");
    let r5 = inplace_proto::revision_of(&p5.spec.content);
    let patch = serde_json::json!({"spec": p5.spec});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&api, &node, Phase::RolledBack, &r5).await;
    let (_, message) = ready_message(&api, &name).await;
    assert!(
        message.contains("kubelet v1.31.2, expected v1.32.0"),
        "{message}"
    );
    let mut p6 = plan_with_checks(
        &name,
        &server,
        "v4",
        &v4,
        kubectl5,
        "1s",
        "60s",
        Some("v1.31.2"),
    );
    p6.spec.content.artifacts[1].url = server.url("/v4/kubectl5");
    let r6 = inplace_proto::revision_of(&p6.spec.content);
    let patch = serde_json::json!({"spec": p6.spec});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&api, &node, Phase::Succeeded, &r6).await;
    assert_eq!(
        node.exec_ok(&["/opt/bin/kubectl"]).await.unwrap().trim(),
        "kubectl-v5"
    );

    node.poweroff().await.unwrap();
}
