//! The power-loss table of docs/design/agent-self-update.md, row by row: what the agent
//! that starts after the loss finds, and what it must do.

use std::path::PathBuf;

use super::*;

const OLD: &str = "0.1.0";
const NEW: &str = "0.2.0";
const MAX_ATTEMPTS: u32 = 3;

fn switch(attempt: u32) -> Switch {
    Switch {
        previous_image: "/opt/extensions/inplace-agent/inplace-agent-0.1.0.raw".into(),
        next_image: "/opt/extensions/inplace-agent/inplace-agent-0.2.0.raw".into(),
        next_sha256: "b".repeat(64),
        expected_version: NEW.into(),
        previous_version: Some(OLD.into()),
        attempt,
    }
}

/// One row: who runs, whether armed, the guard's record, the link, the link's hash.
struct Host {
    running: &'static str,
    armed: bool,
    restoring: bool,
    rolled_back: Option<RolledBack>,
    link: Option<PathBuf>,
    link_sha256: Option<String>,
}

impl Host {
    /// The link still at the previous image, as before step 4.
    fn before_swap(running: &'static str, armed: bool) -> Host {
        let s = switch(1);
        Host {
            running,
            armed,
            restoring: false,
            rolled_back: None,
            link: Some(s.previous_image),
            link_sha256: Some("a".repeat(64)),
        }
    }

    /// The link at the new image, as after step 4.
    fn after_swap(running: &'static str, armed: bool) -> Host {
        let s = switch(1);
        Host {
            running,
            armed,
            restoring: false,
            rolled_back: None,
            link: Some(s.next_image),
            link_sha256: Some(s.next_sha256),
        }
    }

    fn resolve(&self, switch: &Switch) -> Resolution {
        let found = Found {
            running_version: self.running,
            armed: self.armed,
            restoring: self.restoring,
            rolled_back: self.rolled_back.as_ref(),
            link: self.link.as_deref(),
            link_sha256: self.link_sha256.as_deref(),
        };
        resolve(switch, found, MAX_ATTEMPTS)
    }
}

#[test]
fn lost_after_the_journal_before_arming_the_old_agent_starts_again_at_step_3() {
    let host = Host::before_swap(OLD, false);
    assert_eq!(host.resolve(&switch(1)), Resolution::Restart { attempt: 2 });
}

#[test]
fn lost_after_arming_before_the_swap_the_old_agent_disarms_and_starts_again() {
    let host = Host::before_swap(OLD, true);
    assert_eq!(host.resolve(&switch(1)), Resolution::Restart { attempt: 2 });
}

#[test]
fn lost_after_the_swap_the_new_agent_confirms_what_was_ordered() {
    assert_eq!(
        Host::after_swap(NEW, true).resolve(&switch(1)),
        Resolution::Confirm
    );
}

#[test]
fn lost_after_the_swap_before_the_refresh_the_old_agent_finishes_step_4() {
    // The old image was still merged when PID 1 restarted the agent.
    assert_eq!(
        Host::after_swap(OLD, true).resolve(&switch(1)),
        Resolution::ContinueSwitch
    );
}

#[test]
fn lost_after_disarming_before_the_journal_commit_the_new_agent_confirms_again() {
    // 7a: pending.json is gone; the new agent re-checks 5-6 and commits.
    assert_eq!(
        Host::after_swap(NEW, false).resolve(&switch(1)),
        Resolution::Confirm
    );
}

#[test]
fn the_old_agent_with_the_link_swapped_but_no_guard_arms_again() {
    // Never left so by the protocol (the guard is armed before the swap and removed only by
    // a confirming new agent); a switch without its guard starts over rather than go on.
    assert_eq!(
        Host::after_swap(OLD, false).resolve(&switch(1)),
        Resolution::Restart { attempt: 2 }
    );
}

#[test]
fn restored_by_the_guard_the_old_agent_reports_its_reason() {
    let record = RolledBack {
        reason: "AgentNotConfirmed".into(),
        message: "agent 0.2.0 did not confirm itself by its deadline".into(),
    };
    let mut host = Host::before_swap(OLD, false);
    host.rolled_back = Some(record.clone());
    assert_eq!(
        host.resolve(&switch(1)),
        Resolution::ReportRolledBack(record.clone())
    );
    // The guard removes pending.json last: killed before that, it redoes the restore
    // (idempotent), and the old agent reports all the same.
    host.armed = true;
    assert_eq!(
        host.resolve(&switch(3)),
        Resolution::ReportRolledBack(record)
    );
}

#[test]
fn the_new_agent_confirms_nothing_it_was_not_ordered_to_be() {
    /// A change that makes the new agent not what was ordered, and a word its reason says.
    type Spoil = fn(&mut Host);
    let cases: [(Spoil, &str); 3] = [
        (|h| h.link = None, "nothing"),
        (|h| h.link = Some("/opt/other.raw".into()), "/opt/other.raw"),
        (|h| h.link_sha256 = Some("c".repeat(64)), "does not hash"),
    ];
    for (spoil, why_word) in cases {
        let mut host = Host::after_swap(NEW, true);
        spoil(&mut host);
        match host.resolve(&switch(1)) {
            Resolution::AwaitGuard(why) => assert!(why.contains(why_word), "{why}"),
            other => panic!("{why_word}: {other:?}"),
        }
    }
    // A version that is neither the old nor the expected one is no new agent: it does what
    // an old one would.
    assert_eq!(
        Host::after_swap("0.3.0", true).resolve(&switch(1)),
        Resolution::ContinueSwitch
    );
}

#[test]
fn attempts_are_bounded_like_any_activation() {
    let host = Host::before_swap(OLD, true);
    assert_eq!(host.resolve(&switch(MAX_ATTEMPTS)), Resolution::GiveUp);
    // The bound never stops a switch whose new agent already runs, nor a rollback's report.
    assert_eq!(
        Host::after_swap(NEW, false).resolve(&switch(MAX_ATTEMPTS)),
        Resolution::Confirm
    );
}

/// The race at the deadline: the guard renamed `pending.json` to `restoring.json` before the
/// new agent removed it. Neither agent may act on the switch until the guard is done.
#[test]
fn once_the_guard_claimed_the_restore_neither_agent_confirms_or_swaps() {
    for running in [NEW, OLD] {
        let host = Host {
            restoring: true,
            ..Host::after_swap(running, false)
        };
        assert!(
            matches!(host.resolve(&switch(1)), Resolution::AwaitGuard(_)),
            "{running}"
        );
    }
}

/// The new agent started again after the guard recorded its restore but before the link
/// moved: it must not confirm (the guard goes on and replaces it).
#[test]
fn the_new_agent_never_confirms_over_the_guards_record() {
    let host = Host {
        rolled_back: Some(RolledBack {
            reason: "AgentNotConfirmed".into(),
            message: "restored".into(),
        }),
        ..Host::after_swap(NEW, false)
    };
    assert!(matches!(
        host.resolve(&switch(1)),
        Resolution::AwaitGuard(_)
    ));
}

/// A switch to the version that already runs (journaled by a build that did not refuse it):
/// old and new agent report the same version, so only the link tells them apart. No row may
/// wait for a guard that was never armed, and a restore is reported.
fn same_version_switch(attempt: u32) -> Switch {
    Switch {
        expected_version: OLD.into(),
        ..switch(attempt)
    }
}

#[test]
fn with_equal_versions_every_interruption_point_moves_on() {
    let switch = same_version_switch(1);
    // Before arming, and armed before the swap: this agent runs from the previous image.
    for armed in [false, true] {
        assert_eq!(
            Host::before_swap(OLD, armed).resolve(&switch),
            Resolution::Restart { attempt: 2 },
            "armed: {armed}"
        );
    }
    // After the swap (before or after the refresh, armed or disarmed by 7a): the ordered
    // image is in place and the ordered version runs.
    for armed in [true, false] {
        assert_eq!(
            Host::after_swap(OLD, armed).resolve(&switch),
            Resolution::Confirm,
            "armed: {armed}"
        );
    }
    // Out of attempts before the swap: given up, not waited on.
    assert_eq!(
        Host::before_swap(OLD, true).resolve(&same_version_switch(MAX_ATTEMPTS)),
        Resolution::GiveUp
    );
}

#[test]
fn with_equal_versions_a_restore_by_the_guard_is_reported() {
    let record = RolledBack {
        reason: "AgentNotConfirmed".into(),
        message: "agent 0.1.0 did not confirm itself by its deadline".into(),
    };
    for armed in [false, true] {
        let mut host = Host::before_swap(OLD, armed);
        host.rolled_back = Some(record.clone());
        assert_eq!(
            host.resolve(&same_version_switch(1)),
            Resolution::ReportRolledBack(record.clone())
        );
    }
    // While the guard is restoring, nobody acts.
    let host = Host {
        restoring: true,
        ..Host::after_swap(OLD, false)
    };
    assert!(matches!(
        host.resolve(&same_version_switch(1)),
        Resolution::AwaitGuard(_)
    ));
}
