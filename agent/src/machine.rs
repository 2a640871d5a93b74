//! The agent's state machine. [`decide`] is a pure function from the plan, the journal
//! and the settings to the next [`Action`]; `update/` carries actions out. The phases and
//! transitions are drawn in `docs/development/agent.md`.

use inplace_proto::validate::{FieldError, Problems};
use inplace_proto::{Architecture, DesiredState, NodeUpdatePlan, Reason, UpdateContent};

use crate::journal::{FailedRevision, Failure, Journal, Step};
use crate::self_update::admission::{self, Admission};
use crate::settings::Settings;
use crate::sysupdate::{self, Transfer};

/// What the agent read from the node for a plan, before [`PlanView::new`] (which does no
/// I/O).
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// systemd-sysupdate's transfer files.
    pub transfers: Vec<Transfer>,
    /// PID 1's major version, read when the plan has a configuration extension (`Err`: it
    /// could not be read).
    pub systemd_version: Option<Result<u32, String>>,
}

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
    /// the agent, then whether systemd-sysupdate's transfers manage one of its extensions,
    /// then whether this node's systemd can merge its configuration extensions) without
    /// any I/O.
    pub fn new(
        plan: &NodeUpdatePlan,
        settings: &Settings,
        self_update: &Admission,
        facts: &NodeFacts,
    ) -> PlanView {
        let mut problems = plan.validate().err().map(|p| p.0).unwrap_or_default();
        // What this node installs: each artifact's build for its architecture. The
        // revision stays the plan's (the release's), whichever build a node takes.
        let content = plan
            .spec
            .content
            .for_architecture(Architecture::of_this_build(), "spec")
            .unwrap_or_else(|unsupported| {
                problems.extend(unsupported);
                plan.spec.content.clone()
            });
        if let Err(more) = crate::policy::check(&content, &settings.policy) {
            problems.extend(more.0);
        }
        problems.extend(admission::check(&content, &settings.policy, self_update));
        problems.extend(sysupdate::conflicts(
            &content,
            &settings.paths,
            &facts.transfers,
        ));
        problems.extend(crate::confext::unsupported(
            &content,
            facts.systemd_version.as_ref(),
        ));
        PlanView {
            generation: plan.metadata.generation,
            revision: inplace_proto::revision_of(&plan.spec.content),
            desired: plan.spec.desired_state,
            allow_downgrade: plan.spec.allow_downgrade,
            content,
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
mod tests;
