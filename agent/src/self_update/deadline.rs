//! The guard's deadline on a clock nobody steps (issue 35, item 7).
//!
//! A wall-clock deadline moves with the clock: stepped forward (NTP's first sync, an
//! operator's `date -s`), the guard restores a new agent that had no time to confirm;
//! stepped back a day, a broken agent keeps the node for a day. So the old agent records
//! the boot it armed in and a deadline on `CLOCK_BOOTTIME` (which, unlike
//! `CLOCK_MONOTONIC`, counts time suspended: a node asleep past the deadline is past it),
//! and the guard compares on the same clock when it runs in the same boot. In another boot
//! that clock started again, and the guard grants `confirm_timeout` from its own start,
//! measured on the same clock. Only a record without the boot (written by an agent before
//! this, or when a clock could not be read) is judged on the wall clock, as before.

use serde::{Deserialize, Serialize};

use super::Pending;

/// Where the deadline lies on the clock of the boot the guard was armed in.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BootDeadline {
    /// `/proc/sys/kernel/random/boot_id` of that boot.
    pub boot_id: String,
    /// Seconds on that boot's `CLOCK_BOOTTIME` by which the new agent must have confirmed.
    pub boottime: u64,
}

/// The clocks at one instant, as the guard's judgement and the arming need them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClockReading {
    /// This boot's ID; None when it could not be read.
    pub boot_id: Option<String>,
    /// Seconds on `CLOCK_BOOTTIME`; None when it could not be read.
    pub boottime: Option<u64>,
    /// Unix seconds.
    pub wall: u64,
}

impl ClockReading {
    /// Reads this host's clocks; `boot_id` as [`read_boot_id`] found it (read once: it
    /// does not change within a process).
    pub fn read(boot_id: Option<String>) -> ClockReading {
        let boottime = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .ok()
            .and_then(|t| u64::try_from(t.tv_sec()).ok());
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        ClockReading {
            boot_id,
            boottime,
            wall,
        }
    }

    /// The deadline `timeout` seconds from now, in the form the guard reads it: on this
    /// boot's clock when both the boot and the clock are known, and on the wall clock
    /// always (the only one an older guard, or someone inspecting the node, understands).
    pub fn deadline_after(&self, timeout: u64) -> (u64, Option<BootDeadline>) {
        let boot = self
            .boot_id
            .clone()
            .zip(self.boottime)
            .map(|(boot_id, boottime)| BootDeadline {
                boot_id,
                boottime: boottime.saturating_add(timeout),
            });
        (self.wall.saturating_add(timeout), boot)
    }
}

/// Seconds left before the new agent must have confirmed (0: the deadline passed), for a
/// guard that started at `started` and looks at `now`.
pub fn remaining(pending: &Pending, started: &ClockReading, now: &ClockReading) -> u64 {
    let timeout = pending.confirm_timeout;
    match (&pending.boot_deadline, now.boottime) {
        (Some(armed), Some(now_boottime))
            if now.boot_id.as_deref() == Some(armed.boot_id.as_str()) =>
        {
            armed.boottime.saturating_sub(now_boottime)
        }
        // Another boot (or one the guard cannot name): the node was down, the new agent
        // had no chance, and the armed boot's clock means nothing here.
        (Some(_), Some(now_boottime)) => match started.boottime {
            Some(started_boottime) => started_boottime
                .saturating_add(timeout)
                .saturating_sub(now_boottime),
            None => wall_remaining(pending, started, now),
        },
        _ => wall_remaining(pending, started, now),
    }
}

/// The rule before boot deadlines: the wall-clock deadline, and at least `confirm_timeout`
/// from the guard's own start.
fn wall_remaining(pending: &Pending, started: &ClockReading, now: &ClockReading) -> u64 {
    pending
        .deadline
        .max(started.wall.saturating_add(pending.confirm_timeout))
        .saturating_sub(now.wall)
}

/// This boot's ID: the unit's `boot_id` credential under the shipped agent unit (its
/// `/proc` holds processes only), the kernel's file otherwise (the guard's unit).
pub fn read_boot_id() -> Option<String> {
    let credential = std::env::var_os("CREDENTIALS_DIRECTORY")
        .map(|dir| std::path::PathBuf::from(dir).join("boot_id"));
    credential
        .into_iter()
        .chain([std::path::PathBuf::from("/proc/sys/kernel/random/boot_id")])
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map(|id| id.trim().to_owned())
}

#[cfg(test)]
mod tests;
