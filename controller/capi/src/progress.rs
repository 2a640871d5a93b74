//! `UpdateMachine` decisions as pure functions: what to write into the node's plan next
//! ([`next_step`]), and what to answer Cluster API given the plan's status ([`answer`]).

use inplace_proto::outcome::outcome_of;
use inplace_proto::reason::plan_condition;
use inplace_proto::{DesiredState, NodeUpdatePlan, NodeUpdatePlanStatus, Outcome, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::hooks::{HOOKS_API_VERSION, ResponseStatus, UpdateMachineResponse};

/// What the node is doing, as Cluster API should hear it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Still working; ask again later. The message says what the node is doing.
    InProgress(String),
    /// The node runs the release.
    Done(String),
    /// The update failed (the node runs the previous revision, or needs a person).
    Failed(String),
}

impl Answer {
    /// The wire response; `retry_after_seconds` (at least 1) is used while in progress.
    pub fn into_response(self, retry_after_seconds: i32) -> UpdateMachineResponse {
        let (status, message, retry) = match self {
            Answer::InProgress(message) => {
                (ResponseStatus::Success, message, retry_after_seconds.max(1))
            }
            Answer::Done(message) => (ResponseStatus::Success, message, 0),
            Answer::Failed(message) => (ResponseStatus::Failure, message, 0),
        };
        UpdateMachineResponse {
            api_version: HOOKS_API_VERSION.to_owned(),
            kind: "UpdateMachineResponse".to_owned(),
            status,
            message,
            retry_after_seconds: retry,
        }
    }

    /// The message, whichever the outcome.
    pub fn message(&self) -> &str {
        match self {
            Answer::InProgress(m) | Answer::Done(m) | Answer::Failed(m) => m,
        }
    }
}

/// What to do with the node's plan on this call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextStep {
    /// Make sure the plan for the release exists with this desired state.
    Write(DesiredState),
    /// The release is staged on the node: drain it, then write `Active`.
    Drain,
}

/// Decides the plan's desired state. Without drain the plan goes straight to `Active`.
/// With drain it stays `Staged` (downloads are not disruptive) until the agent reports the
/// revision staged, then the node is drained, then the plan becomes `Active`. Once `Active`
/// it stays `Active` (repeated calls never step back), and a node that already runs the
/// revision is not drained at all.
pub fn next_step(plan: Option<&NodeUpdatePlan>, revision: &str, drain: bool) -> NextStep {
    if !drain {
        return NextStep::Write(DesiredState::Active);
    }
    let Some(plan) = plan.filter(|p| p.spec.revision.as_deref() == Some(revision)) else {
        return NextStep::Write(DesiredState::Staged);
    };
    let outcome = outcome_of(plan.status.as_ref(), revision, plan.metadata.generation);
    if outcome == Outcome::Reached || plan.spec.desired_state == DesiredState::Active {
        NextStep::Write(DesiredState::Active)
    } else if outcome == Outcome::Working(Phase::Staged) {
        NextStep::Drain
    } else {
        NextStep::Write(DesiredState::Staged)
    }
}

/// What to tell Cluster API about `node` updating to `release` (content hash `revision`),
/// from the plan as it stands. Whether the node is there, failed or still working is
/// proto's one reading of the agent's report ([`Outcome`]); this only words it.
pub fn answer(node: &str, release: &str, revision: &str, plan: &NodeUpdatePlan) -> Answer {
    let Some(status) = plan.status.as_ref() else {
        return Answer::InProgress(format!(
            "node {node}: waiting for the inplace agent to pick up the plan for {release}"
        ));
    };
    let outcome = status.outcome_for(revision, plan.metadata.generation);
    if outcome == Outcome::Reached {
        return Answer::Done(format!("node {node} runs {release} (revision {revision})"));
    }
    let phase = match outcome {
        _ if plan.spec.revision.as_deref() != Some(revision) => None,
        Outcome::Working(phase) | Outcome::Failed(phase) => Some(phase),
        Outcome::NotPickedUp | Outcome::Reached => None,
    };
    let Some(phase) = phase else {
        return Answer::InProgress(format!(
            "node {node}: waiting for the inplace agent to pick up {release} (revision {revision})"
        ));
    };
    let ready = condition(status, plan_condition::READY);
    let ready_text = ready.map(|c| c.message.as_str()).filter(|m| !m.is_empty());
    let detail = |fallback: &str| -> String {
        ready_text
            .or(status.progress.as_deref())
            .unwrap_or(fallback)
            .to_owned()
    };
    match phase {
        Phase::Pending => Answer::InProgress(format!("node {node}: Pending: {}", detail("queued"))),
        Phase::Downloading => Answer::InProgress(format!(
            "node {node}: Downloading {}",
            download_progress(plan, status)
        )),
        Phase::Staged if plan.spec.desired_state == DesiredState::Staged => Answer::InProgress(
            format!("node {node}: Staged {release}; waiting to activate"),
        ),
        Phase::Staged => {
            Answer::InProgress(format!("node {node}: Staged {release}; activating next"))
        }
        Phase::Activating => Answer::InProgress(format!(
            "node {node}: Activating: {}",
            detail("swapping links and restarting units")
        )),
        Phase::Verifying => Answer::InProgress(format!(
            "node {node}: Verifying {}",
            detail("health checks")
        )),
        // A Succeeded for the revision is Outcome::Reached, answered above.
        Phase::Succeeded => Answer::InProgress(format!("node {node}: Succeeded")),
        Phase::RollingBack => Answer::InProgress(format!(
            "node {node}: RollingBack from {release}: {}",
            failure_text(status)
        )),
        Phase::RolledBack => Answer::Failed(format!(
            "node {node} rolled back from {release} to revision {}: {}",
            status.current_revision.as_deref().unwrap_or("(none)"),
            failure_text(status)
        )),
        Phase::Failed => Answer::Failed(format!(
            "node {node} failed to update to {release}: {}",
            failure_text(status)
        )),
    }
}

fn condition<'a>(status: &'a NodeUpdatePlanStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// `HealthCheckFailed: kubelet.service ...` from the Ready condition, plus a true Degraded.
fn failure_text(status: &NodeUpdatePlanStatus) -> String {
    let mut parts = Vec::new();
    if let Some(ready) = condition(status, plan_condition::READY) {
        parts.push(join_reason(&ready.reason, &ready.message));
    }
    if let Some(degraded) =
        condition(status, plan_condition::DEGRADED).filter(|c| c.status == "True")
    {
        parts.push(format!(
            "Degraded: {}",
            join_reason(&degraded.reason, &degraded.message)
        ));
    }
    parts.retain(|p| !p.is_empty());
    if parts.is_empty() {
        "no reason reported by the agent".to_owned()
    } else {
        parts.join("; ")
    }
}

fn join_reason(reason: &str, message: &str) -> String {
    match (reason.is_empty(), message.is_empty()) {
        (false, false) => format!("{reason}: {message}"),
        (false, true) => reason.to_owned(),
        (true, false) => message.to_owned(),
        (true, true) => String::new(),
    }
}

/// `52% (50.0 MiB of 93.0 MiB)` from the artifacts' byte counts (totals from the status, or
/// the sizes in the plan), or the agent's own progress line when no total is known.
fn download_progress(plan: &NodeUpdatePlan, status: &NodeUpdatePlanStatus) -> String {
    let mut done: u64 = 0;
    let mut total: u64 = 0;
    let mut known = !plan.spec.content.artifacts.is_empty();
    for artifact in &plan.spec.content.artifacts {
        let reported = status.artifacts.iter().find(|a| a.name == artifact.name);
        let size = reported
            .and_then(|a| a.bytes_total)
            .and_then(|t| u64::try_from(t).ok())
            .or(artifact.size);
        match size {
            Some(size) => total = total.saturating_add(size),
            None => known = false,
        }
        let bytes = reported
            .and_then(|a| u64::try_from(a.bytes_done).ok())
            .unwrap_or(0);
        done = done.saturating_add(bytes.min(size.unwrap_or(u64::MAX)));
    }
    if known && total > 0 {
        let percent = done.saturating_mul(100) / total;
        format!("{percent}% ({} of {})", mib(done), mib(total))
    } else if let Some(progress) = status.progress.as_deref().filter(|p| !p.is_empty()) {
        progress.to_owned()
    } else {
        format!("{} so far", mib(done))
    }
}

fn mib(bytes: u64) -> String {
    // Display only; f64 is exact far beyond any artifact size.
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
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
}
