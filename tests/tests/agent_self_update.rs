//! The agent updating itself through its plan (issue 23) on a real systemd 252 node, against
//! the real kube-apiserver: the agent installed from its own sysext image as flatcar.md
//! installs it (with the guard units beside it). v1 -> v2 runs docs/usage/agent-updates.md's
//! blocks as written (minisign, the NodeRelease with `spec.agent`, the NodeRollout, the real
//! controller) and succeeds with the kubelet untouched; then three broken v3 agents in turn,
//! each a plan written as the controller writes one (one exits 1 at start, one hangs before
//! READY=1, one whose credential the server refuses), each end with the node back on v2 and
//! the plan `RolledBack` for `AgentNotConfirmed`; then a plan for v2 again (another image
//! at the same version) is `Succeeded` at once with nothing switched, and one for v1 is
//! refused as a downgrade (`DowngradeDenied`). One node boot for all: each broken switch
//! starts from v2 and must leave the node on v2, which is what the next one starts from. The images come from `inplace_tests::agent_images`, checked on the host by the second
//! test; the node's setup and the plans are support/switch_node.rs's.
//!
//! Needs root, systemd-nspawn, debootstrap and squashfs-tools.

use crate::support;

use std::path::Path;

use inplace_proto::Phase;
use inplace_tests::agent_images::{
    Behaviour, ReleaseKey, agent_binary_at, agent_image, next_version,
};
use inplace_tests::artifact_server::{Artifact, ArtifactServer};
use inplace_tests::nspawn::{Node, NodeOptions};

use support::packaging::{api_for_agents, build, repo};
use support::switch_node::{assert_running, install_agent, kubelet_start, order, wait_phase};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_updates_itself_and_broken_agents_are_rolled_back() {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");
    let v1 = env!("CARGO_PKG_VERSION");
    let v2 = next_version(v1, 2);
    let v3 = next_version(v1, 3);

    let out = tempfile::tempdir().unwrap();
    let (test_api, plans) = api_for_agents().await;
    let server = ArtifactServer::start().await.unwrap();
    let key = ReleaseKey::generate().unwrap();
    let name = Node::unique_name("agentup");
    let node = Node::boot(&name, NodeOptions::default())
        .await
        .expect("node boots");
    let v1_image = build("packaging/node/build-sysext.sh", &out.path().join("v1"));
    install_agent(
        &node,
        &test_api,
        &key,
        &server.url("/"),
        &v1_image,
        20,
        false,
    )
    .await;
    let kubelet_started = kubelet_start(&node).await;

    // v1 -> v2 as docs/usage/agent-updates.md says, through a NodeRelease and a NodeRollout
    // and the real controller: the plan succeeds on the new agent; the kubelet runs on.
    let refused = refused_kubeconfig(&test_api, node.name());
    let v2_binary = agent_binary_at(&v2).unwrap();
    let image = agent_image(Behaviour::Works, &v2_binary, &v2, out.path(), &refused).unwrap();
    let admin = out.path().join("admin.kubeconfig");
    test_api.write_admin_kubeconfig(&admin).unwrap();
    create_ready_node(&test_api, node.name()).await;
    let controller = start_controller(&admin, out.path());
    roll_out_as_the_page_says(&node, &server, &image, &v2, out.path(), &admin).await;
    let revision = plans.get(node.name()).await.unwrap().spec.revision.unwrap();
    let status = wait_phase(&plans, &node, &revision, Phase::Succeeded).await;
    assert_eq!(status.current_revision.as_deref(), Some(revision.as_str()));
    assert_eq!(status.agent_version.as_deref(), Some(v2.as_str()));
    assert_running(&node, &v2, &image, &kubelet_started).await;
    // From here the plans are written as the controller writes them, one per broken agent.
    drop(controller);

    // Each broken v3 ends with v2 running again and the plan RolledBack.
    // The refused identity is the real agent at v3; the other two are scripts.
    let v3_binary = agent_binary_at(&v3).unwrap();
    for behaviour in [
        Behaviour::ExitsAtStart,
        Behaviour::HangsBeforeReady,
        Behaviour::IdentityRefused,
    ] {
        let dir = out.path().join(format!("v3-{behaviour:?}"));
        let broken = agent_image(behaviour, &v3_binary, &v3, &dir, &refused).unwrap();
        let case = format!("{behaviour:?}");
        let revision = order(&plans, &node, &server, &key, (&broken, &v3), &case).await;
        let status = wait_phase(&plans, &node, &revision, Phase::RolledBack).await;
        // The previous agent's report: RolledBack, the guard's reason and what PID 1 knew.
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap_or_else(|| panic!("{behaviour:?}: no Ready condition: {status:?}"));
        assert_eq!(ready.reason, "RolledBack", "{behaviour:?}: {status:?}");
        assert!(
            ready.message.contains("AgentNotConfirmed")
                && ready
                    .message
                    .contains(&format!("agent {v3} did not confirm")),
            "{behaviour:?}: {}",
            ready.message
        );
        assert!(status.failed_revisions.contains(&revision), "{status:?}");
        assert_eq!(status.agent_version.as_deref(), Some(v2.as_str()));
        assert_running(&node, &v2, &image, &kubelet_started).await;
    }

    // A plan for the version that runs replaces nothing, even with another image (here one
    // that would exit at start): Succeeded at once, v2 runs on. (It started a switch whose
    // two agents reported the same version: interrupted before the swap, the node waited for
    // a guard never armed; here the guard restored v2 and the plan ended RolledBack.)
    let dir = out.path().join("v2-again");
    let same = agent_image(Behaviour::ExitsAtStart, &v3_binary, &v2, &dir, &refused).unwrap();
    let revision = order(&plans, &node, &server, &key, (&same, &v2), "same-version").await;
    let status = wait_phase(&plans, &node, &revision, Phase::Succeeded).await;
    assert_eq!(status.current_revision.as_deref(), Some(revision.as_str()));
    assert_running(&node, &v2, &image, &kubelet_started).await;

    // A lower version than the one that runs is a downgrade, refused at spec.agent.version
    // (an old agent is signed as well as a new one).
    let revision = order(&plans, &node, &server, &key, (&v1_image, v1), "downgrade").await;
    let status = wait_phase(&plans, &node, &revision, Phase::Failed).await;
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "DowngradeDenied", "{status:?}");
    assert!(
        ready.message.contains("spec.agent.version")
            && ready.message.contains(&format!("{v1} is lower than {v2}")),
        "{}",
        ready.message
    );
    assert_running(&node, &v2, &image, &kubelet_started).await;
    node.poweroff().await.unwrap();
}

/// The images the switch tests order, checked on the host: the new agent reports the
/// version its image is named and signed for, the signature verifies with the trusted
/// comment the agent requires, and the refused-identity image's vendor layer names its own
/// kubeconfig. Costs the second agent build (see `inplace_tests::agent_images`), no node.
#[test]
fn the_agent_images_carry_their_version_and_a_signature_naming_it() {
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");
    let version = next_version(env!("CARGO_PKG_VERSION"), 2);
    let out = tempfile::tempdir().unwrap();
    let key = ReleaseKey::generate().unwrap();

    let binary = agent_binary_at(&version).unwrap();
    let reported = std::process::Command::new(&binary)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&reported.stdout).trim(),
        format!("inplace-agent {version}")
    );

    let image = agent_image(
        Behaviour::IdentityRefused,
        &binary,
        &version,
        out.path(),
        "refused",
    )
    .unwrap();
    let file = image.file_name().unwrap().to_str().unwrap().to_owned();
    assert_eq!(file, format!("inplace-agent-{version}-x86-64.raw"));
    let signature = key.sign(&image, &version).unwrap();
    let signature =
        minisign::SignatureBox::from_string(&std::fs::read_to_string(signature).unwrap()).unwrap();
    assert_eq!(
        signature.trusted_comment().unwrap(),
        format!("file:{file} version:{version}")
    );
    let public = minisign::PublicKeyBox::from_string(&key.public_file().unwrap())
        .unwrap()
        .into_public_key()
        .unwrap();
    minisign::verify(
        &public,
        &signature,
        std::io::Cursor::new(std::fs::read(&image).unwrap()),
        true,
        false,
        false,
    )
    .expect("the signature verifies");
    let vendor = std::process::Command::new("unsquashfs")
        .args(["-cat"])
        .arg(&image)
        .arg("usr/lib/inplace/agent.toml")
        .output()
        .unwrap();
    let vendor = String::from_utf8_lossy(&vendor.stdout);
    assert!(
        vendor.contains("[kubernetes]\nkubeconfig = \"/usr/lib/inplace/refused.kubeconfig\""),
        "{vendor}"
    );
}

/// The page's blocks, as written: the release key made as signing.md makes it, the image
/// (built at `version`) signed and described, served from the test's server, the release and
/// the rollout applied and waited for.
async fn roll_out_as_the_page_says(
    node: &Node,
    server: &ArtifactServer,
    image: &Path,
    version: &str,
    root: &Path,
    admin: &Path,
) {
    use inplace_tests::docs::{run_as_a_person, shell_block, with_assignment};
    let packages = root.join("target/packages");
    std::fs::create_dir_all(&packages).unwrap();
    let file = image.file_name().unwrap().to_str().unwrap();
    std::fs::copy(image, packages.join(file)).unwrap();
    run_as_a_person(
        "minisign -G -W -p release.pub -s release.key",
        &packages,
        &[],
    )
    .unwrap();
    node.copy_from_host(
        packages.join("release.pub"),
        "/etc/inplace/keys/release.pub",
        0o644,
    )
    .await
    .unwrap();

    let page = repo().join("docs/usage/agent-updates.md");
    let release = shell_block(&page, "## The release: build, sign, describe").unwrap();
    let release = with_assignment(&release, "version", version).unwrap();
    let base_url = server.url("");
    let release = with_assignment(&release, "base_url", &base_url).unwrap();
    run_as_a_person(&release, root, &[]).unwrap();
    for served in [file.to_owned(), format!("{file}.minisig")] {
        server.put(
            &format!("/{served}"),
            Artifact::file(packages.join(&served)).unwrap(),
        );
    }

    // The rollout block runs where the release block left the shell, with its variables.
    let rollout = shell_block(&page, "## The rollout").unwrap();
    let envs = [
        ("version", std::ffi::OsStr::new(version)),
        ("KUBECONFIG", admin.as_os_str()),
    ];
    tokio::task::block_in_place(|| run_as_a_person(&rollout, &packages, &envs)).unwrap();
}

/// The node as the API server knows it, Ready (no kubelet runs here to register it): the
/// rollout selects nodes, and an updated node must be Ready.
async fn create_ready_node(test_api: &inplace_tests::test_api::TestApi, name: &str) {
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }))
    .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Node>::all(test_api.client().await.unwrap())
        .create(&Default::default(), &node)
        .await
        .unwrap();
}

/// The controller, as admin (RBAC is not what this suite is about), until dropped.
fn start_controller(admin: &Path, out: &Path) -> tokio::process::Child {
    inplace_tests::install::spawn_controller(
        &support::packaging::workspace_binary("inplace-controller"),
        admin,
        &out.join("controller.log"),
    )
    .unwrap()
}

/// A kubeconfig for the server with a bearer token it does not know: every request is 401.
fn refused_kubeconfig(test_api: &inplace_tests::test_api::TestApi, node: &str) -> String {
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&test_api.node_kubeconfig_yaml(node).unwrap()).unwrap();
    config["users"][0]["user"] =
        serde_yaml::to_value(serde_json::json!({"token": "not-a-credential-this-server-knows"}))
            .unwrap();
    serde_yaml::to_string(&config).unwrap()
}
