use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;

use super::*;
use crate::systemd::{ExtensionClass, UnitState};

/// Armed in `boot-1`, due at `deadline` on both its clock and the wall clock.
pub(super) fn pending(deadline: u64) -> Pending {
    Pending {
        previous_image: "/opt/extensions/inplace-agent/inplace-agent-0.1.0-x86-64.raw".into(),
        next_image: "/opt/extensions/inplace-agent/inplace-agent-0.2.0-x86-64.raw".into(),
        expected_version: "0.2.0".into(),
        deadline,
        confirm_timeout: 120,
        boot_deadline: Some(BootDeadline {
            boot_id: "boot-1".into(),
            boottime: deadline,
        }),
        previous_binary_sha256: None,
    }
}

/// The clocks at `t` in `boot-1` (the wall clock agreeing; `deadline`'s tests step it).
fn at(t: u64) -> ClockReading {
    in_boot("boot-1", t)
}

fn in_boot(boot: &str, t: u64) -> ClockReading {
    ClockReading {
        boot_id: Some(boot.into()),
        boottime: Some(t),
        wall: t,
    }
}

#[test]
fn judge_table() {
    let p = pending(1_000);
    let next = p.next_image.clone();
    // (armed, link, guard started at, now, verdict)
    type Case<'a> = (
        Option<&'a Pending>,
        Option<&'a Path>,
        ClockReading,
        ClockReading,
        Verdict,
    );
    let cases: [Case; 8] = [
        (None, Some(&next), at(0), at(2_000), Verdict::Done),
        // The old agent arms before it swaps: no disarming before the deadline...
        (
            Some(&p),
            Some(&p.previous_image),
            at(0),
            at(400),
            Verdict::Wait(600),
        ),
        // ...after it, the old agent stopped before it swapped and still runs.
        (
            Some(&p),
            Some(&p.previous_image),
            at(0),
            at(2_000),
            Verdict::Disarm,
        ),
        (Some(&p), Some(&next), at(0), at(400), Verdict::Wait(600)),
        (Some(&p), Some(&next), at(0), at(1_000), Verdict::Restore),
        // A link gone altogether is no agent: restore.
        (Some(&p), None, at(0), at(1_000), Verdict::Restore),
        // After a power loss: confirm_timeout from the guard's own start.
        (
            Some(&p),
            Some(&next),
            in_boot("boot-2", 5_000),
            in_boot("boot-2", 5_050),
            Verdict::Wait(70),
        ),
        (
            Some(&p),
            Some(&next),
            in_boot("boot-2", 5_000),
            in_boot("boot-2", 5_120),
            Verdict::Restore,
        ),
    ];
    for (i, (pending, link, started, now, want)) in cases.into_iter().enumerate() {
        assert_eq!(judge(pending, link, &started, &now), want, "case {i}");
    }
}

/// PID 1 as the guard sees it: records each call in order.
#[derive(Default)]
struct RecordingSystemd {
    calls: Mutex<Vec<String>>,
}

#[async_trait]
impl SystemdManager for RecordingSystemd {
    async fn restart_unit(&self, unit: &str) -> Result<(), SystemdError> {
        self.calls.lock().unwrap().push(format!("restart {unit}"));
        Ok(())
    }
    async fn refresh_extensions(&self, class: ExtensionClass) -> Result<(), SystemdError> {
        assert_eq!(
            class,
            ExtensionClass::Sysext,
            "the agent is a system extension"
        );
        self.calls.lock().unwrap().push("refresh".into());
        Ok(())
    }
    async fn version(&self) -> Result<u32, SystemdError> {
        unreachable!("the guard never asks for systemd's version")
    }
    async fn unmerge_extensions(&self, class: ExtensionClass) -> Result<(), SystemdError> {
        unreachable!("the guard never unmerges {class:?}")
    }
    async fn daemon_reload(&self) -> Result<(), SystemdError> {
        self.calls.lock().unwrap().push("daemon-reload".into());
        Ok(())
    }
    async fn chown(&self, paths: &[PathBuf], _uid: u32, _gid: u32) -> Result<(), SystemdError> {
        unreachable!("the guard never changes an owner ({paths:?})")
    }
    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        self.calls.lock().unwrap().push(format!("state {unit}"));
        Ok(UnitState {
            active_state: "activating".into(),
            sub_state: "auto-restart".into(),
            n_restarts: Some(7),
            active_enter_monotonic: 0,
            active_enter_realtime: 0,
            invocation_id: String::new(),
        })
    }
}

struct Node {
    _dir: tempfile::TempDir,
    paths: GuardPaths,
    pending: Pending,
}

/// A node mid-switch: the link already names the next image, the guard armed.
fn switched_node(deadline: u64) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("opt/extensions/inplace-agent");
    std::fs::create_dir_all(&images).unwrap();
    let mut pending = pending(deadline);
    pending.previous_image = images.join("inplace-agent-0.1.0-x86-64.raw");
    pending.next_image = images.join("inplace-agent-0.2.0-x86-64.raw");
    let paths = GuardPaths::new(
        &dir.path().join("var/lib/inplace"),
        &dir.path().join("etc/extensions"),
    );
    links::swap_symlink(&paths.extension_link, &pending.next_image).unwrap();
    arm(&paths, &pending).unwrap();
    Node {
        _dir: dir,
        paths,
        pending,
    }
}

#[tokio::test(start_paused = true)]
async fn an_unconfirmed_agent_is_replaced_by_the_previous_one_at_the_deadline() {
    let node = switched_node(100);
    let systemd = RecordingSystemd::default();
    let clock = AtomicU64::new(0);
    let now = || at(clock.fetch_add(10, Ordering::SeqCst));
    assert_eq!(
        guard(&node.paths, &systemd, &now).await.unwrap(),
        Verdict::Restore
    );

    assert_eq!(
        std::fs::read_link(&node.paths.extension_link).unwrap(),
        node.pending.previous_image
    );
    assert_eq!(
        *systemd.calls.lock().unwrap(),
        [
            "state inplace-agent.service",
            "refresh",
            "daemon-reload",
            "restart inplace-agent.service"
        ]
    );
    let record: RolledBack =
        serde_json::from_slice(&std::fs::read(&node.paths.rolled_back).unwrap()).unwrap();
    assert_eq!(record.reason, "AgentNotConfirmed");
    assert!(
        record.message.contains("agent 0.2.0")
            && record.message.contains("auto-restart")
            && record.message.contains("restarted 7 times"),
        "{}",
        record.message
    );
    assert!(
        !node.paths.pending.exists() && !node.paths.restoring.exists(),
        "disarmed last"
    );
}

#[tokio::test(start_paused = true)]
async fn a_confirmed_agent_is_left_alone() {
    let node = switched_node(1_000);
    let systemd = RecordingSystemd::default();
    let clock = AtomicU64::new(0);
    let pending_file = node.paths.pending.clone();
    let now = || {
        // The new agent confirms while the guard waits.
        if clock.fetch_add(10, Ordering::SeqCst) == 50 {
            std::fs::remove_file(&pending_file).unwrap();
        }
        at(clock.load(Ordering::SeqCst))
    };
    assert_eq!(
        guard(&node.paths, &systemd, &now).await.unwrap(),
        Verdict::Done
    );
    assert_eq!(
        std::fs::read_link(&node.paths.extension_link).unwrap(),
        node.pending.next_image
    );
    assert!(systemd.calls.lock().unwrap().is_empty());
    assert!(!node.paths.rolled_back.exists());
}

#[tokio::test(start_paused = true)]
async fn a_switch_that_never_swapped_is_disarmed_without_touching_the_agent() {
    let node = switched_node(1_000);
    links::swap_symlink(&node.paths.extension_link, &node.pending.previous_image).unwrap();
    let systemd = RecordingSystemd::default();
    let clock = AtomicU64::new(0);
    let now = || at(clock.fetch_add(100, Ordering::SeqCst));
    assert_eq!(
        guard(&node.paths, &systemd, &now).await.unwrap(),
        Verdict::Disarm
    );
    assert!(!node.paths.pending.exists());
    assert!(systemd.calls.lock().unwrap().is_empty());
}

/// The power-loss table's last row: a guard killed after it claimed the restore, recorded
/// the rollback and re-pointed the link, before it restarted the agent, runs again from
/// `restoring.json` and finishes the restore. (At c782c45 a guard restarted with the link
/// already back disarmed as if the switch had never swapped: the new agent kept running
/// unconfirmed and nothing restarted the old one.)
#[tokio::test(start_paused = true)]
async fn a_guard_killed_mid_restore_finishes_it_when_it_runs_again() {
    let node = switched_node(100);
    assert!(claim_restore(&node.paths).unwrap().is_some());
    let record = RolledBack {
        reason: "AgentNotConfirmed".into(),
        message: "agent 0.2.0 did not confirm itself by its deadline".into(),
    };
    links::write_atomically(
        &node.paths.rolled_back,
        &serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();
    links::swap_symlink(&node.paths.extension_link, &node.pending.previous_image).unwrap();
    let systemd = RecordingSystemd::default();
    let clock = AtomicU64::new(0);
    let now = || at(clock.fetch_add(100, Ordering::SeqCst));
    assert_eq!(
        guard(&node.paths, &systemd, &now).await.unwrap(),
        Verdict::Restore
    );
    assert!(
        systemd
            .calls
            .lock()
            .unwrap()
            .contains(&"restart inplace-agent.service".to_owned()),
        "{:?}",
        systemd.calls.lock().unwrap()
    );
    let kept: RolledBack =
        serde_json::from_slice(&std::fs::read(&node.paths.rolled_back).unwrap()).unwrap();
    assert_eq!(kept, record, "the first record stays");
    assert!(!node.paths.pending.exists() && !node.paths.restoring.exists());
}

/// The race at the deadline, new agent first: it removed `pending.json`, so it may commit,
/// and the guard that looks a moment later finds nothing to restore.
#[test]
fn at_the_deadline_a_new_agent_that_confirms_first_keeps_the_node() {
    let node = switched_node(100);
    assert!(claim_confirmation(&node.paths).unwrap());
    assert_eq!(claim_restore(&node.paths).unwrap(), None);
    assert!(!node.paths.restoring.exists());
    // After a power loss (7a), the new agent confirms again: nothing was claimed.
    assert!(claim_confirmation(&node.paths).unwrap());
}

/// The race at the deadline, guard first: it renamed `pending.json`, so the new agent must
/// not commit, even after a restart, until the guard is done.
#[test]
fn at_the_deadline_a_guard_that_claims_first_keeps_the_new_agent_from_committing() {
    let node = switched_node(100);
    assert_eq!(
        claim_restore(&node.paths).unwrap(),
        Some(node.pending.clone())
    );
    assert!(!claim_confirmation(&node.paths).unwrap());
    assert!(
        !claim_confirmation(&node.paths).unwrap(),
        "nor when it asks again"
    );
    let observed = host::Observed::read(&node.paths).unwrap();
    assert!(observed.restoring && !observed.armed);
}

#[tokio::test]
async fn an_unreadable_pending_file_is_an_error_naming_it() {
    let node = switched_node(1_000);
    std::fs::write(&node.paths.pending, b"{not json").unwrap();
    let systemd = RecordingSystemd::default();
    let err = guard(&node.paths, &systemd, &|| at(0)).await.unwrap_err();
    assert!(err.to_string().contains("pending.json"), "{err}");
    assert!(systemd.calls.lock().unwrap().is_empty());
}

#[test]
fn the_previous_binary_is_kept_executable_with_its_sha256() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("inplace-agent");
    std::fs::write(&exe, b"#!/bin/true\nan agent build").unwrap();
    let kept = dir.path().join("state/self-update/previous/inplace-agent");
    let sha256 = host::keep_previous_binary(&exe, &kept).unwrap();
    assert_eq!(std::fs::read(&kept).unwrap(), std::fs::read(&exe).unwrap());
    assert_eq!(sha256, crate::store::hash_file(&kept).unwrap());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777,
        0o755
    );
    let names: Vec<_> = std::fs::read_dir(kept.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["inplace-agent"], "no temporary file left");
}

#[tokio::test]
async fn the_swap_repoints_the_link_then_refreshes_reloads_and_restarts_the_agent() {
    let node = switched_node(1_000);
    links::swap_symlink(&node.paths.extension_link, &node.pending.previous_image).unwrap();
    let systemd = RecordingSystemd::default();
    host::swap_to(&node.paths, &node.pending.next_image, &systemd, || {})
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_link(&node.paths.extension_link).unwrap(),
        node.pending.next_image
    );
    assert_eq!(
        *systemd.calls.lock().unwrap(),
        ["refresh", "daemon-reload", "restart inplace-agent.service"]
    );
}

/// The guard's restore, then what the old agent finds and decides at its start: the
/// rollback with the guard's reason; once reported, the record is gone.
#[tokio::test(start_paused = true)]
async fn after_the_guards_restore_the_old_agent_finds_and_reports_it() {
    let node = switched_node(100);
    let switch = resume::Switch {
        previous_image: node.pending.previous_image.clone(),
        next_image: node.pending.next_image.clone(),
        next_sha256: "b".repeat(64),
        expected_version: node.pending.expected_version.clone(),
        previous_version: Some("0.1.0".into()),
        attempt: 1,
    };
    std::fs::write(&node.pending.next_image, b"the new image").unwrap();
    let before = host::Observed::read(&node.paths).unwrap();
    assert!(before.armed && before.rolled_back.is_none());
    assert_eq!(
        before.link.as_deref(),
        Some(node.pending.next_image.as_path())
    );
    assert_eq!(
        before.link_sha256,
        Some(crate::store::hash_file(&node.pending.next_image).unwrap())
    );

    let systemd = RecordingSystemd::default();
    let clock = AtomicU64::new(0);
    let now = || at(clock.fetch_add(10, Ordering::SeqCst));
    guard(&node.paths, &systemd, &now).await.unwrap();

    let after = host::Observed::read(&node.paths).unwrap();
    assert!(!after.armed);
    assert_eq!(
        after.link.as_deref(),
        Some(node.pending.previous_image.as_path())
    );
    match resume::resolve(&switch, after.found("0.1.0"), 3) {
        resume::Resolution::ReportRolledBack(record) => {
            assert_eq!(record.reason, "AgentNotConfirmed");
        }
        other => panic!("{other:?}"),
    }
    host::forget_rolled_back(&node.paths).unwrap();
    assert!(
        host::Observed::read(&node.paths)
            .unwrap()
            .rolled_back
            .is_none()
    );
}
