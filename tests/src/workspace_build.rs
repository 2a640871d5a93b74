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

/// The path of the workspace binary `name`, built first (a no-op when current).
pub fn workspace_bin(name: &str) -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let profile_dir = BUILT
        .get_or_init(|| build().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Invalid(e.clone()))?;
    Ok(profile_dir.join(name))
}

/// Builds and returns `<target>/<profile dir>` of the running program.
fn build() -> Result<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Invalid(format!("locating the running program: {e}")))?;
    // <target>/<profile dir>/deps/<test binary>, or <target>/<profile dir>/<binary>
    let mut profile_dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if profile_dir.ends_with("deps") {
        profile_dir.pop();
    }
    let target_dir = profile_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev".to_owned(),
        Some(other) => other.to_owned(),
    };
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    cargo.args(["build", "--quiet", "--workspace", "--bins"]);
    if profile == "dev" {
        cargo.args(["--tests", "--examples"]);
    }
    let status = cargo
        .args(["--profile", &profile])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(repo_root())
        .status()
        .map_err(|e| Error::Invalid(format!("running cargo build: {e}")))?;
    if !status.success() {
        return Err(Error::Invalid(format!(
            "building the workspace's binaries ({profile} profile): cargo build {status}"
        )));
    }
    Ok(profile_dir)
}
