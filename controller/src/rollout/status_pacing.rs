//! How often a rollout's status is written: at most once per [`STATUS_INTERVAL`] however
//! large the fleet, since a busy rollout decides many times a second (every agent report
//! starts a round) and each status write is one more write for the API server and one
//! more watch event for every client. A status decided in between is owed, and written
//! when the interval has passed (the round asks to be looked at again then).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest time between two status writes of one rollout.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// One rollout's status writes: when the last was made, and whether a newer status is
/// owed. Pure: the time is given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatusPacing {
    last_write: Option<Instant>,
    owed: bool,
}

/// What to do with an owed status now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWrite {
    /// Nothing is owed.
    Nothing,
    /// Write it now.
    Now,
    /// Write it after this long.
    After(Duration),
}

impl StatusPacing {
    /// A round decided a status different from the last one decided.
    pub fn owe(&mut self) {
        self.owed = true;
    }

    /// Whether the owed status may be written at `now`.
    pub fn next_write(&self, now: Instant) -> StatusWrite {
        if !self.owed {
            return StatusWrite::Nothing;
        }
        match self.last_write {
            Some(at) if now < at + STATUS_INTERVAL => {
                StatusWrite::After(at + STATUS_INTERVAL - now)
            }
            _ => StatusWrite::Now,
        }
    }

    /// The owed status was written at `now`.
    pub fn wrote(&mut self, now: Instant) {
        self.last_write = Some(now);
        self.owed = false;
    }
}

/// Every rollout's [`StatusPacing`].
#[derive(Debug, Default)]
pub struct StatusPacer {
    rollouts: Mutex<HashMap<String, StatusPacing>>,
}

impl StatusPacer {
    /// Runs `f` on `rollout`'s pacing.
    pub fn with<T>(&self, rollout: &str, f: impl FnOnce(&mut StatusPacing) -> T) -> T {
        let mut all = self
            .rollouts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(all.entry(rollout.to_owned()).or_default())
    }

    /// Forgets a deleted rollout.
    pub fn forget(&self, rollout: &str) {
        self.rollouts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(rollout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_status_is_written_at_once_and_later_ones_a_second_apart() {
        let start = Instant::now();
        let mut pacing = StatusPacing::default();
        assert_eq!(pacing.next_write(start), StatusWrite::Nothing);
        pacing.owe();
        assert_eq!(pacing.next_write(start), StatusWrite::Now);
        pacing.wrote(start);
        assert_eq!(pacing.next_write(start), StatusWrite::Nothing);

        // Ten rounds in the next second each decide a new status: one write is owed,
        // made when the second has passed.
        for ms in (100..1000).step_by(100) {
            let now = start + Duration::from_millis(ms);
            pacing.owe();
            assert_eq!(
                pacing.next_write(now),
                StatusWrite::After(Duration::from_millis(1000 - ms))
            );
        }
        let later = start + STATUS_INTERVAL;
        assert_eq!(pacing.next_write(later), StatusWrite::Now);
        pacing.wrote(later);
        assert_eq!(pacing.next_write(later), StatusWrite::Nothing);
    }

    #[test]
    fn a_failed_write_stays_owed() {
        let start = Instant::now();
        let mut pacing = StatusPacing::default();
        pacing.owe();
        // The write failed: `wrote` was not called.
        assert_eq!(
            pacing.next_write(start + Duration::from_secs(5)),
            StatusWrite::Now
        );
    }
}
