//! The cached Debian root filesystems the nodes boot from: bookworm (systemd 252) for every
//! node by default, trixie (systemd 257) for the tests that need a newer systemd
//! ([`Suite`]).
//!
//! The recipe is `tests/testbed/build-rootfs.sh`, compiled into this crate; the cache path
//! carries a hash of the script, the mirror and the suite, so editing the recipe rebuilds on
//! the next run while old trees stay untouched, and the two suites sit side by side (delete
//! `/var/cache/inplace-testbed/rootfs-*` to reclaim them).

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

/// The Debian release a node runs, and with it its systemd.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Suite {
    /// Debian 12, systemd 252: every node unless a test asks for another.
    #[default]
    Bookworm,
    /// Debian 13, systemd 257 (the closest Debian gets to Flatcar's current systemd):
    /// `systemd-confext` (systemd >= 254) and mutable system extensions (>= 256).
    Trixie,
}

impl Suite {
    /// Both, oldest first: what a test that must hold on every supported systemd runs on.
    pub const ALL: [Suite; 2] = [Suite::Bookworm, Suite::Trixie];

    /// debootstrap's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Suite::Bookworm => "bookworm",
            Suite::Trixie => "trixie",
        }
    }

    /// The major version of the systemd it ships.
    pub fn systemd_version(self) -> u32 {
        match self {
            Suite::Bookworm => 252,
            Suite::Trixie => 257,
        }
    }

    /// `VERSION_ID` of its os-release (what an extension image's release must match).
    pub fn version_id(self) -> &'static str {
        match self {
            Suite::Bookworm => "12",
            Suite::Trixie => "13",
        }
    }
}

impl std::str::FromStr for Suite {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        Suite::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| Error::Invalid(format!("unknown suite {name:?}: bookworm or trixie")))
    }
}

/// Which root filesystem to build and where to cache it.
#[derive(Debug, Clone)]
pub struct RootfsRecipe {
    /// Directory holding `rootfs-<hash>` trees.
    pub cache_dir: PathBuf,
    /// Debian mirror URL.
    pub mirror: String,
    /// The Debian release.
    pub suite: Suite,
}

impl Default for RootfsRecipe {
    fn default() -> Self {
        Self::of(Suite::default())
    }
}

impl RootfsRecipe {
    /// The recipe of `suite` with the default cache and mirror.
    pub fn of(suite: Suite) -> Self {
        Self {
            cache_dir: PathBuf::from(DEFAULT_CACHE_DIR),
            mirror: DEFAULT_MIRROR.to_owned(),
            suite,
        }
    }

    /// A short hash of the recipe (script text, mirror and suite).
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(BUILD_SCRIPT.as_bytes());
        hasher.update([0]);
        hasher.update(self.mirror.as_bytes());
        hasher.update([0]);
        hasher.update(self.suite.name().as_bytes());
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
        // One lock per tree: a build of one suite never waits for the other's.
        let lock = host::FileLock::acquire(
            self.cache_dir
                .join(format!(".build-rootfs-{}.lock", self.hash())),
        )
        .await?;
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
            "inplace-tests: building the test-bed root filesystem ({}) in {} (debootstrap, 1-3 minutes, once)",
            self.suite.name(),
            dest.display()
        );
        let started = Instant::now();
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .arg(&dest)
            .arg(&self.mirror)
            .arg(self.suite.name())
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
                command: format!(
                    "{} {} {} {}",
                    script.display(),
                    dest.display(),
                    self.mirror,
                    self.suite.name()
                ),
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

/// Builds (once) and returns the default (bookworm) root filesystem.
pub async fn ensure_rootfs() -> Result<PathBuf> {
    RootfsRecipe::default().ensure().await
}

/// Builds (once) and returns `suite`'s root filesystem.
pub async fn ensure_suite(suite: Suite) -> Result<PathBuf> {
    RootfsRecipe::of(suite).ensure().await
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_suite_has_a_tree_of_its_own_and_a_name_that_parses_back() {
        let bookworm = RootfsRecipe::of(Suite::Bookworm);
        let trixie = RootfsRecipe::of(Suite::Trixie);
        assert_ne!(bookworm.path(), trixie.path());
        assert_eq!(RootfsRecipe::default().path(), bookworm.path());
        let elsewhere = RootfsRecipe {
            mirror: "http://mirror.invalid/debian".to_owned(),
            ..RootfsRecipe::of(Suite::Trixie)
        };
        assert_ne!(elsewhere.hash(), trixie.hash());
        for suite in Suite::ALL {
            assert_eq!(suite.name().parse::<Suite>().unwrap(), suite);
        }
        assert!("buster".parse::<Suite>().is_err());
        assert_eq!(Suite::Trixie.systemd_version(), 257);
        assert_eq!(Suite::Bookworm.version_id(), "12");
    }
}
