//! The workspace's own programs (the agent, the controller, the bed's `fake-kubelet` and
//! `inplace-testbed`) for the suites and the bed's tools to run: one cargo build per process,
//! into the running program's target directory and profile.
//!
//! In the dev profile it is the build `make test` makes before the suites
//! (`cargo nextest run --workspace --no-run`): every package's binaries, tests and examples,
//! so that cargo resolves the same features and finds everything current. A build of fewer
//! packages (`-p inplace-agent`, `-p inplace-tests`) resolves other features for the kube
//! stack, hyper-util and jiff: it compiled them (k8s-openapi included) once more per package
//! set, and replaced the `inplace-agent` other suites were running with that build. In any
//! other profile (the benchmark's `node`) only the binaries are built.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::apiserver::repo_root;
use crate::{Error, Result};

/// cargo, run as `make` runs it: without the variables cargo, nextest and make set for the
/// running test ([`set_by_the_test_runner`]). cargo compares the variables a build script
/// names in `rerun-if-env-changed` with its own environment, and ring's build script names
/// `CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME`: inside a test they are the test's package, so
/// a test's cargo found ring dirty where `make` had built it, and rebuilt it and everything
/// over it (rustls, kube, the workspace), then again for the next package's tests.
pub fn cargo() -> Command {
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    without_the_test_runners_env(&mut cargo);
    cargo
}

/// `command` without the variables [`set_by_the_test_runner`] for this process.
pub fn without_the_test_runners_env(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if set_by_the_test_runner(&name.to_string_lossy()) {
            command.env_remove(&name);
        }
    }
    command
}

/// Whether cargo, nextest or make set the environment variable `name` for the running test,
/// rather than the person or CI that started `make test`: the running package's `CARGO_*`
/// (cargo's environment for the crates it runs), nextest's, the library path both extend, and
/// make's jobserver.
pub fn set_by_the_test_runner(name: &str) -> bool {
    const SET: [&str; 13] = [
        "CARGO",
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_CRATE_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "RUST_RECURSION_COUNT",
        "LD_LIBRARY_PATH",
        "MAKEFLAGS",
        "MAKELEVEL",
        "MFLAGS",
    ];
    SET.contains(&name)
        || ["CARGO_PKG_", "CARGO_BIN_", "NEXTEST"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
}

/// The path of the workspace binary `name`, built first (a no-op when current).
pub fn workspace_bin(name: &str) -> Result<PathBuf> {
    static BUILT: Built = OnceLock::new();
    Ok(built_once(&BUILT, build)?.join(name))
}

/// A build's output directory, or why it failed, kept for the rest of the process.
type Built = OnceLock<std::result::Result<PathBuf, String>>;

/// The directory `build` made, built on the first call only: every later call (and every
/// test of the binary) gets the first call's answer.
fn built_once(cell: &'static Built, build: fn() -> Result<PathBuf>) -> Result<&'static PathBuf> {
    cell.get_or_init(|| build().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Invalid(e.clone()))
}

/// The target triple of arm64 nodes' builds (.cargo/config.toml: linker and qemu runner).
pub const ARM64_TARGET: &str = "aarch64-unknown-linux-gnu";

/// The packages whose programs ship for arm64: the agent, the controller, the kubectl plugin.
/// `make arm64-bins` builds the same set (features resolve over it: one build serves all).
pub const ARM64_PACKAGES: [&str; 3] = ["inplace-agent", "inplace-controller", "kubectl-inplace"];

/// The debug build for aarch64 of the binary `name` (of [`ARM64_PACKAGES`]), built first
/// with the others in `<target>/arm64`: a target directory of its own, so that the cross
/// build never waits for the tests' lock, and `make arm64-unit`'s dependencies are reused.
pub fn arm64_bin(name: &str) -> Result<PathBuf> {
    static BUILT: Built = OnceLock::new();
    Ok(built_once(&BUILT, build_arm64)?.join(name))
}

fn build_arm64() -> Result<PathBuf> {
    let target_dir = running_profile_dir()?
        .parent()
        .map(|t| t.join("arm64"))
        .unwrap_or_default();
    let mut cargo = cargo();
    cargo.args([
        "build",
        "--quiet",
        "--locked",
        "--target",
        ARM64_TARGET,
        "--bins",
    ]);
    for package in ARM64_PACKAGES {
        cargo.args(["-p", package]);
    }
    let what = format!("{} for {ARM64_TARGET}", ARM64_PACKAGES.join(", "));
    run_cargo_build(cargo, &target_dir, &what)?;
    Ok(target_dir.join(ARM64_TARGET).join("debug"))
}

/// `<target>/<profile dir>` of the running program.
fn running_profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Invalid(format!("locating the running program: {e}")))?;
    // <target>/<profile dir>/deps/<test binary>, or <target>/<profile dir>/<binary>
    let mut profile_dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if profile_dir.ends_with("deps") {
        profile_dir.pop();
    }
    Ok(profile_dir)
}

/// Set (to anything) by `make suites`: the `cargo nextest run` it runs has just built this
/// module's dev build (every package with a program has integration tests, so `cargo test`
/// builds its programs too), and a run of the suites changes no source. Each test process
/// then skips its own `cargo build`, which only found everything current: 0.3 CPU-seconds
/// each, in each of the hundreds of test processes that start a workspace program.
const DEV_BUILD_CURRENT: &str = "INPLACE_DEV_BUILD_CURRENT";

/// Builds and returns `<target>/<profile dir>` of the running program.
fn build() -> Result<PathBuf> {
    let profile_dir = running_profile_dir()?;
    let target_dir = profile_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    if profile == "dev" && std::env::var_os(DEV_BUILD_CURRENT).is_some() {
        return Ok(profile_dir);
    }
    let mut cargo = cargo();
    cargo.args(["build", "--quiet", "--workspace", "--bins"]);
    if profile == "dev" {
        cargo.args(["--tests", "--examples"]);
    }
    cargo.args(["--profile", &profile]);
    let what = format!("the workspace's binaries ({profile} profile)");
    run_cargo_build(cargo, &target_dir, &what)?;
    Ok(profile_dir)
}

/// Runs `cargo` (a `cargo build` command) into `target_dir` from the repository root;
/// `what` names what it builds in the error.
fn run_cargo_build(mut cargo: Command, target_dir: &Path, what: &str) -> Result<()> {
    let status = cargo
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(repo_root())
        .status()
        .map_err(|e| Error::Invalid(format!("running cargo build: {e}")))?;
    if !status.success() {
        return Err(Error::Invalid(format!(
            "building {what}: cargo build {status}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate whose build script asks to be rerun when `CARGO_MANIFEST_DIR` or
    /// `CARGO_PKG_NAME` change, as ring's does, built first as `make` builds it (a person's
    /// shell): the build [`cargo`] runs from inside this test must find all of it fresh. With
    /// the test's own environment, cargo saw this package's values where the first build had
    /// none and ran the build script and compiled the crate again.
    #[test]
    fn cargo_inside_a_test_finds_what_make_built_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("src")).unwrap();
        std::fs::write(
            root.join("Cargo.toml"),
            "[package]\nname = \"witness\"\nversion = \"0.1.0\"\nedition = \"2021\"\n[workspace]\n",
        )
        .unwrap();
        std::fs::write(
            root.join("build.rs"),
            "fn main() {\n    println!(\"cargo:rerun-if-env-changed=CARGO_MANIFEST_DIR\");\n    \
             println!(\"cargo:rerun-if-env-changed=CARGO_PKG_NAME\");\n}\n",
        )
        .unwrap();
        std::fs::write(root.join("src/lib.rs"), "").unwrap();
        let build = "cargo build --offline --quiet --target-dir target\n";
        crate::docs::run_as_a_person(build, root, &[]).unwrap();

        let built = build_units(root);
        assert!(!built.is_empty());
        for message in &built {
            assert_ne!(message["fresh"], false, "built again: {message}");
        }
    }

    /// What [`cargo`] says it built (or found fresh) in a `cargo build` of the crate at `root`
    /// into `root/target`: its compiled units and its build scripts' runs.
    fn build_units(root: &Path) -> Vec<serde_json::Value> {
        let output = cargo()
            .args([
                "build",
                "--offline",
                "--message-format=json",
                "--target-dir",
            ])
            .arg(root.join("target"))
            .current_dir(root)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| {
                m["reason"] == "compiler-artifact" || m["reason"] == "build-script-executed"
            })
            .collect()
    }

    /// `make test` carries the compiled dependencies from one clone's target directory to
    /// the next one's (scripts/cargo-seed.py, CARGO_SEED in the Makefile): a crate built in
    /// one clone (psm: a build script whose output names its `OUT_DIR`, as ring's does) is
    /// fresh in a clone at another path, the first one's target directory gone; the clone's
    /// own crate is compiled.
    #[test]
    fn a_clone_elsewhere_finds_the_dependencies_a_run_kept_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("first");
        std::fs::create_dir_all(first.join("src")).unwrap();
        std::fs::write(
            first.join("Cargo.toml"),
            "[package]\nname = \"witness\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\
             [dependencies]\npsm = \"=0.1.32\"\n[workspace]\n",
        )
        .unwrap();
        std::fs::write(first.join("src/lib.rs"), "pub use psm::on_stack;\n").unwrap();
        std::fs::copy(repo_root().join("Cargo.lock"), first.join("Cargo.lock")).unwrap();
        // The second clone is made after the first one's build, as a fresh clone is.
        let keep_and_move = "cd first\ncargo build --offline --quiet --target-dir target\ncd ..\n\
            mkdir second\ncp -r first/Cargo.toml first/Cargo.lock first/src second/\n\
            \"$INPLACE/scripts/cargo-seed.py\" save deps first/target\nrm -r first/target\n\
            \"$INPLACE/scripts/cargo-seed.py\" restore deps second/target\n";
        let seeds = dir.path().join("seeds");
        crate::docs::run_as_a_person(
            keep_and_move,
            dir.path(),
            &[("CARGO_SEED_DIR", seeds.as_os_str())],
        )
        .unwrap();

        let messages = build_units(&dir.path().join("second"));
        let units: Vec<(&str, bool)> = messages
            .iter()
            .filter(|m| m["reason"] == "compiler-artifact")
            .map(|m| {
                (
                    m["target"]["name"].as_str().unwrap_or_default(),
                    m["fresh"] == true,
                )
            })
            .collect();
        assert!(units.iter().any(|(unit, _)| *unit == "psm"), "{units:?}");
        for (unit, fresh) in &units {
            assert_eq!(*fresh, *unit != "witness", "{unit} fresh: {units:?}");
        }
    }

    /// A seed keeps the dependencies' units of the compiler that built the repository's own
    /// packages in that target directory, and none of an earlier compiler's: a restored seed
    /// is saved again whole, and each toolchain's 3 GB would otherwise be carried for good.
    #[test]
    fn a_seed_drops_the_units_of_an_earlier_compiler() {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("target/debug");
        let units = [
            ("inplace-proto", "0000000000000001", 7),
            ("serde", "000000000000000a", 7),
            ("serde", "000000000000000b", 6),
        ];
        for (package, unit, compiler) in units {
            let fingerprint = profile.join(format!(".fingerprint/{package}-{unit}"));
            std::fs::create_dir_all(&fingerprint).unwrap();
            std::fs::write(
                fingerprint.join("lib.json"),
                format!("{{\"rustc\":{compiler}}}"),
            )
            .unwrap();
            std::fs::create_dir_all(profile.join("deps")).unwrap();
            std::fs::write(profile.join(format!("deps/lib{package}-{unit}.rlib")), "").unwrap();
        }
        let seeds = dir.path().join("seeds");
        crate::docs::run_as_a_person(
            "\"$INPLACE/scripts/cargo-seed.py\" save deps target\n",
            dir.path(),
            &[("CARGO_SEED_DIR", seeds.as_os_str())],
        )
        .unwrap();
        let mut kept: Vec<_> = std::fs::read_dir(seeds.join("deps/debug/deps"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        kept.sort();
        assert_eq!(kept, ["libserde-000000000000000a.rlib"]);
    }

    /// `make suites` (what `make test` runs) runs on the build clippy linted: the test
    /// binaries were compiled by clippy-driver with `-D warnings`, so `make test` needs no
    /// clippy check of its own (the Makefile's LINTED_BUILDS). Outside `make`, nothing to see.
    #[test]
    fn make_suites_runs_on_a_build_clippy_linted() {
        if std::env::var_os(DEV_BUILD_CURRENT).is_none() {
            return;
        }
        let wrapper = std::env::var("RUSTC_WORKSPACE_WRAPPER").unwrap_or_default();
        assert!(wrapper.ends_with("/clippy-driver"), "{wrapper:?}");
        let args = std::env::var("CLIPPY_ARGS").unwrap_or_default();
        assert!(args.contains("-D__CLIPPY_HACKERY__warnings"), "{args:?}");
    }

    #[test]
    fn the_runner_s_variables_are_told_from_a_person_s() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_BIN_EXE_x",
            "NEXTEST_RUN_ID",
        ] {
            assert!(set_by_the_test_runner(name), "{name}");
        }
        for name in [
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "PATH",
            "HOME",
        ] {
            assert!(!set_by_the_test_runner(name), "{name}");
        }
    }
}
