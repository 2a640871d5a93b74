//! The agent for arm64 nodes (issue 39): cross-built for aarch64 with Debian's cross linker
//! (.cargo/config.toml), packed by the same builders as the x86-64 packages with
//! `ARCH=arm64`, and run under qemu-user. `make arm64-unit` runs the agent's unit tests the
//! same way, beside the tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// ELF `e_machine` of aarch64.
const EM_AARCH64: u16 = 183;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(command: &mut Command) -> Output {
    let output = command.output().expect("the command runs");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn package(script: &str, binary: &Path, out: &Path) -> PathBuf {
    let output = run(Command::new(repo().join(script))
        .env("ARCH", "arm64")
        .arg(binary)
        .arg(env!("CARGO_PKG_VERSION"))
        .arg(out));
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

fn elf_machine(path: &Path) -> u16 {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        &bytes[..4],
        b"\x7fELF",
        "{} is not an ELF file",
        path.display()
    );
    u16::from_le_bytes([bytes[18], bytes[19]])
}

#[test]
fn the_agent_is_cross_built_packed_and_run_for_arm64() {
    let version = env!("CARGO_PKG_VERSION");
    let agent = inplace_tests::workspace_build::arm64_bin("inplace-agent").unwrap();
    assert_eq!(elf_machine(&agent), EM_AARCH64);
    let out = tempfile::tempdir().unwrap();

    let image = package("packaging/node/build-sysext.sh", &agent, out.path());
    assert_eq!(
        image.file_name().unwrap().to_string_lossy(),
        format!("inplace-agent-{version}-arm64.raw")
    );
    let unpacked = out.path().join("unpacked");
    run(Command::new("unsquashfs")
        .args(["-q", "-no-progress", "-d"])
        .arg(&unpacked)
        .arg(&image));
    let release = std::fs::read_to_string(
        unpacked.join("usr/lib/extension-release.d/extension-release.inplace-agent"),
    )
    .unwrap();
    assert!(
        release.lines().any(|l| l == "ARCHITECTURE=arm64"),
        "{release}"
    );
    let packed = unpacked.join("usr/bin/inplace-agent");
    assert_eq!(elf_machine(&packed), EM_AARCH64);
    // The packed agent runs: qemu-user, as .cargo/config.toml's runner does for the tests.
    let ran = run(Command::new("qemu-aarch64-static")
        .args(["-L", "/usr/aarch64-linux-gnu"])
        .arg(&packed)
        .arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout).trim(),
        format!("inplace-agent {version}")
    );

    let deb = package("packaging/node/build-deb.sh", &agent, out.path());
    assert_eq!(
        deb.file_name().unwrap().to_string_lossy(),
        format!("inplace-agent_{version}_arm64.deb")
    );
    let field = run(Command::new("dpkg-deb")
        .arg("-f")
        .arg(&deb)
        .arg("Architecture"));
    assert_eq!(String::from_utf8_lossy(&field.stdout).trim(), "arm64");

    let sums = std::fs::read_to_string(out.path().join("SHA256SUMS")).unwrap();
    for name in [&image, &deb].map(|p| p.file_name().unwrap().to_string_lossy().into_owned()) {
        assert!(sums.contains(&name), "{name} not in SHA256SUMS: {sums}");
    }
}

#[test]
fn an_architecture_the_builders_do_not_know_is_refused_by_name() {
    let out = tempfile::tempdir().unwrap();
    let refused = Command::new(repo().join("packaging/node/build-sysext.sh"))
        .env("ARCH", "aarch64")
        .arg(repo().join("LICENSE"))
        .arg("0.0.0")
        .arg(out.path())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        "ARCH=aarch64: amd64 or arm64"
    );
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
}

/// `make test` installs each set of tools where it is used: the system packages, the arm64
/// cross tools and clippy (which lints in the test build) in `make deps`, the test runner in
/// `make nextest` (beside the Go builds), cargo-deny in `make lint-tools` and cargo-fuzz and
/// the nightly toolchain in `make fuzz-deps` (in the background).
/// 6e0ecef ran `install-deps.sh --arm64 --fuzz` there, which installed the cross tools and
/// never cargo-fuzz: a new machine's fuzzing would have failed.
#[test]
fn make_installs_the_test_the_arm64_and_the_fuzzing_tools_each_once() {
    let planned = run(Command::new("make")
        .args([
            "-n",
            "--no-print-directory",
            "deps",
            "nextest",
            "lint-tools",
            "fuzz-deps",
        ])
        .current_dir(repo()));
    let installs: Vec<String> = String::from_utf8_lossy(&planned.stdout)
        .lines()
        .filter_map(|line| line.split_once("./scripts/install-deps.sh"))
        .map(|(_, args)| args.trim().to_owned())
        .collect();
    assert_eq!(
        installs,
        [
            "--system",
            "--arm64",
            "--clippy",
            "--nextest",
            "--deny",
            "--fuzz",
        ]
    );
}
