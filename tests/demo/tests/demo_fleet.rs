//! `make demo` proven by `make test`: the demo binary, non-interactive, on 2 real nspawn
//! nodes with the real agent and controller, end to end. The demo itself fails unless every
//! node's plan ends Succeeded on v2 and every kubelet answers v2; this test also checks what
//! it printed. Needs root, systemd-nspawn, debootstrap and squashfs-tools.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_demo_rolls_v2_out_to_every_node() {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");
    let demo = PathBuf::from(env!("CARGO_BIN_EXE_inplace-demo"));
    let bin_dir = demo.parent().unwrap().to_owned();
    let target_dir = bin_dir.parent().unwrap().to_owned();
    // The programs the demo installs and runs: built with the workspace under `make test`,
    // so this is a quick no-op there.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let built = Command::new(cargo)
        .args(["build", "--quiet", "--bins"])
        .args([
            "-p",
            "inplace-agent",
            "-p",
            "inplace-controller",
            "-p",
            "inplace-tests",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(
        built.success(),
        "building the agent, controller and fake kubelet"
    );

    let work = tempfile::tempdir().unwrap();
    let prefix = format!("demot{}", std::process::id());
    let out = Command::new(&demo)
        .args(["--nodes", "2", "--no-wait", "--api-port", "0"])
        .args(["--download-seconds", "2", "--health-window", "3"])
        .args(["--name-prefix", &prefix])
        .arg("--bin-dir")
        .arg(&bin_dir)
        .arg("--work-dir")
        .arg(work.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the demo failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    for want in [
        "every kubelet answers v1.31.0",
        "Summary",
        "export KUBECONFIG=",
        "kubectl inplace status",
        "cleaning up",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in\n{stdout}");
    }
    for n in 1..=2 {
        let node = format!("{prefix}-{n}");
        let summary = stdout.split("\nSummary\n").nth(1).unwrap_or_default();
        let row = summary
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{node} ")))
            .unwrap_or_else(|| panic!("no summary row for {node} in\n{stdout}"));
        assert!(
            row.contains("/opt/extensions/kubernetes/kubernetes-v1.32.0-"),
            "{node} links v2: {row}"
        );
        assert!(
            stdout.contains(&format!("{node}  Succeeded")),
            "{node} shown Succeeded:\n{stdout}"
        );
        assert!(
            !std::path::Path::new("/var/tmp/inplace-testbed/nodes")
                .join(&node)
                .exists(),
            "{node} removed"
        );
    }
    // Not a TTY: progress is logged as lines, no escape sequences.
    assert!(!stdout.contains('\x1b'), "{stdout}");
}
