//! The agent's state machine. [`decide`] is a pure function from the plan, the journal
//! and the settings to the next [`Action`]; `update/` carries actions out. The phases and
//! transitions are drawn in `docs/development/agent.md`.

use inplace_proto::validate::{FieldError, Problems};
use inplace_proto::{DesiredState, NodeUpdatePlan, Reason, UpdateContent};

use crate::journal::{FailedRevision, Failure, Journal, Step};
use crate::self_update::admission::{self, Admission};
use crate::settings::Policy;

/// What the agent needs to know about its plan, computed once per plan version.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanView {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The revision of the content (computed, never taken from the spec on trust).
    pub revision: String,
    /// How far to take it.
    pub desired: DesiredState,
    /// Whether the plan may lower the node's Kubernetes version.
    pub allow_downgrade: bool,
    /// What to install.
    pub content: UpdateContent,
    /// API validation and node policy problems; `None` when the plan may be acted on.
    pub problems: Option<Problems>,
    /// The retry token a person set on the plan (`inplace.dev/retry`), if any.
    pub retry: Option<String>,
    /// Whether the plan asks for the agent build that runs (`spec.agent.version` is this
    /// build's): then it is up to date, with or without a switch behind it.
    pub agent_running: bool,
}

impl PlanView {
    /// Validates `plan` (API rules, then this node's policy, then whether it may replace
    /// the agent) without any I/O.
    pub fn new(plan: &NodeUpdatePlan, policy: &Policy, self_update: &Admission) -> PlanView {
        let mut problems = plan.validate().err().map(|p| p.0).unwrap_or_default();
        if let Err(more) = crate::policy::check(&plan.spec.content, policy) {
            problems.extend(more.0);
        }
        problems.extend(admission::check(&plan.spec.content, policy, self_update));
        PlanView {
            generation: plan.metadata.generation,
            revision: inplace_proto::revision_of(&plan.spec.content),
            desired: plan.spec.desired_state,
            allow_downgrade: plan.spec.allow_downgrade,
            content: plan.spec.content.clone(),
            problems: (!problems.is_empty()).then_some(Problems(problems)),
            retry: inplace_proto::steering::pending_retry(plan.metadata.annotations.as_ref(), None)
                .map(str::to_owned),
            agent_running: self_update.runs(&plan.spec.content),
        }
    }
}

/// The retry token to honour now: the plan's, unless the journal honoured it already, and
/// only while the plan asks for `Staged`. A failed node's plan says `Active` until its
/// controller sees the token and moves it back to `Staged`; honouring earlier would start
/// the activation again at once, without the slot the controller grants.
pub fn retry_to_honour<'a>(plan: Option<&'a PlanView>, journal: &Journal) -> Option<&'a str> {
    let plan = plan.filter(|p| p.desired == DesiredState::Staged)?;
    plan.retry
        .as_deref()
        .filter(|token| Some(*token) != journal.retry_honoured())
}

/// Why a rollback happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollbackCause {
    /// The revision failed; it is denied afterwards.
    Failed(Failure),
    /// The plan moved on (changed or deleted) while a revision was half-activated; going
    /// back to the committed revision is the safe end of the interrupted step.
    Superseded,
}

/// The next thing to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// No plan and nothing in flight.
    Idle,
    /// A rollback failed earlier; report it and do nothing else.
    StayDegraded(Failure),
    /// The node already runs the plan's revision.
    UpToDate,
    /// The plan is invalid or outside policy; report, touch nothing.
    Refuse(Problems),
    /// The revision failed here before and is not retried.
    Deny(FailedRevision),
    /// Download, verify and store the plan's revision; then activate it when asked.
    Stage {
        /// Go on to activation after staging.
        activate: bool,
    },
    /// A restart interrupted activation or verification of the plan's revision: redo
    /// them (swaps are idempotent; the attempt counter bounds the loop).
    ResumeActivation,
    /// Restore what ran before the in-flight revision.
    RollBack(RollbackCause),
    /// An agent switch is in flight: take its next step (`self_update::resume::resolve`).
    ResumeSwitch,
    /// A reboot was journaled: verify the boot it brought, or ask for it (again).
    ResumeReboot,
}

/// The next action. Pure: the same inputs always give the same action.
pub fn decide(plan: Option<&PlanView>, journal: &Journal, max_attempts: u32) -> Action {
    if let Some(failure) = journal.degraded() {
        return Action::StayDegraded(failure.clone());
    }
    if let Some(flight) = journal.in_flight() {
        match flight.step() {
            Step::RollingBack | Step::RebootingBack => {
                return Action::RollBack(match flight.failure() {
                    Some(failure) => RollbackCause::Failed(failure.clone()),
                    None => RollbackCause::Superseded,
                });
            }
            Step::Activating | Step::Verifying => {
                if !still_wanted(plan, flight.revision()) {
                    return Action::RollBack(RollbackCause::Superseded);
                }
                let attempts = journal.attempts(flight.revision()).unwrap_or(0);
                if attempts >= max_attempts {
                    return Action::RollBack(RollbackCause::Failed(Failure {
                        reason: Reason::TooManyAttempts,
                        message: format!(
                            "activation of revision {} was interrupted {attempts} times; giving up",
                            flight.revision()
                        ),
                    }));
                }
                return Action::ResumeActivation;
            }
            // Whatever the plan says now: the switch is finished (confirmed, rolled back
            // or given up) before anything else, by the old agent or the new one.
            Step::SwitchingAgent => return Action::ResumeSwitch,
            // Whatever the plan says: the links are swapped and the reboot asked for; the
            // boot that follows is verified first (or it is asked for again).
            Step::Rebooting => return Action::ResumeReboot,
            Step::Staging | Step::Staged => {}
        }
    }
    let Some(plan) = plan else {
        return Action::Idle;
    };
    if let Some(problems) = &plan.problems {
        return Action::Refuse(problems.clone());
    }
    // An agent update is done when its build runs, not when a switch was recorded: the
    // record outlives a package reinstalled or an image relinked by hand.
    if journal.current_revision() == Some(plan.revision.as_str()) || plan.agent_running {
        return Action::UpToDate;
    }
    if let Some(problems) = downgrade_problem(plan, journal) {
        return Action::Refuse(problems);
    }
    if let Some(failed) = journal.failure_of(&plan.revision) {
        return Action::Deny(failed.clone());
    }
    Action::Stage {
        activate: plan.desired == DesiredState::Active,
    }
}

/// Whether the plan still asks to activate `revision` (valid, `desiredState: Active`); a
/// half-activated revision it no longer asks for is rolled back (superseded).
pub fn still_wanted(plan: Option<&PlanView>, revision: &str) -> bool {
    plan.is_some_and(|p| {
        p.revision == revision && p.problems.is_none() && p.desired == DesiredState::Active
    })
}

/// The refusal of a plan that would lower the Kubernetes version the node runs committed,
/// unless the plan allows it. Without a version on either side there is nothing to order.
fn downgrade_problem(plan: &PlanView, journal: &Journal) -> Option<Problems> {
    if plan.allow_downgrade {
        return None;
    }
    let committed = journal.committed()?;
    let current = committed.content().kubernetes_version.as_deref()?;
    let target = plan.content.kubernetes_version.as_deref()?;
    inplace_proto::version::is_downgrade(current, target).then(|| {
        Problems(vec![FieldError {
            path: "spec.kubernetesVersion".into(),
            reason: Reason::DowngradeDenied,
            message: format!(
                "{target} is lower than {current}, which this node runs (revision {}); set allowDowngrade to allow a downgrade",
                committed.revision()
            ),
        }])
    })
}

/// Whether a staging in flight is for something other than the plan's current revision
/// (or the plan is gone): its temporary and unreferenced files should be removed.
pub fn staging_is_stale(plan: Option<&PlanView>, journal: &Journal) -> bool {
    match journal.in_flight() {
        Some(flight) if matches!(flight.step(), Step::Staging | Step::Staged) => {
            !plan.is_some_and(|p| p.problems.is_none() && p.revision == flight.revision())
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
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
}
