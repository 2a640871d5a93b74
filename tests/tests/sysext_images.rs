//! Real systemd-sysext images: built with mksquashfs, listed with unsquashfs, and merged (or
//! skipped, when incompatible) by real systemd-sysext inside a systemd-nspawn node.

use std::time::{Duration, Instant};

use inplace_tests::fake_kubelet::FakeKubeletConfig;
use inplace_tests::nspawn::{Node, NodeOptions};
use inplace_tests::sysext::{
    Incompatibility, SysextBuilder, SysextImage, host_architecture, kubernetes_image_file_name,
    kubernetes_sysext,
};

const FAKE_KUBELET: &str = env!("CARGO_BIN_EXE_fake-kubelet");

async fn kubernetes_image(dir: &std::path::Path, version: &str) -> SysextImage {
    kubernetes_sysext(FAKE_KUBELET.as_ref(), &FakeKubeletConfig::healthy(version))
        .await
        .expect("image tree")
        .build(&dir.join(kubernetes_image_file_name(version)))
        .await
        .expect("mksquashfs")
}

#[tokio::test]
async fn builder_makes_a_squashfs_that_unsquashfs_lists() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = kubernetes_image(dir.path(), "v1.31.2").await;
    assert_eq!(
        image.path.file_name().and_then(|n| n.to_str()),
        Some(format!("kubernetes-v1.31.2-{}.raw", host_architecture()).as_str())
    );
    let bytes = image.bytes().await.expect("read");
    assert_eq!(&bytes[..4], b"hsqs", "squashfs magic");
    assert_eq!(image.size, bytes.len() as u64);
    assert_eq!(image.sha256, inplace_tests::sysext::sha256_hex(&bytes));

    let out = tokio::process::Command::new("unsquashfs")
        .arg("-l")
        .arg(&image.path)
        .output()
        .await
        .expect("unsquashfs runs");
    assert!(out.status.success());
    let listing = String::from_utf8_lossy(&out.stdout);
    for path in [
        "squashfs-root/usr/bin/kubelet",
        "squashfs-root/usr/lib/systemd/system/kubelet.service",
        "squashfs-root/usr/lib/extension-release.d/extension-release.kubernetes",
        "squashfs-root/usr/lib/fake-kubelet/config",
    ] {
        assert!(listing.lines().any(|l| l == path), "{path} in\n{listing}");
    }

    // Same content, same bytes: images are reproducible, so sha256 pins them.
    let again = kubernetes_image(&dir.path().join("again"), "v1.31.2").await;
    assert_eq!(again.sha256, image.sha256);
    let other = kubernetes_image(&dir.path().join("other"), "v1.32.0").await;
    assert_ne!(other.sha256, image.sha256);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_systemd_sysext_merges_the_kubernetes_image_and_skips_incompatible_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = kubernetes_image(dir.path(), "v1.31.2").await;
    let node = Node::boot(&Node::unique_name("sysext"), NodeOptions::default())
        .await
        .expect("node boots");

    let stored = node.install_sysext(&image).await.expect("install image");
    assert_eq!(
        stored,
        format!(
            "/opt/extensions/kubernetes/{}",
            kubernetes_image_file_name("v1.31.2")
        )
    );
    assert_eq!(
        node.exec_ok(&["readlink", "/etc/extensions/kubernetes.raw"])
            .await
            .expect("link")
            .trim(),
        stored
    );
    assert!(node.merged_extensions().await.expect("list").is_empty());
    let started = Instant::now();
    node.refresh_sysext()
        .await
        .expect("systemctl runs")
        .checked()
        .expect("sysext refresh");
    eprintln!(
        "systemctl restart systemd-sysext took {:.3} s",
        started.elapsed().as_secs_f64()
    );
    let status = node
        .exec_ok(&["systemd-sysext", "status"])
        .await
        .expect("status");
    assert!(status.contains("kubernetes"), "{status}");
    assert_eq!(
        node.merged_extensions().await.expect("list"),
        vec!["kubernetes".to_owned()]
    );
    let release = node
        .read_file("/usr/lib/extension-release.d/extension-release.kubernetes")
        .await
        .expect("merged release file");
    assert!(String::from_utf8_lossy(&release).contains("ID=debian"));
    assert_eq!(
        node.exec_ok(&["kubelet", "--version"])
            .await
            .expect("kubelet from the image")
            .trim(),
        "Kubernetes v1.31.2"
    );

    node.systemctl(&["daemon-reload"]).await.expect("reload");
    node.systemctl(&["start", "kubelet"]).await.expect("start");
    node.wait_active("kubelet.service", Duration::from_secs(60))
        .await
        .expect("kubelet active");
    let healthz = poll(&node, "http://127.0.0.1:10248/healthz").await;
    assert_eq!(healthz, "ok");
    let version = poll(&node, "http://127.0.0.1:10248/version").await;
    assert!(version.contains("v1.31.2"), "{version}");
    node.systemctl(&["stop", "kubelet"]).await.expect("stop");

    // A kubelet "built to crash" is only different image content: it crash-loops.
    let crashing = kubernetes_sysext(
        FAKE_KUBELET.as_ref(),
        &FakeKubeletConfig::crashing("v1.31.3"),
    )
    .await
    .expect("tree")
    .build(&dir.path().join(kubernetes_image_file_name("v1.31.3")))
    .await
    .expect("crashing image");
    node.install_sysext(&crashing).await.expect("install");
    node.refresh_sysext()
        .await
        .expect("systemctl runs")
        .checked()
        .expect("refresh");
    node.systemctl(&["daemon-reload"]).await.expect("reload");
    node.systemctl(&["start", "kubelet"]).await.expect("start");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let restarts = node
            .exec_ok(&["systemctl", "show", "-P", "NRestarts", "kubelet.service"])
            .await
            .expect("show");
        if restarts.trim().parse::<u32>().unwrap_or(0) >= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no crash loop; restarts {restarts}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        node.exec_ok(&["kubelet", "--version"])
            .await
            .expect("version")
            .trim(),
        "Kubernetes v1.31.3"
    );
    node.systemctl(&["stop", "kubelet"]).await.expect("stop");

    // Each incompatible variant merges nothing. An image whose release file does not match
    // the host (ID, VERSION_ID, ARCHITECTURE) is skipped and systemd-sysext still exits 0;
    // in systemd 252 one whose release file is missing or named for another extension makes
    // the merge fail (the unit fails), which the agent must treat the same way.
    for (how, refresh_succeeds) in [
        (Incompatibility::WrongId, true),
        (Incompatibility::WrongVersion, true),
        (Incompatibility::WrongArchitecture, true),
        (Incompatibility::WrongReleaseName, false),
        (Incompatibility::MissingRelease, false),
    ] {
        let bad = SysextBuilder::new("kubernetes")
            .file("usr/bin/kubelet-bad", b"#!/bin/sh\n".to_vec(), 0o755)
            .incompatible(how)
            .build(&dir.path().join(format!("bad-{how:?}.raw")))
            .await
            .expect("bad image");
        let stored = format!("/opt/extensions/kubernetes/bad-{how:?}.raw");
        node.copy_from_host(&bad.path, &stored, 0o644)
            .await
            .expect("copy");
        node.symlink(&stored, "/etc/extensions/kubernetes.raw")
            .await
            .expect("link");
        let refresh = node.systemctl(&["restart", "systemd-sysext"]).await;
        let journal = node
            .journal("systemd-sysext.service", 6)
            .await
            .unwrap_or_default();
        eprintln!(
            "{how:?}: refresh ok={}; journal:\n{journal}",
            refresh.is_ok()
        );
        assert_eq!(refresh.is_ok(), refresh_succeeds, "{how:?}: {refresh:?}");
        assert!(
            !node
                .exists("/usr/lib/extension-release.d/extension-release.kubernetes")
                .await
                .expect("exists"),
            "{how:?}: not merged"
        );
        assert!(
            !node.exists("/usr/bin/kubelet-bad").await.expect("exists"),
            "{how:?}: content not merged"
        );
        let status = node
            .exec_ok(&["systemd-sysext", "status"])
            .await
            .expect("status");
        assert!(!status.contains("kubernetes"), "{how:?}: {status}");
        assert!(node.merged_extensions().await.expect("list").is_empty());
    }
    node.poweroff().await.expect("poweroff");
}

/// GETs a URL from inside the node with the fake kubelet's own client until it answers 200.
async fn poll(node: &Node, url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = node
            .exec(&["kubelet", "get", url])
            .await
            .expect("client runs");
        if out.success() {
            return out.stdout_text();
        }
        assert!(Instant::now() < deadline, "{url}: {}", out.stderr_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
