//! The agent packaged as a systemd-sysext image (packaging/node/build-sysext.sh, the same
//! builder `scripts/package.sh` runs) merged on a real systemd 252 node, enabled and
//! started from the image, running against the real kube-apiserver on host loopback with its
//! node's kubelet identity and the shipped RBAC only: it becomes
//! active (Type=notify READY) and reports on its plan. Needs root, systemd-nspawn,
//! debootstrap and squashfs-tools; a missing prerequisite fails with an install hint.

use crate::support;

use inplace_tests::nspawn::{Node, NodeOptions};
use kube::api::PostParams;

use support::packaging::{
    PATIENCE, api_for_agents, build, refused_plan, wait_reported, write_kubelet_identity,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sysext_merges_enables_and_reports_on_a_real_node() {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");

    let out = tempfile::tempdir().unwrap();
    let image = build("packaging/node/build-sysext.sh", out.path());
    let file_name = image.file_name().unwrap().to_str().unwrap().to_owned();
    assert_eq!(
        file_name,
        format!("inplace-agent-{}-x86-64.raw", env!("CARGO_PKG_VERSION"))
    );
    // SHA256SUMS names the image with its digest, like sysext-bakery's.
    let sums = std::fs::read_to_string(out.path().join("SHA256SUMS")).unwrap();
    let bytes = std::fs::read(&image).unwrap();
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&bytes))
    };
    assert!(sums.contains(&format!("{digest}  {file_name}")), "{sums}");
    // Reproducible: a second build is byte for byte the same.
    let again = tempfile::tempdir().unwrap();
    let second = build("packaging/node/build-sysext.sh", again.path());
    assert_eq!(
        std::fs::read(second).unwrap(),
        bytes,
        "the image is reproducible"
    );

    let (test_api, api) = api_for_agents().await;

    let name = Node::unique_name("pkgsysext");
    let node = Node::boot(&name, NodeOptions::default())
        .await
        .expect("node boots");
    assert!(!node.exists("/usr/bin/inplace-agent").await.unwrap());

    // What a Flatcar node does with a sysext-bakery image: store it versioned, link it as
    // /etc/extensions/<name>.raw (systemd-sysext requires the file name to match the
    // extension-release name), merge, reload PID 1.
    let stored = format!("/opt/extensions/inplace-agent/{file_name}");
    node.copy_from_host(&image, &stored, 0o644).await.unwrap();
    node.symlink(&stored, "/etc/extensions/inplace-agent.raw")
        .await
        .unwrap();
    node.sh_ok("systemd-sysext refresh && systemctl daemon-reload")
        .await
        .expect("the image merges");
    let merged = node.merged_extensions().await.unwrap();
    assert!(
        merged.iter().any(|e| e.contains("inplace-agent")),
        "{merged:?}"
    );
    for path in [
        "/usr/bin/inplace-agent",
        "/usr/lib/systemd/system/inplace-agent.service",
        "/usr/lib/tmpfiles.d/inplace-agent.conf",
        "/usr/lib/inplace/agent.toml",
    ] {
        assert!(node.exists(path).await.unwrap(), "{path} is in the image");
    }
    // The vendor defaults shipped in the image are a valid configuration.
    node.sh_ok("inplace-agent check-config")
        .await
        .expect("the shipped defaults validate");

    // The node's own configuration and identity (the kubelet's kubeconfig, by default).
    node.write_file(
        "/etc/inplace/agent.toml",
        b"[activation]\nhealth_interval = \"200ms\"\n",
        0o644,
    )
    .await
    .unwrap();
    write_kubelet_identity(&node, &test_api).await;
    let started = node
        .sh("systemd-tmpfiles --create inplace-agent.conf && systemctl enable --now inplace-agent.service")
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
    node.wait_active("inplace-agent.service", PATIENCE)
        .await
        .expect("the packaged agent starts (Type=notify: READY sent)");
    let unit = node
        .systemctl(&[
            "show",
            "-p",
            "FragmentPath",
            "-p",
            "UnitFileState",
            "inplace-agent.service",
        ])
        .await
        .unwrap();
    // From the merged image (/lib is /usr/lib on a merged-/usr Debian), not from /etc.
    assert!(
        unit.contains("FragmentPath=/usr/lib/systemd/system/inplace-agent.service")
            || unit.contains("FragmentPath=/lib/systemd/system/inplace-agent.service"),
        "{unit}"
    );
    assert!(unit.contains("UnitFileState=enabled"), "{unit}");

    let plan = refused_plan(&name);
    let revision = inplace_proto::revision_of(&plan.spec.content);
    api.create(&PostParams::default(), &plan).await.unwrap();
    wait_reported(&api, &node, &revision).await;

    // Removing the image and refreshing takes the agent away again.
    node.sh_ok(
        "systemctl disable --now inplace-agent.service && rm /etc/extensions/inplace-agent.raw && systemd-sysext refresh && systemctl daemon-reload",
    )
    .await
    .unwrap();
    assert!(!node.exists("/usr/bin/inplace-agent").await.unwrap());
    node.poweroff().await.unwrap();
}
