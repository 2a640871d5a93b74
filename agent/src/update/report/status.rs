//! The plan's status as a pure function of the journal, the plan and what was observed.

use inplace_proto::reason::plan_condition;
use inplace_proto::{ConditionUpdate, DesiredState, NodeUpdatePlanStatus, Phase, Reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{Report, Shown};
use crate::journal::Journal;
use crate::machine::PlanView;

/// What a status is built from besides the journal and the plan.
pub(super) struct Observation<'a> {
    /// What the agent found: phase, reason, message, degradation.
    pub(super) report: &'a Report,
    /// What the status showed before (conditions, times) and the download progress.
    pub(super) shown: &'a Shown,
    /// Now.
    pub(super) now: Timestamp,
    /// This boot.
    pub(super) boot_id: Option<&'a str>,
}

/// The plan's status. Pure: the same journal, plan and observation give the same status.
pub(super) fn status(
    journal: &Journal,
    view: &PlanView,
    seen: &Observation<'_>,
) -> NodeUpdatePlanStatus {
    let (report, shown) = (seen.report, seen.shown);
    let ready = report.phase == Phase::Succeeded
        || (report.phase == Phase::Staged && view.desired == DesiredState::Staged);
    let degraded = report.degraded.as_ref();
    let conditions = [
        ConditionUpdate::new(
            plan_condition::READY,
            ready,
            report.reason,
            report.message.clone(),
        ),
        ConditionUpdate::new(
            plan_condition::DEGRADED,
            degraded.is_some(),
            degraded.map_or(Reason::AsExpected, |d| d.reason),
            degraded.map_or_else(String::new, |d| d.message.clone()),
        ),
    ]
    .into_iter()
    .map(|c| c.into_condition(&shown.conditions, view.generation, seen.now))
    .collect();
    let is_final = report.phase.is_final();
    // Started by the first report that is not final; finished the first time the target
    // reaches a final phase (a later pass, an agent restart or a relist, keeps that time).
    let started_at = shown
        .started_at
        .clone()
        .or_else(|| (!is_final).then_some(Time(seen.now)));
    let finished_at = is_final.then(|| shown.finished_at.clone().unwrap_or(Time(seen.now)));
    let progress = match report.phase {
        Phase::Downloading => {
            let done: i64 = shown.artifacts.iter().map(|a| a.bytes_done).sum();
            let total: i64 = shown.artifacts.iter().filter_map(|a| a.bytes_total).sum();
            Some(if total > 0 {
                format!("{}%", done.saturating_mul(100) / total.max(1))
            } else {
                format!("{done} bytes")
            })
        }
        Phase::Verifying => Some(report.message.clone()),
        _ => None,
    };
    NodeUpdatePlanStatus {
        observed_generation: view.generation,
        phase: Some(report.phase),
        current_revision: current_revision(journal, view).map(str::to_owned),
        target_revision: Some(view.revision.clone()),
        progress,
        artifacts: shown.artifacts.clone(),
        attempts: journal
            .attempts(&view.revision)
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
        failed_revisions: journal
            .failed()
            .iter()
            .map(|f| f.revision().to_owned())
            .collect(),
        retry_honoured: journal.retry_honoured().map(str::to_owned),
        conditions,
        started_at,
        finished_at,
        agent_version: Some(crate::build_version().to_owned()),
        boot_id: seen.boot_id.map(str::to_owned),
    }
}

/// The revision the node runs as the plan sees it: the plan's own when it asks for the
/// agent build that runs (installed by a switch or not; kept apart from the node's
/// content), else the committed content's.
fn current_revision<'a>(journal: &'a Journal, view: &'a PlanView) -> Option<&'a str> {
    if view.agent_running {
        Some(&view.revision)
    } else {
        journal.current_revision()
    }
}
