//! What an agent that finds an agent switch in flight does next: the power-loss table of
//! docs/design/agent-self-update.md as one pure function. The same code runs in the old
//! agent (A, brought back by a restart, a reboot or the guard) and in the new one (B). It
//! tells them apart by the version each was built as only when the two versions differ; a
//! switch between equal versions (journaled by a build that did not yet see such a plan as
//! up to date) is told by the link: B runs only once the link names its image. B only ever
//! confirms; it never declares failure (a B that is not what was ordered waits for the
//! guard). A finishes or restarts the switch, or reports the guard's rollback.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::RolledBack;

/// The switch as the old agent journals it (step 2), before it arms the guard.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Switch {
    /// The image the agent's extension link named before the switch.
    pub previous_image: PathBuf,
    /// The image the switch installs (stored and verified in staging).
    pub next_image: PathBuf,
    /// The sha256 the plan gives for `next_image`.
    pub next_sha256: String,
    /// The version the new agent must be built as (`spec.agent.version`).
    pub expected_version: String,
    /// The version the old agent was built as (absent in switches journaled before it was
    /// recorded: then only the link tells the agents apart when the versions are equal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_version: Option<String>,
    /// How many times the switch was started (1 for the first).
    pub attempt: u32,
}

/// What the agent found on the host, read at its start.
#[derive(Debug, Clone, Copy)]
pub struct Found<'a> {
    /// The version this agent was built as.
    pub running_version: &'a str,
    /// Whether `pending.json` is there (the guard is armed).
    pub armed: bool,
    /// Whether `restoring.json` is there (the guard claimed the restore and has not
    /// finished it).
    pub restoring: bool,
    /// What the guard recorded when it restored the previous agent.
    pub rolled_back: Option<&'a RolledBack>,
    /// Where the agent's extension link points (None: missing).
    pub link: Option<&'a Path>,
    /// The sha256 of the file the link names, when it could be read.
    pub link_sha256: Option<&'a str>,
}

/// The next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// This is the new agent and what was ordered: write the plan's status with its own
    /// identity, disarm the guard (if still armed: power lost after 7a leaves it disarmed),
    /// commit the journal, report Succeeded.
    Confirm,
    /// This is the new agent but not what was ordered (another version, or the link names
    /// another file or one that hashes otherwise): confirm nothing; the guard restores the
    /// previous agent at the deadline. The text says why, for the unit's STATUS=.
    AwaitGuard(String),
    /// The guard restored this (old) agent: the revision failed with the guard's reason;
    /// deny it, report RolledBack, remove `rolled-back.json`.
    ReportRolledBack(RolledBack),
    /// The swap happened (the link names the new image, the guard is armed) but this old
    /// agent still runs: refresh, daemon-reload and restart again (step 4, idempotent).
    ContinueSwitch,
    /// The switch stopped before its swap (power lost after step 2 or 3), or lost its guard:
    /// disarm, journal this attempt and start again at step 3 (copy, arm, swap).
    Restart {
        /// The attempt to journal.
        attempt: u32,
    },
    /// Too many attempts: disarm, put the link back at the previous image if it moved, and
    /// give the revision up (`TooManyAttempts`).
    GiveUp,
}

/// Decides the next step of an in-flight `switch` from what was `found`. `max_attempts`
/// is `[activation] max_attempts`, which bounds a switch as any activation.
pub fn resolve(switch: &Switch, found: Found<'_>, max_attempts: u32) -> Resolution {
    let new_agent = is_new_agent(switch, found);
    if new_agent && (found.restoring || found.rolled_back.is_some()) {
        // The guard won the race for `pending.json`: this agent is being replaced.
        return Resolution::AwaitGuard("the guard restored the previous agent".to_owned());
    }
    if new_agent {
        return check_ordered(switch, found);
    }
    if let Some(record) = found.rolled_back {
        return Resolution::ReportRolledBack(record.clone());
    }
    if found.restoring {
        // The guard claimed the restore but has not recorded it yet: it restarts this
        // agent when it is done, and nothing here may re-arm or swap meanwhile.
        return Resolution::AwaitGuard("the guard is restoring this agent".to_owned());
    }
    let swapped = found.link == Some(switch.next_image.as_path());
    if swapped && found.armed {
        return Resolution::ContinueSwitch;
    }
    if switch.attempt >= max_attempts {
        return Resolution::GiveUp;
    }
    Resolution::Restart {
        attempt: switch.attempt + 1,
    }
}

/// Whether this is B. Two versions tell the agents apart; equal ones (or a switch that did
/// not record the old one) cannot, and then only the link can: B runs only from the new
/// image, so an agent that finds the link at the previous image (or missing) is A, and
/// restarts the switch rather than wait for a guard that may never have been armed.
fn is_new_agent(switch: &Switch, found: Found<'_>) -> bool {
    if found.running_version != switch.expected_version {
        return false;
    }
    match &switch.previous_version {
        Some(previous) if *previous != switch.expected_version => true,
        _ => found.link == Some(switch.next_image.as_path()),
    }
}

/// Step 5: B confirms only what was ordered, and says why not otherwise.
fn check_ordered(switch: &Switch, found: Found<'_>) -> Resolution {
    if found.link != Some(switch.next_image.as_path()) {
        return Resolution::AwaitGuard(format!(
            "the agent's extension link names {}, not {}",
            found
                .link
                .map_or_else(|| "nothing".to_owned(), |p| p.display().to_string()),
            switch.next_image.display()
        ));
    }
    if found.link_sha256 != Some(switch.next_sha256.as_str()) {
        return Resolution::AwaitGuard(format!(
            "{} does not hash to the plan's sha256 {}",
            switch.next_image.display(),
            switch.next_sha256
        ));
    }
    Resolution::Confirm
}

#[cfg(test)]
mod tests;
