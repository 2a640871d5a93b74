//! The switch's edges on the host (docs/design/agent-self-update.md, steps 3–5): keeping
//! the running binary for the guard, reading what an agent finds at its start, and the swap
//! itself. Small and separately tested; the coordinator strings them together.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::resume::Found;
use super::{GuardError, GuardPaths, RolledBack, io as io_error};
use crate::links;
use crate::policy::OWN_UNIT;
use crate::systemd::SystemdManager;

/// The running agent: the version it was built as (how an agent tells whether it is the
/// one a switch ordered) and its binary (what the old agent keeps for the guard).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningAgent {
    /// The build version (`inplace-agent --version`).
    pub version: String,
    /// The running binary.
    pub exe: PathBuf,
}

impl RunningAgent {
    /// This process.
    pub fn this_process() -> RunningAgent {
        RunningAgent {
            version: crate::build_version().to_owned(),
            exe: PathBuf::from("/proc/self/exe"),
        }
    }
}

/// Step 3, first half: copies the running agent (`exe`, `/proc/self/exe`) to `dest`
/// (`<state>/self-update/previous/inplace-agent`, what the guard unit runs), durably and
/// executable, before the guard is armed; returns the copy's sha256 for `pending.json`.
pub fn keep_previous_binary(exe: &Path, dest: &Path) -> io::Result<String> {
    let bytes = std::fs::read(exe)?;
    links::write_atomically(dest, &bytes)?;
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))?;
    std::fs::File::open(dest)?.sync_all()?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// What an agent finds of a switch on the host at its start (owned; see [`Found`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Whether `pending.json` is there.
    pub armed: bool,
    /// Whether `restoring.json` is there: the guard claimed the restore.
    pub restoring: bool,
    /// The guard's record of a restore, if it made one.
    pub rolled_back: Option<RolledBack>,
    /// Where the agent's extension link points.
    pub link: Option<PathBuf>,
    /// The sha256 of the file the link names, when it could be read.
    pub link_sha256: Option<String>,
}

impl Observed {
    /// Reads the guard's files and the agent's extension link (hashing its target).
    pub fn read(paths: &GuardPaths) -> Result<Observed, GuardError> {
        let rolled_back = match std::fs::read(&paths.rolled_back) {
            Ok(bytes) => Some(
                serde_json::from_slice(&bytes).map_err(|e| GuardError::Pending {
                    path: paths.rolled_back.clone(),
                    message: e.to_string(),
                })?,
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(io_error(format!("reading {}", paths.rolled_back.display()))(e));
            }
        };
        let link = std::fs::read_link(&paths.extension_link).ok();
        let link_sha256 = link
            .as_deref()
            .and_then(|target| crate::store::hash_file(target).ok());
        Ok(Observed {
            armed: paths.pending.exists(),
            restoring: paths.restoring.exists(),
            rolled_back,
            link,
            link_sha256,
        })
    }

    /// The borrowed view [`super::resume::resolve`] takes.
    pub fn found<'a>(&'a self, running_version: &'a str) -> Found<'a> {
        Found {
            running_version,
            armed: self.armed,
            restoring: self.restoring,
            rolled_back: self.rolled_back.as_ref(),
            link: self.link.as_deref(),
            link_sha256: self.link_sha256.as_deref(),
        }
    }
}

/// Step 4 (and the guard's restore, towards the previous image): re-points the agent's
/// extension link at `next_image`, refreshes the extensions, reloads PID 1 and restarts the
/// agent's unit (which ends this process when PID 1 gets to it). Every part is idempotent,
/// so an interrupted swap is redone whole. `relinked` runs between the link swap and the
/// refresh: the caller's failpoint there (`switch.relinked`, `guard.relinked`), where a
/// power loss leaves the new link to be merged at boot.
pub async fn swap_to(
    paths: &GuardPaths,
    next_image: &Path,
    systemd: &dyn SystemdManager,
    relinked: impl FnOnce(),
) -> Result<(), GuardError> {
    links::swap_symlink(&paths.extension_link, next_image).map_err(io_error(format!(
        "re-pointing {}",
        paths.extension_link.display()
    )))?;
    relinked();
    systemd
        .refresh_extensions(crate::systemd::ExtensionClass::Sysext)
        .await?;
    systemd.daemon_reload().await?;
    systemd.restart_unit(OWN_UNIT).await?;
    Ok(())
}

/// The old agent, once it reported the guard's restore, removes its record.
pub fn forget_rolled_back(paths: &GuardPaths) -> Result<(), GuardError> {
    links::remove_durably(&paths.rolled_back).map_err(io_error(format!(
        "removing {}",
        paths.rolled_back.display()
    )))
}
