//! The plugin as people install it: packaging/krew/build-plugin.sh (run by
//! `scripts/package.sh`) writes the archive (the plugin and the repository's LICENSE), its
//! SHA256SUMS line, the krew manifest and a Debian package. Krew's own validator
//! (`validate-krew-manifest`, built from krew's Go module in tests/tools/krew) runs every check,
//! its install step included (krew installs the archive from the manifest's uri, here served on
//! loopback instead of the release page, and finds a license among the installed files); krew
//! itself installs the archive, after which `kubectl inplace` runs through kubectl's plugin
//! lookup. The .deb installs `/usr/bin/kubectl-inplace` (into a scratch dpkg root).

#![allow(clippy::unwrap_used)]

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use inplace_tests::artifact_server::{Artifact, ArtifactServer};
use inplace_tests::tools::{bin_dir, run_ok, tool};

/// `PATH` for krew and kubectl's plugin lookup: `first`, the tools, the pinned kubectl.
fn tools_path(first: &Path) -> OsString {
    let kubectl = inplace_tests::apiserver::kubectl().unwrap();
    std::env::join_paths([
        first.to_path_buf(),
        bin_dir(),
        kubectl.parent().unwrap().to_path_buf(),
        "/usr/bin".into(),
        "/bin".into(),
    ])
    .unwrap()
}

/// Krew's validator with its install step, on a copy of `manifest` whose uri points at the
/// archive served from loopback (krew's install downloads the uri).
async fn validate_with_install(manifest: &Path, archive: &Path) {
    let server = ArtifactServer::start().await.unwrap();
    let name = archive.file_name().unwrap().to_str().unwrap();
    server.put(
        &format!("/{name}"),
        Artifact::bytes(std::fs::read(archive).unwrap()),
    );
    let text = std::fs::read_to_string(manifest).unwrap();
    let uri = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("uri: "))
        .unwrap()
        .to_owned();
    assert!(uri.ends_with(&format!("/{name}")), "{uri}");
    let served = tempfile::tempdir().unwrap();
    // The validator takes the plugin's name from the file name.
    let copy = served.path().join("inplace.yaml");
    std::fs::write(&copy, text.replace(&uri, &server.url(&format!("/{name}")))).unwrap();
    let path = tools_path(&bin_dir());
    tokio::task::block_in_place(|| {
        run_ok(
            Command::new(tool("validate-krew-manifest").unwrap())
                .arg("-manifest")
                .arg(&copy)
                .env("PATH", &path),
        )
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_krew_manifest_passes_all_of_krews_checks_and_krew_installs_the_plugin() {
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

    let listed = run_ok(
        Command::new("tar")
            .arg("-tzf")
            .arg(out.path().join(&archive)),
    );
    assert_eq!(listed, "LICENSE\nkubectl-inplace\n");

    let manifest = out.path().join("inplace.yaml");
    validate_with_install(&manifest, &out.path().join(&archive)).await;

    let krew_root = out.path().join("krew");
    let kubectl = inplace_tests::apiserver::kubectl().unwrap();
    let path = tools_path(&krew_root.join("bin"));
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

    installs_from_its_debian_package(out.path(), version);
}

/// The .deb: its fields, and `/usr/bin/kubectl-inplace` installed by dpkg (into a scratch
/// root with an empty package database) running as kubectl's plugin.
fn installs_from_its_debian_package(out: &Path, version: &str) {
    let deb = out.join(format!("kubectl-inplace_{version}_amd64.deb"));
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).unwrap();
    assert!(
        sums.contains(&format!("  kubectl-inplace_{version}_amd64.deb\n")),
        "{sums}"
    );
    let field = |name: &str| {
        run_ok(Command::new("dpkg-deb").arg("--field").arg(&deb).arg(name))
            .trim()
            .to_owned()
    };
    assert_eq!(field("Package"), "kubectl-inplace");
    assert_eq!(field("Version"), version);
    let root = out.join("dpkg-root");
    let admin = root.join("var/lib/dpkg");
    std::fs::create_dir_all(admin.join("info")).unwrap();
    std::fs::create_dir_all(admin.join("updates")).unwrap();
    std::fs::write(admin.join("status"), "").unwrap();
    run_ok(
        Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["--force-not-root", "--force-depends", "--install"])
            .arg(&deb),
    );
    let kubectl = inplace_tests::apiserver::kubectl().unwrap();
    let help = run_ok(
        Command::new(&kubectl)
            .args(["inplace", "--help"])
            .env("PATH", tools_path(&root.join("usr/bin"))),
    );
    assert!(help.contains("status"), "{help}");
    assert!(
        root.join("usr/share/doc/kubectl-inplace/copyright")
            .is_file()
    );
}
