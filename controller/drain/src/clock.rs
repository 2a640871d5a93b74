//! The drain's one clock, for every caller: from when a drain started, its timeout and what
//! to do when the timeout passes (`onTimeout`), when a pass deletes instead of evicting and
//! where a node that is not drained yet stands. Pure: the caller brings the time and whether
//! the last pass left the node empty. The rollout controller starts the clock at the node's
//! grant, the Cluster API extension at its first drain call (an annotation on the Node).

use std::time::Duration;

use inplace_proto::OnDrainTimeout;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// A node's drain: when it started, how long it may evict, and what happens after that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainClock {
    /// When the drain started.
    pub started: Timestamp,
    /// How long evictions may take before `on_timeout` applies.
    pub timeout: Duration,
    /// `Halt` fails the node; `Skip` leaves it at its revision; `Force` deletes what is left
    /// and waits up to another `timeout` for it to go.
    pub on_timeout: OnDrainTimeout,
}

/// Where a drain stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainVerdict {
    /// No pod left: the node may be disrupted.
    Drained,
    /// Evicting, within the timeout.
    Evicting {
        /// When the timeout passes.
        until: Timestamp,
    },
    /// Past the timeout under `Force`: deleting what is left.
    Forcing {
        /// When the forced deletion's own timeout passes.
        until: Timestamp,
    },
    /// Past the timeout under `Skip`: leave the node at its revision.
    Skipped,
    /// The drain failed.
    TimedOut {
        /// Past the forced deletion's own timeout under `Force`, not past the first
        /// timeout under `Halt`.
        forced: bool,
    },
}

impl DrainClock {
    /// When evictions give up.
    pub fn deadline(&self) -> Timestamp {
        later(self.started, self.timeout)
    }

    /// Whether a pass at `now` deletes pods outright (PodDisruptionBudgets ignored) instead
    /// of evicting them: under `Force`, once the timeout has passed.
    pub fn forces(&self, now: Timestamp) -> bool {
        self.on_timeout == OnDrainTimeout::Force && now >= self.deadline()
    }

    /// Where the drain stands at `now`, given whether the last pass left the node empty.
    pub fn verdict(&self, now: Timestamp, drained: bool) -> DrainVerdict {
        if drained {
            return DrainVerdict::Drained;
        }
        let deadline = self.deadline();
        if now < deadline {
            return DrainVerdict::Evicting { until: deadline };
        }
        match self.on_timeout {
            OnDrainTimeout::Halt => DrainVerdict::TimedOut { forced: false },
            OnDrainTimeout::Skip => DrainVerdict::Skipped,
            OnDrainTimeout::Force => {
                let forced_deadline = later(deadline, self.timeout);
                if now < forced_deadline {
                    DrainVerdict::Forcing {
                        until: forced_deadline,
                    }
                } else {
                    DrainVerdict::TimedOut { forced: true }
                }
            }
        }
    }
}

/// `at` plus `length`, saturating: a timeout too long for a timestamp never passes.
fn later(at: Timestamp, length: Duration) -> Timestamp {
    SignedDuration::try_from(length)
        .ok()
        .and_then(|length| at.checked_add(length).ok())
        .unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn clock(on_timeout: OnDrainTimeout) -> DrainClock {
        DrainClock {
            started: t(1_000),
            timeout: Duration::from_secs(60),
            on_timeout,
        }
    }

    #[test]
    fn a_drained_node_is_drained_whatever_the_time() {
        for on_timeout in [
            OnDrainTimeout::Halt,
            OnDrainTimeout::Skip,
            OnDrainTimeout::Force,
        ] {
            assert_eq!(
                clock(on_timeout).verdict(t(9_999), true),
                DrainVerdict::Drained
            );
        }
    }

    #[test]
    fn within_the_timeout_every_policy_evicts() {
        for on_timeout in [
            OnDrainTimeout::Halt,
            OnDrainTimeout::Skip,
            OnDrainTimeout::Force,
        ] {
            let clock = clock(on_timeout);
            assert_eq!(
                clock.verdict(t(1_059), false),
                DrainVerdict::Evicting { until: t(1_060) }
            );
            assert!(!clock.forces(t(1_059)));
        }
    }

    #[test]
    fn at_the_timeout_halt_fails_and_skip_skips() {
        assert_eq!(
            clock(OnDrainTimeout::Halt).verdict(t(1_060), false),
            DrainVerdict::TimedOut { forced: false }
        );
        assert_eq!(
            clock(OnDrainTimeout::Skip).verdict(t(1_060), false),
            DrainVerdict::Skipped
        );
        assert!(!clock(OnDrainTimeout::Halt).forces(t(5_000)));
    }

    #[test]
    fn force_deletes_for_another_timeout_then_fails() {
        let clock = clock(OnDrainTimeout::Force);
        assert!(clock.forces(t(1_060)));
        assert_eq!(
            clock.verdict(t(1_060), false),
            DrainVerdict::Forcing { until: t(1_120) }
        );
        assert_eq!(
            clock.verdict(t(1_120), false),
            DrainVerdict::TimedOut { forced: true }
        );
    }

    #[test]
    fn a_timeout_too_long_for_a_timestamp_never_passes() {
        let clock = DrainClock {
            timeout: Duration::MAX,
            ..clock(OnDrainTimeout::Force)
        };
        assert_eq!(clock.deadline(), Timestamp::MAX);
        assert!(matches!(
            clock.verdict(t(1_000_000_000), false),
            DrainVerdict::Evicting { .. }
        ));
    }
}
