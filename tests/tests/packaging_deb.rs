//! The agent's Debian package (packaging/node/build-deb.sh, the same builder
//! `scripts/package.sh` runs) installed with docs/usage/deb.md's commands as written on a booted systemd 252 Debian node:
//! files in place, the config a conffile, the unit enabled and started by postinst, the
//! agent active (Type=notify READY) and reporting on its plan against the real
//! kube-apiserver with its node's kubelet identity and the shipped RBAC only,
//! its metrics readable with `inplace-agent metrics` and its STATUS= line set;
//! `dpkg -r` stops, disables and removes it but keeps the conffile, `dpkg --purge` drops
//! that too. Needs root, systemd-nspawn and debootstrap; a missing prerequisite fails with
//! an install hint.

use crate::support;

use inplace_tests::nspawn::{Node, NodeOptions};
use kube::api::PostParams;

use support::packaging::{
    PATIENCE, api_for_agents, build, refused_plan, repo, wait_reported, write_kubelet_identity,
};

/// A ```sh block of docs/usage/deb.md, by the heading it follows.
fn page_block(heading: &str) -> String {
    inplace_tests::docs::shell_block(&repo().join("docs/usage/deb.md"), heading).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_deb_installs_starts_reports_and_removes_cleanly_on_a_real_node() {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_tools(&["dpkg-deb"]).expect("prerequisites");

    let out = tempfile::tempdir().unwrap();
    let deb = build("packaging/node/build-deb.sh", out.path());
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        deb.file_name().unwrap().to_str().unwrap(),
        format!("inplace-agent_{version}_amd64.deb")
    );
    let sums = std::fs::read_to_string(out.path().join("SHA256SUMS")).unwrap();
    assert!(
        sums.contains(&format!("inplace-agent_{version}_amd64.deb")),
        "{sums}"
    );

    let (test_api, api) = api_for_agents().await;

    let name = Node::unique_name("pkgdeb");
    let node = Node::boot(&name, NodeOptions::default())
        .await
        .expect("node boots");

    // The identity comes first on a real node too (the kubelet's kubeconfig): postinst
    // starts the agent right away on a booted system.
    write_kubelet_identity(&node, &test_api).await;
    let deb_in_node = format!("/root/inplace-agent_{version}_amd64.deb");
    node.copy_from_host(&deb, &deb_in_node, 0o644)
        .await
        .unwrap();
    // docs/usage/deb.md's install, as written, where the package was copied.
    let install = page_block("## Installing on a running node");
    let installed = node.sh(&format!("cd /root && {install}")).await.unwrap();
    assert!(
        installed.success(),
        "{install}: {}\n{}",
        installed.stdout_text(),
        installed.stderr_text()
    );
    let status = node
        .exec_ok(&[
            "dpkg-query",
            "-W",
            "-f",
            "${Status} ${Version}",
            "inplace-agent",
        ])
        .await
        .unwrap();
    assert_eq!(status.trim(), format!("install ok installed {version}"));
    for path in [
        "/usr/bin/inplace-agent",
        "/lib/systemd/system/inplace-agent.service",
        "/usr/lib/tmpfiles.d/inplace-agent.conf",
        "/etc/inplace/agent.toml",
        "/opt/extensions",
        "/var/lib/inplace",
    ] {
        assert!(node.exists(path).await.unwrap(), "{path} after dpkg -i");
    }
    let conffiles = node
        .exec_ok(&["dpkg-query", "-W", "-f", "${Conffiles}", "inplace-agent"])
        .await
        .unwrap();
    assert!(conffiles.contains("/etc/inplace/agent.toml"), "{conffiles}");
    node.wait_active("inplace-agent.service", PATIENCE)
        .await
        .expect("postinst starts the agent (Type=notify: READY sent)");
    assert_eq!(
        node.systemctl(&["is-enabled", "inplace-agent.service"])
            .await
            .unwrap()
            .trim(),
        "enabled"
    );

    let verify = page_block("## Verifying");
    let verified = node.sh(&format!("set -e\n{verify}")).await.unwrap();
    assert!(
        verified.success()
            && verified
                .stdout_text()
                .contains("Status: install ok installed"),
        "{verify}: {}\n{}",
        verified.stdout_text(),
        verified.stderr_text()
    );

    let plan = refused_plan(&name);
    let revision = inplace_proto::revision_of(&plan.spec.content);
    api.create(&PostParams::default(), &plan).await.unwrap();
    wait_reported(&api, &node, &revision).await;

    // Observability on the node, as the unit's hardening allows it: the metrics socket
    // under /run (mode 0660), read with the agent's own client, and the STATUS= line
    // `systemctl status` shows.
    let metrics = node.exec_ok(&["inplace-agent", "metrics"]).await.unwrap();
    assert!(
        metrics.contains("inplace_agent_failures_total{reason=\"PolicyDenied\"} 1\n")
            && metrics.contains("inplace_agent_phase{phase=\"Failed\"} 1\n"),
        "{metrics}"
    );
    let socket = node
        .exec_ok(&["stat", "-c", "%a %F", "/run/inplace/metrics.sock"])
        .await
        .unwrap();
    assert_eq!(socket.trim(), "660 socket");
    let status_text = node
        .exec_ok(&[
            "systemctl",
            "show",
            "--property=StatusText",
            "--value",
            "inplace-agent.service",
        ])
        .await
        .unwrap();
    assert!(
        status_text.starts_with("Failed: ") && status_text.contains("not-allowed.invalid"),
        "{status_text}"
    );

    // Upgrading in place (same package again) restarts only the agent.
    let again = node.sh(&format!("cd /root && {install}")).await.unwrap();
    assert!(again.success(), "{}", again.stderr_text());
    node.wait_active("inplace-agent.service", PATIENCE)
        .await
        .expect("the agent runs again after an upgrade");

    // The page's removal, one command at a time: `dpkg -r` (stopped, disabled, files gone,
    // the conffile kept), then `dpkg --purge`.
    let removal = page_block("## Upgrading and removing");
    let [remove, purge] = removal.lines().collect::<Vec<_>>()[..] else {
        panic!("deb.md's removal is two commands: {removal}");
    };
    let removed = node.sh(remove).await.unwrap();
    assert!(removed.success(), "dpkg -r: {}", removed.stderr_text());
    assert!(!node.is_active("inplace-agent.service").await.unwrap());
    assert!(!node.exists("/usr/bin/inplace-agent").await.unwrap());
    assert!(
        !node
            .exists("/lib/systemd/system/inplace-agent.service")
            .await
            .unwrap()
    );
    assert!(
        !node
            .exists("/etc/systemd/system/multi-user.target.wants/inplace-agent.service")
            .await
            .unwrap()
    );
    assert!(node.exists("/etc/inplace/agent.toml").await.unwrap());
    let purged = node.sh(purge).await.unwrap();
    assert!(purged.success(), "dpkg --purge: {}", purged.stderr_text());
    assert!(!node.exists("/etc/inplace/agent.toml").await.unwrap());
    assert!(!node.exists("/var/lib/inplace").await.unwrap());
    node.poweroff().await.unwrap();
}

/// `scripts/package.sh` writes where cargo writes: under `CARGO_TARGET_DIR` when it is set
/// (it wrote to the repository's `target/packages` regardless).
#[test]
fn the_package_script_writes_under_cargo_target_dir() {
    inplace_tests::prereq::require_tools(&["dpkg-deb", "mksquashfs"]).expect("prerequisites");
    let dir = tempfile::tempdir().unwrap();
    let binary = dir.path().join("inplace-agent");
    std::fs::copy("/bin/true", &binary).unwrap();
    let target = dir.path().join("target");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/package.sh");
    // The plugin too: without it the script builds kubectl-inplace cold in this fresh
    // target directory (a node-profile build, longer than the test's limit on a loaded machine).
    let status = std::process::Command::new(script)
        .arg(&binary)
        .arg(&binary)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("PACKAGES_DIR")
        .status()
        .unwrap();
    assert!(status.success());
    let version = env!("CARGO_PKG_VERSION");
    for name in [
        "SHA256SUMS".to_owned(),
        format!("inplace-agent_{version}_amd64.deb"),
        format!("inplace-agent-{version}-x86-64.raw"),
        format!("kubectl-inplace-v{version}-linux-amd64.tar.gz"),
        format!("kubectl-inplace_{version}_amd64.deb"),
        "inplace.yaml".to_owned(),
    ] {
        let path = target.join("packages").join(&name);
        assert!(path.is_file(), "{} was not written", path.display());
    }
}
