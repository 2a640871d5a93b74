//! The guard of an agent switch (docs/design/agent-self-update.md): what restores the
//! previous agent when the new one does not confirm itself by a deadline.
//!
//! The old agent arms it by writing `<state>/self-update/pending.json` after journaling the
//! switch and before re-pointing its own extension link; the new agent disarms it by
//! removing that file once it has proved it can do its job. The guard runs from a unit
//! installed outside the agent's image, as the previous agent binary, and never talks to
//! the API server: it only needs PID 1. Not wired into plans yet (issue 23): this is the
//! half that must exist before any plan may swap the agent.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use deadline::{BootDeadline, ClockReading};

use crate::links;
use crate::policy::{OWN_EXTENSION, OWN_UNIT};
use crate::systemd::{SystemdError, SystemdManager};

/// The state directory the shipped guard units watch (`systemd/inplace-agent-guard.path`
/// and `.service`: `<this>/self-update/pending.json`, the kept previous binary). Fixed in
/// the units: the guard reads no configuration, since a broken new image may be what is
/// wrong.
pub const GUARD_STATE_DIR: &str = "/var/lib/inplace";
/// The extensions directory whose `inplace-agent.raw` link the shipped guard restores (the
/// only one it may write, `ReadWritePaths=`).
pub const GUARD_EXTENSIONS_DIR: &str = "/etc/extensions";

/// The unit that starts the guard while a switch is armed (installed outside the agent's
/// image, enabled): without it active, nothing restores a broken new agent.
pub const GUARD_PATH_UNIT: &str = "inplace-agent-guard.path";

/// The armed switch, as the old agent wrote it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    /// The image the extension link named before the switch (restored on failure).
    pub previous_image: PathBuf,
    /// The image the switch installs.
    pub next_image: PathBuf,
    /// The version the new agent must report to confirm.
    pub expected_version: String,
    /// Unix seconds by which the new agent must have confirmed: judged only when
    /// `boot_deadline` is absent (a record from an agent before it), since the wall clock
    /// can be stepped.
    pub deadline: u64,
    /// Seconds the new agent is given from the guard's own start in another boot than the
    /// one armed (the node was down, the new agent had no chance), and at least, for a
    /// record without `boot_deadline`.
    pub confirm_timeout: u64,
    /// The deadline on the armed boot's own clock (the [`deadline`](crate::self_update::deadline)
    /// module says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_deadline: Option<BootDeadline>,
    /// The sha256 of the previous agent binary kept for the guard (for whoever inspects
    /// the node; the guard does not check itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_binary_sha256: Option<String>,
}

/// What the guard found when it restored the previous agent; the old agent reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RolledBack {
    /// The condition reason.
    pub reason: String,
    /// What PID 1 knew about the new agent when the deadline passed.
    pub message: String,
}

/// The guard's files and the link it restores.
#[derive(Clone, Debug)]
pub struct GuardPaths {
    /// `<state>/self-update/pending.json`.
    pub pending: PathBuf,
    /// `<state>/self-update/restoring.json`: `pending.json` renamed by a guard that claimed
    /// the restore (see [`claim_restore`]).
    pub restoring: PathBuf,
    /// `<state>/self-update/rolled-back.json`.
    pub rolled_back: PathBuf,
    /// `<extensions_dir>/inplace-agent.raw`.
    pub extension_link: PathBuf,
    /// `<state>/self-update/previous/inplace-agent`: the binary the guard unit runs.
    pub previous_binary: PathBuf,
}

impl GuardPaths {
    /// The paths for an agent whose state lives in `state_dir` and whose extension link
    /// lives in `extensions_dir`.
    pub fn new(state_dir: &Path, extensions_dir: &Path) -> Self {
        let dir = state_dir.join("self-update");
        GuardPaths {
            pending: dir.join("pending.json"),
            restoring: dir.join("restoring.json"),
            rolled_back: dir.join("rolled-back.json"),
            extension_link: extensions_dir.join(format!("{OWN_EXTENSION}.raw")),
            previous_binary: dir.join("previous").join("inplace-agent"),
        }
    }
}

/// The guard's judgement of one look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing armed: the new agent confirmed, or there was no switch.
    Done,
    /// The deadline passed with the link still at the previous image: the old agent stopped
    /// before it swapped, is still the one that runs, and starts the switch again itself.
    Disarm,
    /// Armed and within the deadline: look again in this many seconds.
    Wait(u64),
    /// The deadline passed without a confirmation.
    Restore,
}

/// Judges one look: `link` is what the extension link names now (None: missing),
/// `started` the clocks when this guard started, `now` the clocks now.
pub fn judge(
    pending: Option<&Pending>,
    link: Option<&Path>,
    started: &ClockReading,
    now: &ClockReading,
) -> Verdict {
    let Some(pending) = pending else {
        return Verdict::Done;
    };
    let left = deadline::remaining(pending, started, now);
    if left > 0 {
        // Even with the link still at the previous image: the old agent arms the guard
        // before it swaps, so a guard started in between must not disarm.
        Verdict::Wait(left)
    } else if link == Some(pending.previous_image.as_path()) {
        Verdict::Disarm
    } else {
        Verdict::Restore
    }
}

/// Why the guard could not do its job (the unit fails, PID 1 restarts it).
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// `pending.json` exists but cannot be read or parsed.
    #[error("{path}: {message}")]
    Pending {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What the guard was doing.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// PID 1 refused or failed a step.
    #[error(transparent)]
    Systemd(#[from] SystemdError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> GuardError {
    let what = what.into();
    move |source| GuardError::Io { what, source }
}

/// Reads `pending.json`; absent is `None`.
pub fn read_pending(path: &Path) -> Result<Option<Pending>, GuardError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| GuardError::Pending {
                path: path.to_path_buf(),
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(format!("reading {}", path.display()))(e)),
    }
}

/// Arms the guard (the old agent, before it re-points its link): durable before it returns.
pub fn arm(paths: &GuardPaths, pending: &Pending) -> Result<(), GuardError> {
    let what = format!("writing {}", paths.pending.display());
    if let Some(dir) = paths.pending.parent() {
        std::fs::create_dir_all(dir).map_err(io(what.clone()))?;
    }
    let bytes = serde_json::to_vec_pretty(pending).expect("plain data serializes");
    links::write_atomically(&paths.pending, &bytes).map_err(io(what))
}

/// Disarms the guard (the old agent when it never swapped, or gives the switch up).
pub fn disarm(paths: &GuardPaths) -> Result<(), GuardError> {
    links::remove_durably(&paths.pending)
        .map_err(io(format!("removing {}", paths.pending.display())))
}

/// The new agent's side of the one race of a switch: near the deadline the new agent
/// confirming and the guard restoring both want `pending.json`, and exactly one of them
/// gets it (an unlink here, a rename in [`claim_restore`]). True: this agent confirmed (or
/// had already, before a power loss) and may commit; false: the guard claimed the restore,
/// and this agent is about to be replaced.
pub fn claim_confirmation(paths: &GuardPaths) -> Result<bool, GuardError> {
    let what = || format!("removing {}", paths.pending.display());
    match std::fs::remove_file(&paths.pending) {
        Ok(()) => {
            links::fsync_dir(state_dir_of(paths)).map_err(io(what()))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(!paths.restoring.exists()),
        Err(e) => Err(io(what())(e)),
    }
}

fn state_dir_of(paths: &GuardPaths) -> &Path {
    paths.pending.parent().unwrap_or(Path::new("/"))
}

/// The guard's side of that race: renames `pending.json` to `restoring.json`. Returns the
/// switch to restore, or None when the new agent confirmed first. A guard that finds
/// `restoring.json` (it died mid-restore) takes it up again.
pub fn claim_restore(paths: &GuardPaths) -> Result<Option<Pending>, GuardError> {
    let what = || format!("renaming {}", paths.pending.display());
    match std::fs::rename(&paths.pending, &paths.restoring) {
        Ok(()) => links::fsync_dir(state_dir_of(paths)).map_err(io(what()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(what())(e)),
    }
    read_pending(&paths.restoring)
}

/// The guard's loop: looks, waits, and at the deadline restores the previous agent.
/// `now` reads the clocks; returns when nothing is armed any more.
pub async fn guard(
    paths: &GuardPaths,
    systemd: &dyn SystemdManager,
    now: &dyn Fn() -> ClockReading,
) -> Result<Verdict, GuardError> {
    let started = now();
    if let Some(claimed) = read_pending(&paths.restoring)? {
        // A guard that died mid-restore: its claim stands; every step is idempotent.
        restore(paths, &claimed, systemd).await?;
        return Ok(Verdict::Restore);
    }
    loop {
        let Some(pending) = read_pending(&paths.pending)? else {
            return Ok(Verdict::Done);
        };
        let link = std::fs::read_link(&paths.extension_link).ok();
        match judge(Some(&pending), link.as_deref(), &started, &now()) {
            Verdict::Done => return Ok(Verdict::Done),
            Verdict::Disarm => {
                disarm(paths)?;
                return Ok(Verdict::Disarm);
            }
            // Look again at least every 5 s: the new agent usually confirms early.
            Verdict::Wait(seconds) => {
                tokio::time::sleep(Duration::from_secs(seconds.clamp(1, 5))).await;
            }
            Verdict::Restore => {
                tracing::info!(
                    expected = %pending.expected_version,
                    "the deadline passed unconfirmed: claiming the restore"
                );
                let Some(claimed) = claim_restore(paths)? else {
                    return Ok(Verdict::Done);
                };
                restore(paths, &claimed, systemd).await?;
                return Ok(Verdict::Restore);
            }
        }
    }
}

/// Puts the previous agent back, once the restore is claimed: records why, then link,
/// refresh, reload, restart; removes `restoring.json` last, so a guard killed half-way
/// takes the restore up again (every step is idempotent).
async fn restore(
    paths: &GuardPaths,
    pending: &Pending,
    systemd: &dyn SystemdManager,
) -> Result<(), GuardError> {
    let seen = match systemd.unit_state(OWN_UNIT).await {
        Ok(s) => format!(
            "{} ({}), restarted {} times",
            s.active_state,
            s.sub_state,
            s.n_restarts.unwrap_or(0)
        ),
        Err(e) => format!("its state could not be read: {e}"),
    };
    let record = RolledBack {
        reason: inplace_proto::Reason::AgentNotConfirmed.as_str().to_owned(),
        message: format!(
            "agent {} did not confirm itself by its deadline ({OWN_UNIT}: {seen}); restored {}",
            pending.expected_version,
            pending.previous_image.display()
        ),
    };
    if !paths.rolled_back.exists() {
        let bytes = serde_json::to_vec_pretty(&record).expect("plain data serializes");
        links::write_atomically(&paths.rolled_back, &bytes)
            .map_err(io(format!("writing {}", paths.rolled_back.display())))?;
    }
    host::swap_to(paths, &pending.previous_image, systemd, || {
        crate::failpoints::hit(&paths.pending, "guard.relinked");
    })
    .await?;
    links::remove_durably(&paths.restoring)
        .map_err(io(format!("removing {}", paths.restoring.display())))
}

pub mod admission;
pub mod deadline;
pub mod host;
pub mod image;
pub mod resume;
#[cfg(test)]
mod tests;
