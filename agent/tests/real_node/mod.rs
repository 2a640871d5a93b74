//! Installing the agent on a real nspawn node the way a package would: the binary, the
//! shipped unit and tmpfiles, a config allowing the test's artifact server, the kubelet's
//! kubeconfig (pointing at the emulator) and a kubelet unit stand-in whose binary comes from
//! the kubernetes sysext. Shared by the suites that run the real agent on a node.

use std::path::Path;

use inplace_tests::nspawn::Node;

/// Writes everything the agent needs onto `node`; the caller starts the unit.
pub async fn install_agent(node: &Node, kubeconfig_yaml: &str, artifact_prefix: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let copies = [
        (
            Path::new(env!("CARGO_BIN_EXE_inplace-agent")).to_path_buf(),
            "/usr/bin/inplace-agent",
            0o755,
        ),
        (
            root.join("systemd/inplace-agent.service"),
            "/etc/systemd/system/inplace-agent.service",
            0o644,
        ),
        (
            root.join("systemd/inplace-agent.tmpfiles.conf"),
            "/usr/lib/tmpfiles.d/inplace-agent.conf",
            0o644,
        ),
    ];
    for (from, to, mode) in copies {
        node.copy_from_host(from, to, mode).await.unwrap();
    }
    let config = format!(
        "[policy]\nallowed_url_prefixes = [\"{artifact_prefix}\"]\nallow_http = true\n\
         [activation]\nhealth_interval = \"200ms\"\n"
    );
    node.write_file("/etc/inplace/agent.toml", config.as_bytes(), 0o644)
        .await
        .unwrap();
    node.write_file(
        "/etc/kubernetes/kubelet.conf",
        kubeconfig_yaml.as_bytes(),
        0o600,
    )
    .await
    .unwrap();
    node.write_file(
        "/etc/systemd/system/kubelet.service",
        b"[Unit]\nDescription=kubelet stand-in from the kubernetes sysext\n[Service]\nExecStart=/usr/bin/kubelet-sim\nRestart=no\n",
        0o644,
    )
    .await
    .unwrap();
}
