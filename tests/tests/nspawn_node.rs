//! The real-systemd test bed itself: boot a Debian node with systemd-nspawn, run commands,
//! move files, reboot, clean up. Needs root, systemd-nspawn and debootstrap (the first run
//! builds the cached root filesystem); missing prerequisites fail with an install hint.

use std::time::{Duration, Instant};

use inplace_tests::nspawn::{Node, NodeFile, NodeOptions, ServiceInstall};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_boots_runs_commands_moves_files_and_cleans_up() {
    let name = Node::unique_name("smoke");
    let started = Instant::now();
    let node = Node::boot(&name, NodeOptions::default())
        .await
        .expect("node boots");
    eprintln!("boot took {:.1} s", started.elapsed().as_secs_f64());

    let state = node
        .exec_ok(&["systemctl", "is-system-running"])
        .await
        .expect("systemctl runs");
    assert!(
        matches!(state.trim(), "running" | "degraded"),
        "state {state}"
    );
    assert_eq!(
        node.exec_ok(&["hostname"]).await.expect("hostname").trim(),
        name
    );
    assert!(
        node.exec_ok(&["busctl", "--system", "list", "--no-legend"])
            .await
            .expect("D-Bus system bus answers")
            .contains("org.freedesktop.systemd1")
    );
    let out = node.sh("echo out; echo err >&2; exit 3").await.expect("sh");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout_text(), "out\n");
    assert_eq!(out.stderr_text(), "err\n");

    let payload: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    node.write_file("/var/lib/testbed/blob", &payload, 0o600)
        .await
        .expect("write");
    assert_eq!(
        node.read_file("/var/lib/testbed/blob").await.expect("read"),
        payload
    );
    assert_eq!(
        node.exec_ok(&["stat", "-c", "%a", "/var/lib/testbed/blob"])
            .await
            .expect("stat")
            .trim(),
        "600"
    );
    // /run is a tmpfs inside the node: reachable through path_on_host, not root_dir.
    node.write_file("/run/testbed-marker", b"hi", 0o644)
        .await
        .expect("write to /run");
    assert_eq!(
        std::fs::read(node.path_on_host("/run/testbed-marker")).expect("host view"),
        b"hi"
    );
    assert!(node.exists("/var/lib/testbed/blob").await.expect("exists"));
    assert!(!node.exists("/nope").await.expect("exists"));

    // Host binaries run inside (same Debian glibc).
    node.copy_from_host(
        env!("CARGO_BIN_EXE_fake-kubelet"),
        "/usr/local/bin/fk",
        0o755,
    )
    .await
    .expect("copy binary");
    let svc = ServiceInstall::new(
        "fk.service",
        "[Service]\nExecStart=/usr/local/bin/fk --config /etc/fk.conf\n[Install]\nWantedBy=multi-user.target\n",
    )
    .file(NodeFile::new(
        "/etc/fk.conf",
        b"version=v9.9.9\nport=18080\n".to_vec(),
        0o644,
    ));
    node.install_service(&svc).await.expect("install service");
    node.wait_active("fk.service", Duration::from_secs(60))
        .await
        .expect("service active");
    let body = poll_get(&node, "http://127.0.0.1:18080/version").await;
    assert!(body.contains("v9.9.9"), "{body}");

    let cgroup_probe = format!("/var/tmp/inplace-testbed/nodes/{name}");
    assert!(std::path::Path::new(&cgroup_probe).exists());
    node.poweroff().await.expect("poweroff");
    assert!(
        !std::path::Path::new(&cgroup_probe).exists(),
        "node directory removed"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(&name), "no mounts left: {mounts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_node_is_cleaned_up_and_reboot_keeps_state() {
    let name = Node::unique_name("reboot");
    let mut opts = NodeOptions::default();
    ServiceInstall::new(
        "marker.service",
        "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sh -c 'echo booted >> /var/lib/marker'\n[Install]\nWantedBy=multi-user.target\n",
    )
    .into_boot_options(&mut opts);
    let mut node = Node::boot(&name, opts).await.expect("node boots");
    assert_eq!(
        node.read_file("/var/lib/marker").await.expect("marker"),
        b"booted\n",
        "service enabled in the image ran at boot"
    );
    let took = node.reboot_and_wait().await.expect("reboot");
    eprintln!("reboot took {:.1} s", took.as_secs_f64());
    assert_eq!(
        node.read_file("/var/lib/marker").await.expect("marker"),
        b"booted\nbooted\n",
        "writable layer survives a reboot"
    );
    let dir = format!("/var/tmp/inplace-testbed/nodes/{name}");
    let pid1 = node.pid1();
    drop(node);
    assert!(!std::path::Path::new(&dir).exists(), "Drop removed {dir}");
    // Gone, or a zombie waiting for the host's init to reap it.
    let state = std::fs::read_to_string(format!("/proc/{pid1}/status")).unwrap_or_default();
    assert!(
        state.is_empty() || state.contains("State:\tZ"),
        "Drop killed the node's systemd: {state}"
    );
}

/// GETs a URL from inside the node until it answers 200 (services take a moment to listen).
async fn poll_get(node: &Node, url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = node
            .exec(&["curl", "-fsS", "--max-time", "5", url])
            .await
            .expect("curl runs");
        if out.success() {
            return out.stdout_text();
        }
        assert!(Instant::now() < deadline, "{url}: {}", out.stderr_text());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
