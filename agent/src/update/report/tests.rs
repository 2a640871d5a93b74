//! The status built from journal, plan and observation, case by case.

use super::texts::kubelet_note;
use super::*;
use crate::journal::tests::at_step;
use crate::journal::{Failure, Journal, Step};
use crate::machine::PlanView;
use chrono::Utc;
use inplace_proto::reason::plan_condition;
use inplace_proto::{
    ArtifactProgress, DesiredState, NodeUpdatePlanStatus, Phase, Reason, UpdateContent,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn view(tag: &str, desired: DesiredState, sizes: [Option<u64>; 2]) -> PlanView {
    let artifact = |name: &str, size: Option<u64>| {
        serde_json::json!({"name": name, "type": "Sysext", "url": format!("https://x/{tag}-{name}.raw"),
                           "sha256": "0".repeat(64), "size": size})
    };
    let content: UpdateContent = serde_json::from_value(serde_json::json!({
        "artifacts": [artifact("a", sizes[0]), artifact("b", sizes[1])]
    }))
    .unwrap();
    PlanView {
        generation: Some(7),
        revision: inplace_proto::revision_of(&content),
        desired,
        allow_downgrade: false,
        content,
        problems: None,
        retry: None,
        agent_running: false,
    }
}

/// What the agent shows for `view` once `done` bytes of each artifact are in.
fn shown(view: &PlanView, done: [i64; 2]) -> Shown {
    Shown {
        target: Some(view.revision.clone()),
        artifacts: view
            .content
            .artifacts
            .iter()
            .zip(done)
            .map(|(a, bytes_done)| ArtifactProgress {
                name: a.name.clone(),
                bytes_done,
                bytes_total: a.size.map(|s| s as i64),
                source: None,
            })
            .collect(),
        ..Shown::default()
    }
}

/// The status for `report`, `secs` into the test; `shown` remembers it, as the agent does.
fn status_at(
    journal: &Journal,
    view: &PlanView,
    shown: &mut Shown,
    report: &Report,
    secs: i64,
) -> NodeUpdatePlanStatus {
    let seen = Observation {
        report,
        shown,
        now: at(secs),
        boot_id: Some("boot-1"),
    };
    let status = status(journal, view, &seen);
    shown.remember(&status);
    status
}

fn condition<'a>(status: &'a NodeUpdatePlanStatus, type_: &str) -> &'a Condition {
    status.conditions.iter().find(|c| c.type_ == type_).unwrap()
}

#[test]
fn downloading_shows_the_share_of_bytes_or_the_bytes() {
    let v = view("d", DesiredState::Active, [Some(100), Some(300)]);
    let journal = at_step(&v.revision, &v.content, Step::Staging);
    let mut seen = shown(&v, [100, 100]);
    let s = status_at(&journal, &v, &mut seen, &Report::downloading(&v), 0);
    assert_eq!(s.phase, Some(Phase::Downloading));
    assert_eq!(s.progress.as_deref(), Some("50%"));
    assert_eq!(s.artifacts, seen.artifacts);
    assert_eq!(s.target_revision.as_deref(), Some(v.revision.as_str()));
    assert_eq!(s.observed_generation, Some(7));
    assert_eq!(s.current_revision, None);
    assert_eq!(s.attempts, None);
    assert_eq!(s.started_at, Some(Time(at(0))));
    assert_eq!(s.finished_at, None);
    assert_eq!(s.boot_id.as_deref(), Some("boot-1"));
    let ready = condition(&s, plan_condition::READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Downloading")
    );
    assert_eq!(ready.observed_generation, Some(7));
    let degraded = condition(&s, plan_condition::DEGRADED);
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("False", "AsExpected")
    );

    // A size unknown: only the bytes.
    let v = view("d", DesiredState::Active, [None, None]);
    let mut seen = shown(&v, [10, 32]);
    let s = status_at(&journal, &v, &mut seen, &Report::downloading(&v), 0);
    assert_eq!(s.progress.as_deref(), Some("42 bytes"));
}

#[test]
fn verifying_shows_the_health_clock_and_the_attempts() {
    let v = view("v", DesiredState::Active, [None, None]);
    let journal = at_step(&v.revision, &v.content, Step::Verifying);
    let mut seen = shown(&v, [0, 0]);
    let line = "kubelet.service healthy for 12s of 30s";
    let s = status_at(&journal, &v, &mut seen, &Report::verifying(line.into()), 3);
    assert_eq!(s.progress.as_deref(), Some(line));
    assert_eq!(s.attempts, Some(1));
    assert_eq!(condition(&s, plan_condition::READY).message, line);
}

#[test]
fn staged_is_ready_only_when_staged_is_what_the_plan_wants() {
    for (desired, ready) in [
        (DesiredState::Staged, "True"),
        (DesiredState::Active, "False"),
    ] {
        let v = view("s", desired, [None, None]);
        let journal = at_step(&v.revision, &v.content, Step::Staged);
        let mut seen = shown(&v, [0, 0]);
        let s = status_at(&journal, &v, &mut seen, &Report::staged(&v.revision), 0);
        assert_eq!(
            condition(&s, plan_condition::READY).status,
            ready,
            "{desired:?}"
        );
        assert_eq!(s.progress, None);
        // Staged is not final: the plan may still ask for activation.
        assert_eq!(s.finished_at, None);
    }
}

#[test]
fn times_start_once_and_finish_once_and_conditions_move_only_on_a_new_status() {
    let v = view("c", DesiredState::Active, [None, None]);
    let mut journal = at_step(&v.revision, &v.content, Step::Verifying);
    let mut seen = shown(&v, [0, 0]);
    let activating = status_at(
        &journal,
        &v,
        &mut seen,
        &Report::activating(&v.revision),
        10,
    );
    let verifying = status_at(&journal, &v, &mut seen, &Report::verifying("v".into()), 20);
    assert_eq!(verifying.started_at, Some(Time(at(10))));
    // A new reason under the same status keeps the transition time.
    let ready = condition(&verifying, plan_condition::READY);
    assert_eq!(
        (ready.reason.as_str(), &ready.last_transition_time),
        ("Verifying", &Time(at(10)))
    );
    assert_eq!(
        condition(&activating, plan_condition::DEGRADED).last_transition_time,
        Time(at(10))
    );

    journal.commit(Utc::now()).unwrap();
    let done = status_at(
        &journal,
        &v,
        &mut seen,
        &Report::committed(&v.revision, None),
        30,
    );
    assert_eq!(done.current_revision.as_deref(), Some(v.revision.as_str()));
    assert_eq!(done.attempts, Some(1));
    assert_eq!(
        (done.started_at.clone(), done.finished_at.clone()),
        (Some(Time(at(10))), Some(Time(at(30))))
    );
    let ready = condition(&done, plan_condition::READY);
    assert_eq!(
        (ready.status.as_str(), &ready.last_transition_time),
        ("True", &Time(at(30)))
    );
    // A later pass (a relist, a restart) keeps both times.
    let again = status_at(
        &journal,
        &v,
        &mut seen,
        &Report::up_to_date(&v.revision, None, None),
        50,
    );
    assert_eq!(again.finished_at, Some(Time(at(30))));
    assert_eq!(
        condition(&again, plan_condition::READY).last_transition_time,
        Time(at(30))
    );
    // The host drifted: Degraded moves, Ready stays.
    let drift = Report::up_to_date(
        &v.revision,
        None,
        Some("/etc/extensions/a.raw is missing".into()),
    );
    let drifted = status_at(&journal, &v, &mut seen, &drift, 60);
    let degraded = condition(&drifted, plan_condition::DEGRADED);
    assert_eq!(
        (
            degraded.status.as_str(),
            degraded.reason.as_str(),
            degraded.message.as_str(),
            &degraded.last_transition_time
        ),
        (
            "True",
            "Drifted",
            "/etc/extensions/a.raw is missing",
            &Time(at(60))
        )
    );
    assert_eq!(
        condition(&drifted, plan_condition::READY).last_transition_time,
        Time(at(30))
    );
    // Work again (not final): finished is cleared.
    let restaged = status_at(&journal, &v, &mut seen, &Report::downloading(&v), 70);
    assert_eq!(restaged.finished_at, None);
    assert_eq!(restaged.started_at, Some(Time(at(10))));
}

#[test]
fn a_rollback_shows_the_denied_revision_and_a_failed_one_degrades() {
    let v = view("r", DesiredState::Active, [None, None]);
    let failure = Failure {
        reason: Reason::HealthCheckFailed,
        message: "kubelet.service failed".into(),
    };
    let mut journal = at_step(&v.revision, &v.content, Step::Verifying);
    journal.rolling_back(Some(failure.clone())).unwrap();
    let mut seen = shown(&v, [0, 0]);
    let why = "HealthCheckFailed: kubelet.service failed";
    let s = status_at(
        &journal,
        &v,
        &mut seen,
        &Report::rolling_back(&v.revision, Some(&failure), why),
        0,
    );
    assert_eq!(
        condition(&s, plan_condition::READY).reason,
        "HealthCheckFailed"
    );
    assert!(s.finished_at.is_none());

    let mut rolled_back = journal.clone();
    rolled_back.rolled_back(Utc::now()).unwrap();
    let s = status_at(
        &rolled_back,
        &v,
        &mut seen.clone(),
        &Report::rolled_back(&v.revision, why),
        1,
    );
    assert_eq!(s.phase, Some(Phase::RolledBack));
    assert_eq!(s.failed_revisions, vec![v.revision.clone()]);
    assert_eq!(
        s.attempts, None,
        "a rolled-back revision's attempts are forgotten"
    );
    let denied = Report::denied(rolled_back.failure_of(&v.revision).unwrap());
    assert_eq!(denied.phase, Phase::RolledBack);
    assert!(denied.message.contains(why), "{}", denied.message);

    let degraded = Failure {
        reason: Reason::RollbackFailed,
        message: "kubelet did not come back".into(),
    };
    journal
        .rollback_failed(degraded.clone(), Utc::now())
        .unwrap();
    let s = status_at(
        &journal,
        &v,
        &mut seen,
        &Report::rollback_failed(degraded),
        2,
    );
    assert_eq!(s.phase, Some(Phase::Failed));
    let c = condition(&s, plan_condition::DEGRADED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("True", "RollbackFailed", "kubelet did not come back")
    );
    assert_eq!(
        Report::degraded_node(journal.degraded().unwrap().clone()).degraded,
        journal.degraded().cloned()
    );
}

#[test]
fn a_staging_failure_is_reported_and_then_denied() {
    let v = view("f", DesiredState::Active, [None, None]);
    let mut journal = at_step(&v.revision, &v.content, Step::Staging);
    let failure = Failure {
        reason: Reason::HashMismatch,
        message: "artifact a: sha256 differs".into(),
    };
    journal.deny(failure.clone(), Utc::now()).unwrap();
    let mut seen = shown(&v, [0, 0]);
    let s = status_at(&journal, &v, &mut seen, &Report::failed(failure), 0);
    let ready = condition(&s, plan_condition::READY);
    assert_eq!(
        (
            ready.status.as_str(),
            ready.reason.as_str(),
            ready.message.as_str()
        ),
        ("False", "HashMismatch", "artifact a: sha256 differs")
    );
    assert_eq!(s.failed_revisions, vec![v.revision.clone()]);
    let denied = Report::denied(journal.failure_of(&v.revision).unwrap());
    assert_eq!(
        (denied.phase, denied.reason),
        (Phase::Failed, Reason::RevisionDenied)
    );
    assert!(
        denied
            .message
            .contains("HashMismatch: artifact a: sha256 differs"),
        "{}",
        denied.message
    );
}

#[test]
fn a_kubelet_commit_says_what_the_node_checks_proved() {
    let note = |kubernetes_version: Option<&str>, version_check: bool, ready: bool| {
        let content: UpdateContent = serde_json::from_value(serde_json::json!({
            "kubernetesVersion": kubernetes_version,
            "artifacts": [{"name": "kubernetes", "type": "Sysext", "url": "https://x/k.raw",
                           "sha256": "0".repeat(64)}],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"nodeKubeletVersion": version_check, "nodeReady": ready},
        }))
        .unwrap();
        kubelet_note(&content)
    };
    let v = Some("v1.31.2");
    assert_eq!(
        note(v, true, true),
        "; the node reports kubelet v1.31.2 and Ready"
    );
    assert_eq!(note(v, true, false), "; the node reports kubelet v1.31.2");
    assert_eq!(
        note(v, false, true),
        "; kubelet version not checked: healthChecks.nodeKubeletVersion is not set; the node reports Ready"
    );
    assert_eq!(
        note(None, true, true),
        "; kubelet version not checked: the plan names no kubernetesVersion; the node reports Ready"
    );
    assert_eq!(
        note(v, false, false),
        "; kubelet version not checked: healthChecks.nodeKubeletVersion is not set"
    );
}
