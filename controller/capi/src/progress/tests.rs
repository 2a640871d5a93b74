use super::*;
use crate::catalog::tests::release;
use inplace_proto::{ArtifactProgress, NodeUpdatePlanSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const NODE: &str = "w-1";
const RELEASE: &str = "kubernetes-v1.31.2";

fn plan(desired: DesiredState) -> (NodeUpdatePlan, String) {
    let rel = release(RELEASE, "v1.31.2");
    let spec = NodeUpdatePlanSpec::for_release(NODE, RELEASE, &rel.spec, desired);
    let revision = spec.revision.clone().unwrap();
    let mut plan = NodeUpdatePlan::new(NODE, spec);
    plan.metadata.generation = Some(2);
    (plan, revision)
}

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: Some(2),
    }
}

fn with_status(
    mut plan: NodeUpdatePlan,
    revision: &str,
    phase: Phase,
    edit: impl FnOnce(&mut NodeUpdatePlanStatus),
) -> NodeUpdatePlan {
    let mut status = NodeUpdatePlanStatus {
        observed_generation: Some(2),
        phase: Some(phase),
        current_revision: Some("oldrev".into()),
        target_revision: Some(revision.to_owned()),
        ..Default::default()
    };
    edit(&mut status);
    plan.status = Some(status);
    plan
}

#[test]
fn no_status_yet_is_in_progress_waiting_for_the_agent() {
    let (p, rev) = plan(DesiredState::Active);
    let a = answer(NODE, RELEASE, &rev, &p);
    assert!(
        matches!(&a, Answer::InProgress(m) if m.contains("waiting for the inplace agent")),
        "{a:?}"
    );
}

#[test]
fn a_status_about_an_older_generation_or_revision_is_not_trusted() {
    let (p, rev) = plan(DesiredState::Active);
    let stale = with_status(p.clone(), &rev, Phase::Failed, |s| {
        s.observed_generation = Some(1)
    });
    assert!(matches!(
        answer(NODE, RELEASE, &rev, &stale),
        Answer::InProgress(_)
    ));
    let other = with_status(p, "otherrev", Phase::RolledBack, |_| {});
    assert!(matches!(
        answer(NODE, RELEASE, &rev, &other),
        Answer::InProgress(_)
    ));
}

#[test]
fn downloading_reports_a_percentage_of_bytes() {
    let (p, rev) = plan(DesiredState::Active);
    let p = with_status(p, &rev, Phase::Downloading, |s| {
        s.artifacts = vec![ArtifactProgress {
            name: "kubernetes".into(),
            bytes_done: 520,
            bytes_total: Some(1000),
            source: None,
        }];
    });
    let a = answer(NODE, RELEASE, &rev, &p);
    assert!(
        matches!(&a, Answer::InProgress(m) if m.starts_with("node w-1: Downloading 52% (")),
        "{a:?}"
    );
}

#[test]
fn downloading_falls_back_to_the_plan_size_then_the_progress_line() {
    let (p, rev) = plan(DesiredState::Active);
    let sized = with_status(p.clone(), &rev, Phase::Downloading, |s| {
        s.artifacts = vec![ArtifactProgress {
            name: "kubernetes".into(),
            bytes_done: 250,
            bytes_total: None,
            source: None,
        }];
    });
    assert!(
        answer(NODE, RELEASE, &rev, &sized)
            .message()
            .contains("25%")
    );
    let mut unsized_plan = p;
    unsized_plan.spec.content.artifacts[0].size = None;
    let line = with_status(unsized_plan, &rev, Phase::Downloading, |s| {
        s.progress = Some("kubernetes 3 MiB".into());
    });
    assert_eq!(
        answer(NODE, RELEASE, &rev, &line).message(),
        "node w-1: Downloading kubernetes 3 MiB"
    );
}

#[test]
fn verifying_quotes_the_ready_condition() {
    let (p, rev) = plan(DesiredState::Active);
    let p = with_status(p, &rev, Phase::Verifying, |s| {
        s.conditions = vec![cond(
            "Ready",
            "False",
            "Verifying",
            "kubelet.service 12s/30s",
        )];
    });
    assert_eq!(
        answer(NODE, RELEASE, &rev, &p),
        Answer::InProgress("node w-1: Verifying kubelet.service 12s/30s".into())
    );
}

#[test]
fn every_working_phase_is_in_progress() {
    let (p, rev) = plan(DesiredState::Active);
    for phase in [
        Phase::Pending,
        Phase::Staged,
        Phase::Activating,
        Phase::RollingBack,
    ] {
        let p = with_status(p.clone(), &rev, phase, |_| {});
        assert!(
            matches!(answer(NODE, RELEASE, &rev, &p), Answer::InProgress(_)),
            "{phase:?}"
        );
    }
    let (staged, rev) = plan(DesiredState::Staged);
    let staged = with_status(staged, &rev, Phase::Staged, |_| {});
    assert!(
        answer(NODE, RELEASE, &rev, &staged)
            .message()
            .contains("waiting to activate")
    );
}

#[test]
fn a_succeeded_report_for_the_revision_is_done_as_everywhere_else() {
    // Phase Succeeded means committed (proto's Outcome), even before currentRevision
    // says so; this extension used to wait for currentRevision as well.
    let (p, rev) = plan(DesiredState::Active);
    let p = with_status(p, &rev, Phase::Succeeded, |_| {});
    assert!(matches!(answer(NODE, RELEASE, &rev, &p), Answer::Done(_)));
}

#[test]
fn a_degraded_node_that_runs_the_revision_has_failed() {
    let (p, rev) = plan(DesiredState::Active);
    let p = with_status(p, &rev, Phase::Failed, |s| {
        s.current_revision = Some(rev.clone());
        s.conditions = vec![cond("Degraded", "True", "RollbackFailed", "needs a person")];
    });
    assert!(matches!(answer(NODE, RELEASE, &rev, &p), Answer::Failed(_)));
    assert_eq!(
        next_step(Some(&p), &rev, true),
        NextStep::Write(DesiredState::Active)
    );
}

#[test]
fn succeeded_on_the_revision_is_done() {
    let (p, rev) = plan(DesiredState::Active);
    let p = with_status(p, &rev, Phase::Succeeded, |s| {
        s.current_revision = Some(rev.clone())
    });
    let a = answer(NODE, RELEASE, &rev, &p);
    assert!(
        matches!(&a, Answer::Done(m) if m.contains(RELEASE)),
        "{a:?}"
    );
    let response = a.into_response(5);
    assert_eq!(response.status, ResponseStatus::Success);
    assert_eq!(response.retry_after_seconds, 0);
}

#[test]
fn rolled_back_is_a_failure_with_the_reason_and_message() {
    let (p, rev) = plan(DesiredState::Active);
    let p = with_status(p, &rev, Phase::RolledBack, |s| {
        s.conditions = vec![
            cond(
                "Ready",
                "False",
                "HealthCheckFailed",
                "kubelet.service restarted 3 times",
            ),
            cond("Degraded", "False", "AsExpected", ""),
        ];
    });
    let a = answer(NODE, RELEASE, &rev, &p);
    assert_eq!(
        a,
        Answer::Failed(
            "node w-1 rolled back from kubernetes-v1.31.2 to revision oldrev: HealthCheckFailed: kubelet.service restarted 3 times".into()
        )
    );
    let response = a.into_response(5);
    assert_eq!(response.status, ResponseStatus::Failure);
}

#[test]
fn failed_names_a_degraded_condition_too() {
    let (p, rev) = plan(DesiredState::Active);
    let p = with_status(p, &rev, Phase::Failed, |s| {
        s.conditions = vec![
            cond(
                "Ready",
                "False",
                "RollbackFailed",
                "kubelet.service failed on the old revision",
            ),
            cond("Degraded", "True", "RollbackFailed", "needs a person"),
        ];
    });
    let message = answer(NODE, RELEASE, &rev, &p).message().to_owned();
    assert!(
        message.contains("RollbackFailed: kubelet.service failed"),
        "{message}"
    );
    assert!(
        message.contains("Degraded: RollbackFailed: needs a person"),
        "{message}"
    );
    let bare = with_status(plan(DesiredState::Active).0, &rev, Phase::Failed, |_| {});
    assert!(
        answer(NODE, RELEASE, &rev, &bare)
            .message()
            .contains("no reason reported")
    );
}

#[test]
fn in_progress_always_asks_again_after_at_least_a_second() {
    assert_eq!(
        Answer::InProgress("x".into())
            .into_response(0)
            .retry_after_seconds,
        1
    );
    assert_eq!(
        Answer::InProgress("x".into())
            .into_response(7)
            .retry_after_seconds,
        7
    );
}

#[test]
fn without_drain_the_plan_goes_straight_to_active() {
    assert_eq!(
        next_step(None, "r", false),
        NextStep::Write(DesiredState::Active)
    );
}

#[test]
fn with_drain_the_plan_stays_staged_until_staged_then_drains_then_stays_active() {
    let (p, rev) = plan(DesiredState::Staged);
    assert_eq!(
        next_step(None, &rev, true),
        NextStep::Write(DesiredState::Staged)
    );
    assert_eq!(
        next_step(Some(&p), &rev, true),
        NextStep::Write(DesiredState::Staged)
    );
    let downloading = with_status(p.clone(), &rev, Phase::Downloading, |_| {});
    assert_eq!(
        next_step(Some(&downloading), &rev, true),
        NextStep::Write(DesiredState::Staged)
    );
    let staged = with_status(p.clone(), &rev, Phase::Staged, |_| {});
    assert_eq!(next_step(Some(&staged), &rev, true), NextStep::Drain);
    let stale = with_status(p, &rev, Phase::Staged, |s| s.observed_generation = Some(1));
    assert_eq!(
        next_step(Some(&stale), &rev, true),
        NextStep::Write(DesiredState::Staged)
    );
    let (active, rev) = plan(DesiredState::Active);
    assert_eq!(
        next_step(Some(&active), &rev, true),
        NextStep::Write(DesiredState::Active)
    );
}

#[test]
fn with_drain_a_plan_for_another_revision_starts_over_staged() {
    let (active, _) = plan(DesiredState::Active);
    assert_eq!(
        next_step(Some(&active), "newrev", true),
        NextStep::Write(DesiredState::Staged)
    );
}

#[test]
fn a_node_already_on_the_revision_is_not_drained() {
    let (p, rev) = plan(DesiredState::Staged);
    let there = with_status(p, &rev, Phase::Succeeded, |s| {
        s.current_revision = Some(rev.clone())
    });
    assert_eq!(
        next_step(Some(&there), &rev, true),
        NextStep::Write(DesiredState::Active)
    );
}
