use super::*;
use chrono::Utc;
use inplace_proto::validate::FieldError;

fn content(tag: &str) -> UpdateContent {
    serde_json::from_value(serde_json::json!({
        "artifacts": [{"name": "k", "type": "Sysext", "url": format!("https://x/{tag}.raw"),
                       "sha256": "0".repeat(64)}]
    }))
    .unwrap()
}

fn plan(tag: &str, desired: DesiredState) -> PlanView {
    let content = content(tag);
    PlanView {
        generation: Some(1),
        revision: inplace_proto::revision_of(&content),
        desired,
        allow_downgrade: false,
        content,
        problems: None,
        retry: None,
        agent_running: false,
    }
}

fn in_flight(p: &PlanView, step: Step) -> Journal {
    crate::journal::tests::at_step(&p.revision, &p.content, step)
}

fn committed(p: &PlanView) -> Journal {
    let mut j = in_flight(p, Step::Verifying);
    j.commit(Utc::now()).unwrap();
    j
}

fn failure(reason: Reason) -> Failure {
    Failure {
        reason,
        message: "m".into(),
    }
}

#[test]
fn no_plan_is_idle() {
    assert_eq!(decide(None, &Journal::default(), 3), Action::Idle);
}

#[test]
fn new_revision_is_staged_then_activated_when_asked() {
    let j = Journal::default();
    let staged = plan("a", DesiredState::Staged);
    assert_eq!(
        decide(Some(&staged), &j, 3),
        Action::Stage { activate: false }
    );
    let active = plan("a", DesiredState::Active);
    assert_eq!(
        decide(Some(&active), &j, 3),
        Action::Stage { activate: true }
    );
}

#[test]
fn committed_revision_is_up_to_date() {
    let p = plan("a", DesiredState::Active);
    assert_eq!(decide(Some(&p), &committed(&p), 3), Action::UpToDate);
}

/// A journal whose agent switch for `p` (staged as content) is in flight.
fn switching(p: &PlanView) -> Journal {
    let mut j = in_flight(p, Step::Staged);
    j.begin_switch(crate::self_update::resume::Switch {
        previous_image: "/opt/extensions/inplace-agent/a.raw".into(),
        next_image: "/opt/extensions/inplace-agent/b.raw".into(),
        next_sha256: "b".repeat(64),
        expected_version: "0.2.0".into(),
        previous_version: Some("0.1.0".into()),
        attempt: 1,
    })
    .unwrap();
    j
}

#[test]
fn a_confirmed_agent_switch_is_up_to_date_and_the_content_chain_unchanged() {
    let mut p = plan("agent", DesiredState::Active);
    let mut j = switching(&p);
    j.confirm_switch(Utc::now()).unwrap();
    assert_eq!(j.current_revision(), None);
    // The switch's record alone is not enough: its build must be the one that runs.
    assert_eq!(decide(Some(&p), &j, 3), Action::Stage { activate: true });
    p.agent_running = true;
    assert_eq!(decide(Some(&p), &j, 3), Action::UpToDate);
    assert_eq!(
        decide(Some(&p), &Journal::default(), 3),
        Action::UpToDate,
        "nor is a record needed when the plan asks for the build that runs"
    );
}

#[test]
fn an_agent_switch_in_flight_is_resumed_whatever_the_plan_says() {
    let p = plan("agent", DesiredState::Active);
    let journal = switching(&p);
    let mut other = plan("other", DesiredState::Staged);
    other.problems = Some(Problems(Vec::new()));
    for plan in [Some(&p), Some(&other), None] {
        assert_eq!(decide(plan, &journal, 3), Action::ResumeSwitch);
    }
}

#[test]
fn invalid_plan_is_refused_before_anything_else() {
    let mut p = plan("a", DesiredState::Active);
    let problems = Problems(vec![FieldError {
        path: "spec.artifacts[0].sha256".into(),
        reason: Reason::InvalidPlan,
        message: "bad".into(),
    }]);
    p.problems = Some(problems.clone());
    assert_eq!(
        decide(Some(&p), &Journal::default(), 3),
        Action::Refuse(problems)
    );
}

#[test]
fn failed_revision_is_denied_until_the_plan_changes() {
    let p = plan("a", DesiredState::Active);
    let mut j = in_flight(&p, Step::Staging);
    j.deny(failure(Reason::UnitFailed), Utc::now()).unwrap();
    assert!(matches!(decide(Some(&p), &j, 3), Action::Deny(_)));
    let other = plan("b", DesiredState::Active);
    assert_eq!(
        decide(Some(&other), &j, 3),
        Action::Stage { activate: true }
    );
}

#[test]
fn a_retry_token_is_honoured_once_and_only_while_the_plan_asks_for_staged() {
    let with = |desired, token: Option<&str>| PlanView {
        retry: token.map(str::to_owned),
        ..plan("a", desired)
    };
    let mut honoured = Journal::default();
    honoured.honour_retry("t1", "a");
    let cases = [
        // (plan's desired state, plan's token, journal, to honour)
        (DesiredState::Staged, None, Journal::default(), None),
        (
            DesiredState::Staged,
            Some("t1"),
            Journal::default(),
            Some("t1"),
        ),
        // The controller has not moved the failed node back to Staged yet.
        (DesiredState::Active, Some("t1"), Journal::default(), None),
        (DesiredState::Staged, Some("t1"), honoured.clone(), None),
        (DesiredState::Staged, Some("t2"), honoured, Some("t2")),
    ];
    for (desired, token, journal, want) in cases {
        let p = with(desired, token);
        assert_eq!(
            retry_to_honour(Some(&p), &journal),
            want,
            "{desired:?} {token:?} {:?}",
            journal.retry_honoured()
        );
    }
    assert_eq!(retry_to_honour(None, &Journal::default()), None);
}

#[test]
fn an_honoured_retry_stages_the_failed_revision_again() {
    let p = PlanView {
        retry: Some("t1".into()),
        ..plan("a", DesiredState::Staged)
    };
    let mut j = in_flight(&p, Step::Staging);
    j.deny(failure(Reason::HashMismatch), Utc::now()).unwrap();
    assert!(matches!(decide(Some(&p), &j, 3), Action::Deny(_)));
    let token = retry_to_honour(Some(&p), &j).unwrap().to_owned();
    j.honour_retry(&token, &p.revision);
    assert_eq!(decide(Some(&p), &j, 3), Action::Stage { activate: false });
    assert_eq!(retry_to_honour(Some(&p), &j), None);
}

#[test]
fn degraded_node_does_nothing() {
    let p = plan("a", DesiredState::Active);
    let mut j = Journal::default();
    j.mark_degraded(failure(Reason::RollbackFailed));
    assert!(matches!(decide(Some(&p), &j, 3), Action::StayDegraded(_)));
    assert!(matches!(decide(None, &j, 3), Action::StayDegraded(_)));
}

#[test]
fn crash_during_staging_restages() {
    let p = plan("a", DesiredState::Active);
    for step in [Step::Staging, Step::Staged] {
        let j = in_flight(&p, step);
        assert_eq!(decide(Some(&p), &j, 3), Action::Stage { activate: true });
        assert!(!staging_is_stale(Some(&p), &j));
        assert!(staging_is_stale(None, &j));
        assert!(staging_is_stale(Some(&plan("b", DesiredState::Active)), &j));
    }
}

#[test]
fn crash_during_activation_resumes_then_gives_up() {
    let p = plan("a", DesiredState::Active);
    for step in [Step::Activating, Step::Verifying] {
        let mut j = in_flight(&p, step);
        assert_eq!(j.attempts(&p.revision), Some(1));
        assert_eq!(decide(Some(&p), &j, 3), Action::ResumeActivation);
        j.count_attempt().unwrap();
        j.count_attempt().unwrap();
        match decide(Some(&p), &j, 3) {
            Action::RollBack(RollbackCause::Failed(f)) => {
                assert_eq!(f.reason, Reason::TooManyAttempts)
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn plan_changed_or_deleted_mid_activation_rolls_back_first() {
    let p = plan("a", DesiredState::Active);
    let j = in_flight(&p, Step::Activating);
    let superseded = Action::RollBack(RollbackCause::Superseded);
    assert_eq!(decide(None, &j, 3), superseded);
    assert_eq!(
        decide(Some(&plan("b", DesiredState::Active)), &j, 3),
        superseded
    );
    assert_eq!(
        decide(Some(&plan("a", DesiredState::Staged)), &j, 3),
        superseded
    );
    assert!(!staging_is_stale(None, &j));
}

#[test]
fn crash_during_rollback_finishes_it() {
    let p = plan("a", DesiredState::Active);
    let j = in_flight(&p, Step::RollingBack);
    // Whatever the plan says now.
    for view in [None, Some(&p)] {
        match decide(view, &j, 3) {
            Action::RollBack(RollbackCause::Failed(f)) => {
                assert_eq!(f.reason, Reason::HealthCheckFailed)
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_journaled_reboot_is_seen_through_and_its_rollback_finished_whatever_the_plan() {
    let p = plan("a", DesiredState::Active);
    let mut j = in_flight(&p, Step::Activating);
    j.rebooting("boot-1").unwrap();
    for view in [None, Some(&p), Some(&plan("b", DesiredState::Active))] {
        assert_eq!(decide(view, &j, 1), Action::ResumeReboot);
    }
    // Booted: verified like any activation (superseded when the plan moved on).
    j.rebooted().unwrap();
    assert_eq!(decide(Some(&p), &j, 3), Action::ResumeActivation);
    assert_eq!(
        decide(None, &j, 3),
        Action::RollBack(RollbackCause::Superseded)
    );
    j.rolling_back(Some(failure(Reason::HealthCheckFailed)))
        .unwrap();
    j.rebooting_back("boot-2").unwrap();
    for view in [None, Some(&p)] {
        assert_eq!(
            decide(view, &j, 3),
            Action::RollBack(RollbackCause::Failed(failure(Reason::HealthCheckFailed)))
        );
    }
}

#[test]
fn a_lower_kubernetes_version_is_refused_unless_allowed() {
    let versioned = |tag: &str, version: Option<&str>| {
        let mut p = plan(tag, DesiredState::Active);
        p.content.kubernetes_version = version.map(str::to_owned);
        p.revision = inplace_proto::revision_of(&p.content);
        p
    };
    let j = committed(&versioned("a", Some("v1.31.2")));
    let mut older = versioned("b", Some("v1.30.9"));
    match decide(Some(&older), &j, 3) {
        Action::Refuse(problems) => {
            assert_eq!(problems.reason(), Reason::DowngradeDenied);
            assert!(problems.has("spec.kubernetesVersion"), "{problems}");
            let text = problems.to_string();
            assert!(
                text.contains("v1.30.9") && text.contains("v1.31.2"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    older.allow_downgrade = true;
    assert_eq!(
        decide(Some(&older), &j, 3),
        Action::Stage { activate: true }
    );
    for newer_or_unversioned in [
        versioned("c", Some("v1.31.2")),
        versioned("d", Some("v1.32.0")),
        versioned("e", None),
    ] {
        assert_eq!(
            decide(Some(&newer_or_unversioned), &j, 3),
            Action::Stage { activate: true }
        );
    }
    // Nothing committed yet (or committed without a version): nothing to compare.
    let older = versioned("b", Some("v1.30.9"));
    assert_eq!(
        decide(Some(&older), &Journal::default(), 3),
        Action::Stage { activate: true }
    );
    let j = committed(&versioned("a", None));
    assert_eq!(
        decide(Some(&older), &j, 3),
        Action::Stage { activate: true }
    );
}
