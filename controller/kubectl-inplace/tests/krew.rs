//! The plugin as people install it: packaging/krew/build-plugin.sh (run by
//! `scripts/package.sh`) writes the archive, its SHA256SUMS line and the krew manifest;
//! krew's own validator (`validate-krew-manifest`, built from krew's Go module in
//! tests/tools/krew) accepts the manifest, and krew itself installs the archive with it, after
//! which `kubectl inplace` runs through kubectl's plugin lookup.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use inplace_tests::tools::{bin_dir, run_ok, tool};

#[test]
fn the_krew_manifest_passes_krews_checks_and_krew_installs_the_plugin() {
    let version = env!("CARGO_PKG_VERSION");
    let out = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/krew/build-plugin.sh");
    run_ok(
        Command::new(script)
            .arg(env!("CARGO_BIN_EXE_kubectl-inplace"))
            .arg(version)
            .arg(out.path()),
    );
    let archive = format!("kubectl-inplace-v{version}-linux-amd64.tar.gz");
    let sums = std::fs::read_to_string(out.path().join("SHA256SUMS")).unwrap();
    assert!(sums.contains(&format!("  {archive}\n")), "{sums}");
    run_ok(
        Command::new("sha256sum")
            .arg("-c")
            .arg("SHA256SUMS")
            .current_dir(out.path()),
    );

    // Krew's structural checks (its install step fetches the uri; krew installs below).
    let manifest = out.path().join("inplace.yaml");
    run_ok(
        Command::new(tool("validate-krew-manifest").unwrap())
            .arg("-manifest")
            .arg(&manifest)
            .arg("-skip-install"),
    );

    let krew_root = out.path().join("krew");
    let kubectl = inplace_tests::apiserver::kubectl().unwrap();
    let path = std::env::join_paths([
        krew_root.join("bin"),
        bin_dir(),
        kubectl.parent().unwrap().to_path_buf(),
        "/usr/bin".into(),
        "/bin".into(),
    ])
    .unwrap();
    run_ok(
        Command::new(&kubectl)
            .args(["krew", "install", "--manifest"])
            .arg(&manifest)
            .arg("--archive")
            .arg(out.path().join(&archive))
            .env("KREW_ROOT", &krew_root)
            .env("PATH", &path),
    );
    let listed = run_ok(
        Command::new(&kubectl)
            .args(["plugin", "list", "--name-only"])
            .env("PATH", &path),
    );
    assert!(listed.lines().any(|l| l == "kubectl-inplace"), "{listed}");
    let help = run_ok(
        Command::new(&kubectl)
            .args(["inplace", "--help"])
            .env("PATH", &path),
    );
    assert!(help.contains("status"), "{help}");
}
