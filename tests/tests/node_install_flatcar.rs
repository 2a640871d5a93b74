//! docs/usage/flatcar.md's Butane install, as a person runs it: the page's commands fill in
//! packaging/node/flatcar/inplace-agent.bu and transpile it with the real `butane --strict`
//! (tests/butane/go.mod); the Ignition config it writes holds what the sysext install needs,
//! and applied to a real systemd 252 node before a (re)boot, the way Ignition's files stage
//! does, it gives a node whose agent runs from the merged image against the real
//! kube-apiserver with the node's kubelet identity, and the self-update guard's path unit
//! enabled and watching. Needs root, systemd-nspawn, debootstrap,
//! squashfs-tools and Go; a missing prerequisite fails with an install hint.

use crate::support;

use std::path::Path;
use std::process::Command;

use inplace_tests::artifact_server::{Artifact, ArtifactServer};
use inplace_tests::ignition::{Config, PRESET_FILE};
use inplace_tests::nspawn::{Node, NodeOptions};
use kube::api::PostParams;

use support::packaging::{
    PATIENCE, api_for_agents, build, install_ensure_sysext, node_tool, refused_plan, repo,
    wait_reported, write_kubelet_identity,
};

const STORED: &str = "/opt/extensions/inplace-agent/inplace-agent-0.1.0-x86-64.raw";
const LINK: &str = "/etc/extensions/inplace-agent.raw";

/// The guard of the agent's self-update, installed beside the image (not in it).
const GUARD_UNITS: [&str; 2] = ["inplace-agent-guard.path", "inplace-agent-guard.service"];

/// The page's commands in a copy of the layout they expect (the repository root with
/// `target/packages/` holding the image, `packaging/node/flatcar/` the Butane file and
/// `systemd/` the guard's units it reads), with `base_url` pointing at `base_url`.
fn run_documented_butane(image: &Path, base_url: &str) -> String {
    let block = inplace_tests::docs::shell_block(
        &repo().join("docs/usage/flatcar.md"),
        "## Installing with Butane / Ignition",
    )
    .unwrap();
    let block = inplace_tests::docs::with_assignment(&block, "base_url", base_url).unwrap();
    let root = tempfile::tempdir().unwrap();
    let packages = root.path().join("target/packages");
    let flatcar = root.path().join("packaging/node/flatcar");
    std::fs::create_dir_all(&packages).unwrap();
    std::fs::create_dir_all(&flatcar).unwrap();
    std::fs::copy(image, packages.join(image.file_name().unwrap())).unwrap();
    std::fs::copy(
        repo().join("packaging/node/flatcar/inplace-agent.bu"),
        flatcar.join("inplace-agent.bu"),
    )
    .unwrap();
    std::fs::create_dir(root.path().join("systemd")).unwrap();
    for unit in GUARD_UNITS {
        let unit = format!("systemd/{unit}");
        std::fs::copy(repo().join(&unit), root.path().join(&unit)).unwrap();
    }
    let path = format!(
        "{}:{}",
        node_tool("tests/butane/build.sh", "butane/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let ran = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .current_dir(root.path())
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        ran.status.success(),
        "flatcar.md's commands failed:\n{block}\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    std::fs::read_to_string(packages.join("inplace-agent.ign")).unwrap()
}

/// What the sysext install needs, read from the Ignition config.
fn check_config(config: &Config, image_url: &str, image: &[u8]) {
    assert!(config.ignition.version.starts_with("3."), "{config:?}");
    let stored = config.file(STORED).expect("the image is stored versioned");
    assert_eq!(stored.contents.source, image_url);
    assert_eq!(stored.mode, Some(0o644));
    let sha512 = {
        use sha2::Digest;
        hex::encode(sha2::Sha512::digest(image))
    };
    assert_eq!(
        stored.contents.verification.get("hash"),
        Some(&format!("sha512-{sha512}")),
        "Ignition checks the image against the sha512 the page computes"
    );
    let toml = config.file("/etc/inplace/agent.toml").expect("the config");
    let toml = toml.contents.bytes(&toml.path, |_| unreachable!()).unwrap();
    let toml = String::from_utf8(toml).unwrap();
    assert!(toml.contains("allowed_url_prefixes"), "{toml}");
    let link = &config.storage.links;
    assert_eq!(link.len(), 1, "{link:?}");
    assert_eq!(
        (link[0].path.as_str(), link[0].target.as_str(), link[0].hard),
        (LINK, STORED, false)
    );
    let agent = config
        .unit("inplace-agent.service")
        .expect("the agent unit");
    assert_eq!(agent.enabled, Some(true));
    assert!(agent.contents.is_none(), "the unit comes from the image");
    let target = config
        .unit("multi-user.target")
        .expect("the upholds drop-in");
    assert!(
        target.dropins[0]
            .contents
            .contains("Upholds=inplace-agent.service"),
        "{target:?}"
    );
    // The guard: the shipped unit files as they are, the path unit enabled (the service is
    // started by it and has no [Install] section).
    for (name, enabled) in GUARD_UNITS.into_iter().zip([Some(true), None]) {
        let unit = config.unit(name).expect("the guard's unit");
        let shipped = std::fs::read_to_string(repo().join("systemd").join(name)).unwrap();
        assert_eq!(unit.contents.as_deref(), Some(shipped.as_str()), "{name}");
        assert_eq!(unit.enabled, enabled, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flatcar_butane_config_as_documented_installs_a_running_agent() {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");
    inplace_tests::prereq::require_tools(&["go", "curl", "sha512sum"]).expect("prerequisites");

    let out = tempfile::tempdir().unwrap();
    let image = build("packaging/node/build-sysext.sh", out.path());
    let image_bytes = std::fs::read(&image).unwrap();
    let server = ArtifactServer::start().await.unwrap();
    let file_name = image.file_name().unwrap().to_str().unwrap().to_owned();
    server.put(
        &format!("/v0.1.0/{file_name}"),
        Artifact::bytes(image_bytes.clone()),
    );
    let base_url = server.url("/v0.1.0");
    let image_url = format!("{base_url}/{file_name}");

    let ignition = run_documented_butane(&image, &base_url);
    let config = Config::parse(&ignition).expect("butane writes Ignition this test applies");
    check_config(&config, &image_url, &image_bytes);

    let (test_api, api) = api_for_agents().await;
    let name = Node::unique_name("butane");
    let mut node = Node::boot(&name, NodeOptions::default())
        .await
        .expect("node boots");
    install_ensure_sysext(&node).await;
    // The kubelet's identity, as kubeadm would write it when the node joins.
    write_kubelet_identity(&node, &test_api).await;
    config
        .apply(&node, |url| {
            let fetched =
                tokio::task::block_in_place(|| Command::new("curl").args(["-fsS", url]).output())
                    .unwrap();
            assert!(fetched.status.success(), "curl {url}");
            Ok(fetched.stdout)
        })
        .await
        .expect("the Ignition config applies");
    assert!(
        String::from_utf8(node.read_file(PRESET_FILE).await.unwrap())
            .unwrap()
            .contains("enable inplace-agent.service")
    );

    node.reboot_and_wait()
        .await
        .expect("the node boots with the config");
    let merged = node.merged_extensions().await.unwrap();
    assert!(merged.iter().any(|e| e == "inplace-agent"), "{merged:?}");
    node.wait_active("inplace-agent.service", PATIENCE)
        .await
        .expect("the agent starts at boot from the merged image (READY sent)");
    let fragment = node
        .systemctl(&[
            "show",
            "-p",
            "FragmentPath",
            "--value",
            "inplace-agent.service",
        ])
        .await
        .unwrap();
    assert!(
        fragment
            .trim()
            .ends_with("lib/systemd/system/inplace-agent.service"),
        "{fragment}"
    );

    // The guard is installed and armed for a pending switch after this (and every) boot.
    for (unit, state) in [
        ("inplace-agent-guard.path", "enabled"),
        ("inplace-agent-guard.service", "static"),
    ] {
        let enabled = node.exec(&["systemctl", "is-enabled", unit]).await.unwrap();
        assert_eq!(enabled.stdout_text().trim(), state, "{unit}");
    }
    assert!(
        node.is_active("inplace-agent-guard.path").await.unwrap(),
        "the guard's path unit watches for a pending switch"
    );

    let plan = refused_plan(&name);
    let revision = inplace_proto::revision_of(&plan.spec.content);
    api.create(&PostParams::default(), &plan).await.unwrap();
    wait_reported(&api, &node, &revision).await;
    node.poweroff().await.unwrap();
}
