//! The plugin as people install it: packaging/krew/build-plugin.sh (run by
//! `scripts/package.sh`) writes the archive (the plugin and the repository's LICENSE), its
//! SHA256SUMS line, the krew manifest and a Debian package; run for amd64 and for arm64 (the
//! plugin cross-built for aarch64) into one directory, the manifest names both archives.
//! Krew's own validator (`validate-krew-manifest`, built from krew's Go module in
//! tests/tools/krew) runs every check, its install step included (krew installs each
//! platform's archive from its uri, here served on loopback instead of the release page, and
//! finds a license among the installed files); krew itself installs the archive, after
//! which `kubectl inplace` runs through kubectl's plugin lookup, and the arm64 archive's
//! plugin runs under qemu-user. The .deb installs `/usr/bin/kubectl-inplace` (into a scratch
//! dpkg root).

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use inplace_tests::artifact_server::{Artifact, ArtifactServer};
use inplace_tests::tools::{bin_dir, run_ok, tool};
use inplace_tests::workspace_build::arm64_bin;

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

/// Krew's validator with its install step, on a copy of `manifest` whose uris point at the
/// archives (in `dir`) served from loopback (krew's install downloads each platform's uri).
async fn validate_with_install(manifest: &Path, dir: &Path) {
    let server = ArtifactServer::start().await.unwrap();
    let mut text = std::fs::read_to_string(manifest).unwrap();
    let uris: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("uri: "))
        .map(str::to_owned)
        .collect();
    for uri in &uris {
        let name = uri.rsplit('/').next().unwrap();
        server.put(
            &format!("/{name}"),
            Artifact::bytes(std::fs::read(dir.join(name)).unwrap()),
        );
        text = text.replace(uri, &server.url(&format!("/{name}")));
    }
    let served = tempfile::tempdir().unwrap();
    // The validator takes the plugin's name from the file name.
    let copy = served.path().join("inplace.yaml");
    std::fs::write(&copy, text).unwrap();
    let path = tools_path(&bin_dir());
    let validated = tokio::task::block_in_place(|| {
        Command::new(tool("validate-krew-manifest").unwrap())
            .arg("-manifest")
            .arg(&copy)
            .env("PATH", &path)
            .output()
            .unwrap()
    });
    let log = String::from_utf8_lossy(&validated.stderr);
    assert!(validated.status.success(), "{log}");
    assert!(
        log.contains(&format!("all {} spec.platforms installed fine", uris.len())),
        "{log}"
    );
}

/// The manifest's platforms: (`arch` of the selector, archive file name, sha256).
fn platforms(manifest: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let value = |line: &str, key: &str| {
        line.trim()
            .strip_prefix(key)
            .map(|v| v.trim_matches('"').to_owned())
    };
    let mut found = Vec::new();
    let mut arch = String::new();
    let mut file = String::new();
    for line in text.lines() {
        if let Some(a) = value(line, "arch: ") {
            arch = a;
        } else if let Some(uri) = value(line, "uri: ") {
            file = uri.rsplit('/').next().unwrap().to_owned();
        } else if let Some(sha) = value(line, "sha256: ") {
            found.push((arch.clone(), file.clone(), sha));
        }
    }
    found
}

fn sha256_of(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path));
    out.split_whitespace().next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_krew_manifest_passes_all_of_krews_checks_and_krew_installs_the_plugin() {
    let version = env!("CARGO_PKG_VERSION");
    let out = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/krew/build-plugin.sh");
    let arm64_plugin = tokio::task::block_in_place(|| arm64_bin("kubectl-inplace")).unwrap();
    for (arch, plugin) in [
        ("arm64", arm64_plugin.as_path()),
        ("amd64", Path::new(env!("CARGO_BIN_EXE_kubectl-inplace"))),
    ] {
        run_ok(
            Command::new(&script)
                .env("ARCH", arch)
                .arg(plugin)
                .arg(version)
                .arg(out.path()),
        );
    }
    let archive = format!("kubectl-inplace-v{version}-linux-amd64.tar.gz");
    let arm64_archive = format!("kubectl-inplace-v{version}-linux-arm64.tar.gz");
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
    let sha = |name: &str| sha256_of(&out.path().join(name));
    assert_eq!(
        platforms(&manifest),
        [
            ("amd64".into(), archive.clone(), sha(&archive)),
            ("arm64".into(), arm64_archive.clone(), sha(&arm64_archive)),
        ],
        "one platform per archive built, in the same order whichever was built last"
    );
    validate_with_install(&manifest, out.path()).await;
    arm64_archive_runs_under_qemu(&out.path().join(&arm64_archive));

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

/// The arm64 archive's plugin is an aarch64 program that runs (qemu-user, as
/// .cargo/config.toml's runner runs the aarch64 builds).
fn arm64_archive_runs_under_qemu(archive: &Path) {
    let unpacked = tempfile::tempdir().unwrap();
    run_ok(
        Command::new("tar")
            .arg("-xzf")
            .arg(archive)
            .arg("-C")
            .arg(unpacked.path()),
    );
    let help = run_ok(
        Command::new("qemu-aarch64-static")
            .args(["-L", "/usr/aarch64-linux-gnu"])
            .arg(unpacked.path().join("kubectl-inplace"))
            .arg("--help"),
    );
    assert!(help.contains("status"), "{help}");
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
