//! The cached Debian bookworm root filesystem every node boots from.
//!
//! The recipe is `tests/testbed/build-rootfs.sh`, compiled into this crate; the cache path
//! carries a hash of the script and the mirror, so editing the recipe rebuilds on the next run
//! while old trees stay untouched (delete `/var/cache/inplace-testbed/rootfs-*` to reclaim them).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::process::Command;

use super::host;
use crate::error::IoContext;
use crate::{Error, Result, prereq};

/// The recipe script (`tests/testbed/build-rootfs.sh`).
pub const BUILD_SCRIPT: &str = include_str!("../../testbed/build-rootfs.sh");
/// Where built root filesystems are cached, outside the repository.
pub const DEFAULT_CACHE_DIR: &str = "/var/cache/inplace-testbed";
/// The Debian mirror debootstrap downloads from.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
/// The marker the script writes last, inside the tree, before the atomic rename.
const COMPLETE_MARKER: &str = ".inplace-rootfs-complete";
/// debootstrap usually takes 1-2 minutes; a loaded machine with a slow mirror takes longer.
const BUILD_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Which root filesystem to build and where to cache it.
#[derive(Debug, Clone)]
pub struct RootfsRecipe {
    /// Directory holding `rootfs-<hash>` trees.
    pub cache_dir: PathBuf,
    /// Debian mirror URL.
    pub mirror: String,
}

impl Default for RootfsRecipe {
    fn default() -> Self {
        Self {
            cache_dir: PathBuf::from(DEFAULT_CACHE_DIR),
            mirror: DEFAULT_MIRROR.to_owned(),
        }
    }
}

impl RootfsRecipe {
    /// A short hash of the recipe (script text and mirror).
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(BUILD_SCRIPT.as_bytes());
        hasher.update([0]);
        hasher.update(self.mirror.as_bytes());
        hex::encode(hasher.finalize())[..12].to_owned()
    }

    /// Where this recipe's tree lives once built.
    pub fn path(&self) -> PathBuf {
        self.cache_dir.join(format!("rootfs-{}", self.hash()))
    }

    /// Whether the tree is built and complete.
    pub fn is_built(&self) -> bool {
        self.path().join(COMPLETE_MARKER).is_file()
    }

    /// Returns the cached tree, building it first when missing. Safe to call from many test
    /// processes at once: one builds (under a file lock), the others wait and reuse it.
    pub async fn ensure(&self) -> Result<PathBuf> {
        let dest = self.path();
        if self.is_built() {
            return Ok(dest);
        }
        prereq::require_root()?;
        prereq::require_tools(&["debootstrap", "systemd-nspawn"])?;
        tokio::fs::create_dir_all(&self.cache_dir)
            .await
            .ctx(|| format!("creating {}", self.cache_dir.display()))?;
        let lock = host::FileLock::acquire(self.cache_dir.join(".build.lock")).await?;
        if self.is_built() {
            drop(lock);
            return Ok(dest);
        }
        self.remove_leftovers(&dest).await?;
        let script = self
            .cache_dir
            .join(format!("build-rootfs-{}.sh", self.hash()));
        tokio::fs::write(&script, BUILD_SCRIPT)
            .await
            .ctx(|| format!("writing {}", script.display()))?;
        tracing::info!(dest = %dest.display(), "building the test-bed root filesystem (debootstrap)");
        eprintln!(
            "inplace-tests: building the test-bed root filesystem in {} (debootstrap, 1-3 minutes, once)",
            dest.display()
        );
        let started = Instant::now();
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .arg(&dest)
            .arg(&self.mirror)
            .kill_on_drop(true);
        let output = tokio::time::timeout(BUILD_TIMEOUT, cmd.output())
            .await
            .map_err(|_| Error::Timeout {
                what: format!("debootstrap into {}", dest.display()),
                after: BUILD_TIMEOUT,
            })?
            .ctx(|| format!("running {}", script.display()))?;
        drop(lock);
        if !output.status.success() || !self.is_built() {
            let mut log = String::from_utf8_lossy(&output.stdout).into_owned();
            log.push_str(&String::from_utf8_lossy(&output.stderr));
            return Err(Error::CommandFailed {
                command: format!("{} {} {}", script.display(), dest.display(), self.mirror),
                status: output.status.to_string(),
                stderr: tail(&log, 40),
            });
        }
        eprintln!(
            "inplace-tests: root filesystem built in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(dest)
    }

    /// Removes half-built trees of earlier, killed builds (they may still have /proc mounted).
    async fn remove_leftovers(&self, dest: &Path) -> Result<()> {
        let prefix = format!(
            "{}.tmp-",
            dest.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        );
        let mut entries = tokio::fs::read_dir(&self.cache_dir)
            .await
            .ctx(|| format!("listing {}", self.cache_dir.display()))?;
        while let Some(entry) = entries
            .next_entry()
            .await
            .ctx(|| format!("listing {}", self.cache_dir.display()))?
        {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                host::remove_tree(&entry.path()).await?;
            }
        }
        if dest.exists() && !self.is_built() {
            host::remove_tree(dest).await?;
        }
        Ok(())
    }
}

/// Builds (once) and returns the default root filesystem.
pub async fn ensure_rootfs() -> Result<PathBuf> {
    RootfsRecipe::default().ensure().await
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
