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
    inplace_proto::condition::find(&status.conditions, type_)
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
mod tests;
