//! Crash injection for the crash-matrix suite (`agent/tests/crash_matrix.rs`).
//!
//! With the cargo feature `failpoints`, [`hit`] reads the file `failpoints` next to the
//! single-instance lock (by default `/run/inplace/failpoints`); when one of its lines names
//! the point being passed, the file is removed (the point fires once) and the process
//! SIGKILLs itself: exactly "kill -9 at step X", no unwinding, no destructors, no flush.
//! Without the feature [`hit`] is an empty inline function: release builds and the
//! packaged binary carry no failpoint code (`cargo build --release` never enables it; the
//! feature is switched on only for this package's own tests through a self
//! dev-dependency).
//!
//! Points: an update's and a restart rollback's in [`UPDATE_POINTS`] and [`ROLLBACK_POINTS`],
//! in the order they are passed (the crash matrix kills at each). A reboot activation's
//! (`update/reboot.rs`): `reboot.journaled`, `reboot.booted`, `rollback.reboot_journaled`,
//! `rollback.booted`. The agent switch's (docs/design/agent-self-update.md): `switch.begin`
//! (journaled, not armed), `switch.armed` (armed, not swapped), `switch.relinked` (the link
//! at the new image, not refreshed nor restarted), `switch.proved` (the new agent's status
//! written, guard still armed), `switch.disarmed` (disarmed, journal not committed),
//! `switch.committed` (journal committed, Succeeded not reported). The guard (no
//! configuration, no lock file, and `/run` read-only under its unit) reads its points from
//! `<state>/self-update/failpoints` instead: `guard.relinked` (the restore claimed and
//! recorded, the link back at the previous image, not refreshed nor restarted). The crash
//! matrix's reboot table and the agent switch's power-loss table
//! (`tests/tests/agent_switch_crash.rs`) list which of these they cut at, and how.

use std::path::Path;

/// The points an update to a healthy revision passes, in order (the crash matrix kills
/// the agent at each).
pub const UPDATE_POINTS: &[&str] = &[
    "stage.begin",
    "stage.artifact",
    "stage.done",
    "activate.begin",
    "activate.swap",
    "activate.remove",
    "activate.sysext_refreshed",
    "activate.unit_restarted",
    "verify.begin",
    "verify.progress",
    "commit.before",
    "commit.saved",
];

/// The points a rollback after a failed verification passes, in order.
pub const ROLLBACK_POINTS: &[&str] = &[
    "rollback.begin",
    "rollback.restore",
    "rollback.sysext_refreshed",
    "rollback.unit_restarted",
    "rollback.verify",
    "rollback.saved",
];

/// Passes the point `name`; kills the process when it is armed (feature `failpoints`).
#[cfg(feature = "failpoints")]
pub fn hit(lock_file: &Path, name: &str) {
    let Some(dir) = lock_file.parent() else {
        return;
    };
    let file = dir.join("failpoints");
    let Ok(text) = std::fs::read_to_string(&file) else {
        return;
    };
    if text.lines().any(|l| l.trim() == name) {
        let _ = std::fs::remove_file(&file);
        tracing::error!(
            failpoint = name,
            "failpoint armed: killing the agent (SIGKILL)"
        );
        let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGKILL);
        // SIGKILL to oneself is delivered before kill(2) returns; never continue.
        std::process::abort();
    }
}

/// Passes the point `name`; without the feature `failpoints` this does nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_lock_file: &Path, _name: &str) {}
