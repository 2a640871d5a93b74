//! The packaging tools the suites run, built from the Go modules pinned in `tests/tools`
//! (`crane`, `helm`, `oci-image`, `validate-krew-manifest`) by `tests/tools/build.sh`, cached
//! under `target/tools/bin` (`make tools` builds them before the suites), and what `make images`
//! writes: the controller image under `target/images`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};

use crate::apiserver::{is_newer_than_sources, repo_root, target_dir};

/// Where `tests/tools/build.sh` puts the tools: `$INPLACE_TOOLS_BIN_DIR`, else
/// `target/tools/bin` under the cargo target directory.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("INPLACE_TOOLS_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("tools").join("bin"))
}

/// The tool `name` (built first, once per process, if missing or older than its sources).
pub fn tool(name: &str) -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            // build.sh builds kubectl-krew last.
            ensure_built("tools", &["", "oci-image", "krew"], "kubectl-krew")
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)?;
    Ok(bin_dir().join(name))
}

/// The CNCF Distribution registry's tool `name` (`distribution-registry`,
/// `distribution-htpasswd`, `distribution-token-service`) from `tests/registry` (`make registry`
/// builds it first; built here if missing or older than its sources, once per process).
pub fn distribution_tool(name: &str) -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            // build.sh builds distribution-token-service last.
            ensure_built(
                "registry",
                &["", "htpasswd", "tokenservice"],
                "distribution-token-service",
            )
            .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)?;
    Ok(bin_dir().join(name))
}

/// `PATH` with the tools and the pinned kubectl first, for documented commands that name
/// `crane`, `helm` and `kubectl`.
pub fn path_with_tools() -> anyhow::Result<std::ffi::OsString> {
    tool("crane")?;
    let kubectl = crate::apiserver::kubectl()?;
    let mut dirs = vec![
        bin_dir(),
        kubectl
            .parent()
            .context("kubectl's directory")?
            .to_path_buf(),
    ];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    Ok(std::env::join_paths(dirs)?)
}

/// What `make images` (`scripts/build-image.sh`) wrote: the directory, and the image's
/// `name:tag`. An error naming `make images` when it has not run.
pub fn controller_image() -> anyhow::Result<(PathBuf, String)> {
    let dir = target_dir().join("images");
    let reference =
        std::fs::read_to_string(dir.join("inplace-controller.ref")).with_context(|| {
            format!(
                "no controller image in {}: run `make images`",
                dir.display()
            )
        })?;
    Ok((dir, reference.trim().to_owned()))
}

/// Runs `tests/MODULE/build.sh` into [`bin_dir`] unless `stamp` (what it builds last) is
/// newer than every file in the module's `dirs`.
fn ensure_built(module: &str, dirs: &[&str], stamp: &str) -> anyhow::Result<()> {
    let source = repo_root().join("tests").join(module);
    let stamp = bin_dir().join(stamp);
    let mut fresh = true;
    for dir in dirs {
        fresh &= is_newer_than_sources(&stamp, &source.join(dir))?;
    }
    if fresh {
        return Ok(());
    }
    eprintln!("building the tools of tests/{module} from their pinned Go modules");
    let output = Command::new(source.join("build.sh"))
        .arg(bin_dir())
        .output()
        .with_context(|| format!("running tests/{module}/build.sh (is Go installed?)"))?;
    if !output.status.success() {
        bail!(
            "tests/{module}/build.sh failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `command`; its standard output, or a panic with both outputs (for tests).
pub fn run_ok(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A child process killed (and reaped) when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
