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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_boot_at_once_and_merge_sysexts_concurrently() {
    let names: Vec<String> = (0..3).map(|_| Node::unique_name("fleet")).collect();
    let boots = names.iter().map(|n| Node::boot(n, NodeOptions::default()));
    let nodes: Vec<Node> = futures_join_all(boots).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let image = inplace_tests::sysext::SysextBuilder::new("hello")
        .file(
            "usr/bin/hello-sysext",
            b"#!/bin/sh\necho hello\n".to_vec(),
            0o755,
        )
        .build(&dir.path().join("hello.raw"))
        .await
        .expect("image");
    for node in &nodes {
        node.copy_from_host(&image.path, "/var/lib/extensions/hello.raw", 0o644)
            .await
            .expect("copy");
    }
    // All three attach a loop device at the same time.
    let refreshes = nodes
        .iter()
        .map(|n| n.systemctl(&["restart", "systemd-sysext"]));
    for result in futures_join_all_results(refreshes).await {
        result.expect("sysext refresh");
    }
    for (node, name) in nodes.iter().zip(&names) {
        assert_eq!(
            node.exec_ok(&["hostname"]).await.expect("hostname").trim(),
            name
        );
        assert_eq!(
            node.exec_ok(&["hello-sysext"])
                .await
                .expect("merged binary"),
            "hello\n"
        );
    }
    for node in nodes {
        node.poweroff().await.expect("poweroff");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_of_killed_test_processes_are_swept() {
    let name = Node::unique_name("orphan");
    let mut owner = tokio::process::Command::new(env!("CARGO_BIN_EXE_inplace-testbed"))
        .args(["boot", &name])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("inplace-testbed boot");
    let mut stdout = owner.stdout.take().expect("stdout");
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("is up") {
        let n = tokio::time::timeout(
            Duration::from_secs(300),
            tokio::io::AsyncReadExt::read(&mut stdout, &mut buf),
        )
        .await
        .expect("node up in time")
        .expect("read");
        assert!(
            n > 0,
            "inplace-testbed boot exited: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    owner.kill().await.expect("SIGKILL the owner");
    let dir = format!("/var/tmp/inplace-testbed/nodes/{name}");
    assert!(
        std::path::Path::new(&dir).exists(),
        "left behind by the killed owner"
    );
    // Another test's boot may sweep it first; either way it must be gone afterwards.
    let swept = inplace_tests::nspawn::sweep_stale_nodes()
        .await
        .expect("sweep");
    eprintln!("swept {swept:?}");
    assert!(!std::path::Path::new(&dir).exists());
    assert!(
        !std::fs::read_to_string("/proc/self/mountinfo")
            .expect("mountinfo")
            .contains(&name)
    );
}

async fn futures_join_all<F, T>(futures: impl IntoIterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = inplace_tests::Result<T>>,
{
    futures_join_all_results(futures)
        .await
        .into_iter()
        .map(|r| r.expect("node boots"))
        .collect()
}

/// Runs futures concurrently on this task (no extra dependency) and keeps their order.
async fn futures_join_all_results<F, T>(futures: impl IntoIterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T>,
{
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut results: Vec<Option<T>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (fut, slot) in pinned.iter_mut().zip(results.iter_mut()) {
            if slot.is_none() {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    results.into_iter().flatten().collect()
}
