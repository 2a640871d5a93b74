//! What the agent says: the texts of every report, and the plan's status built from them.
//! [`status`] is a pure function of the journal, the plan and what was observed; the
//! [`Agent`] only adds the clock, logs, metrics, sd_notify and publishing.

use std::time::{Duration, Instant, SystemTime};

use inplace_proto::reason::plan_condition;
use inplace_proto::{
    ArtifactProgress, ConditionUpdate, DesiredState, NodeUpdatePlanStatus, Phase, Problems, Reason,
    UpdateContent,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::Agent;
use crate::journal::{FailedRevision, Failure, Journal};
use crate::machine::PlanView;
use crate::metrics::Reported;
use crate::notify;

/// A report about the plan's target revision.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Report {
    pub(super) phase: Phase,
    pub(super) reason: Reason,
    pub(super) message: String,
    /// Shown as `Degraded=True` with its reason and message.
    pub(super) degraded: Option<Failure>,
}

impl Report {
    pub(super) fn new(phase: Phase, reason: Reason, message: impl Into<String>) -> Self {
        Report {
            phase,
            reason,
            message: message.into(),
            degraded: None,
        }
    }

    /// A rollback failed earlier; nothing is done until a person clears it.
    pub(super) fn degraded_node(failure: Failure) -> Self {
        let message = format!("node degraded, no automatic action: {}", failure.message);
        Report {
            degraded: Some(failure),
            ..Report::new(Phase::Failed, Reason::RollbackFailed, message)
        }
    }

    /// The committed revision is the plan's; `drift` says how the host differs, if it does.
    pub(super) fn up_to_date(
        revision: &str,
        content: Option<&UpdateContent>,
        drift: Option<String>,
    ) -> Self {
        match drift {
            None => Report::committed(revision, content),
            Some(drift) => Report {
                degraded: Some(Failure {
                    reason: Reason::Drifted,
                    message: drift,
                }),
                ..Report::new(
                    Phase::Succeeded,
                    Reason::Succeeded,
                    format!("revision {revision} is committed, but the host drifted"),
                )
            },
        }
    }

    /// The revision was verified healthy and committed; for a plan that restarts the
    /// kubelet, whether the node's reported kubelet version was checked (and if not why),
    /// and whether the Node's Ready was.
    pub(super) fn committed(revision: &str, content: Option<&UpdateContent>) -> Self {
        let kubelet = content.map(kubelet_note).unwrap_or_default();
        Report::new(
            Phase::Succeeded,
            Reason::Succeeded,
            format!("revision {revision} is committed and healthy{kubelet}"),
        )
    }

    /// The plan is invalid or outside the node's policy.
    pub(super) fn refused(problems: &Problems) -> Self {
        Report::new(Phase::Failed, problems.reason(), problems.to_string())
    }

    /// The revision failed here before (and was rolled back, if it had been activated).
    pub(super) fn denied(failed: &FailedRevision) -> Self {
        let (revision, failure) = (failed.revision(), failed.failure());
        let (reason, message) = (failure.reason, &failure.message);
        if failed.rolled_back() {
            Report::new(
                Phase::RolledBack,
                Reason::RolledBack,
                format!(
                    "rolled back revision {revision} ({reason}: {message}); the previous revision runs; not retried until the plan changes"
                ),
            )
        } else {
            Report::new(
                Phase::Failed,
                Reason::RevisionDenied,
                format!(
                    "revision {revision} failed on this node before ({reason}: {message}); not retried until the plan changes"
                ),
            )
        }
    }

    /// The old agent arms the guard and swaps its own image (it is restarted as the new).
    pub(super) fn switching(version: &str) -> Self {
        Report::new(
            Phase::Activating,
            Reason::Activating,
            format!("switching to agent {version}; the new agent confirms itself"),
        )
    }

    /// The new agent's proof that it can do its job: this status, written with its
    /// identity.
    pub(super) fn confirming(version: &str) -> Self {
        Report::new(
            Phase::Activating,
            Reason::Activating,
            format!("confirming agent {version}"),
        )
    }

    /// The new agent confirmed itself; the node's content is unchanged.
    pub(super) fn switched(revision: &str, version: &str) -> Self {
        Report::new(
            Phase::Succeeded,
            Reason::Succeeded,
            format!("revision {revision} is committed: agent {version} confirmed itself"),
        )
    }

    /// The revision failed before anything that runs was touched.
    pub(super) fn failed(failure: Failure) -> Self {
        Report::new(Phase::Failed, failure.reason, failure.message)
    }

    /// Artifacts are being downloaded and verified.
    pub(super) fn downloading(view: &PlanView) -> Self {
        Report::new(
            Phase::Downloading,
            Reason::Downloading,
            format!(
                "downloading and verifying {} artifact(s) of revision {}",
                view.content.artifacts.len(),
                view.revision
            ),
        )
    }

    /// Staged, and asked for no more.
    pub(super) fn staged(revision: &str) -> Self {
        Report::new(
            Phase::Staged,
            Reason::Staged,
            format!("revision {revision} is staged; the running revision is untouched"),
        )
    }

    /// Links are being swapped and units restarted.
    pub(super) fn activating(revision: &str) -> Self {
        Report::new(
            Phase::Activating,
            Reason::Activating,
            format!("activating revision {revision}"),
        )
    }

    /// Health checks run; `progress` is the health clock ("… healthy for 12s of 30s").
    pub(super) fn verifying(progress: String) -> Self {
        Report::new(Phase::Verifying, Reason::Verifying, progress)
    }

    /// Going back, because of `failure` (`None`: the plan moved on); `why` describes it.
    pub(super) fn rolling_back(revision: &str, failure: Option<&Failure>, why: &str) -> Self {
        Report::new(
            Phase::RollingBack,
            failure.map_or(Reason::Activating, |f| f.reason),
            format!("rolling back revision {revision}: {why}"),
        )
    }

    /// What ran before runs again and is healthy.
    pub(super) fn rolled_back(revision: &str, why: &str) -> Self {
        Report::new(
            Phase::RolledBack,
            Reason::RolledBack,
            format!(
                "rolled back revision {revision} ({why}); the previous revision runs and is healthy"
            ),
        )
    }

    /// A reboot (`back`: into the previous revision) waits for `blocking` inhibitors.
    pub(super) fn reboot_inhibited(revision: &str, blocking: &str, back: bool) -> Self {
        let (phase, what) = if back {
            (Phase::RollingBack, "the reboot back from revision")
        } else {
            (Phase::Activating, "the reboot into revision")
        };
        Report::new(
            phase,
            Reason::RebootInhibited,
            format!("{what} {revision} waits: a shutdown inhibitor blocks it: {blocking}"),
        )
    }

    /// logind accepted the reboot (`back`: into the previous revision); the agent that
    /// starts after it verifies the boot.
    pub(super) fn rebooting(revision: &str, back: bool) -> Self {
        if back {
            Report::new(
                Phase::RollingBack,
                Reason::Rebooting,
                format!("rebooting into the previous revision: revision {revision} is rolled back"),
            )
        } else {
            Report::new(
                Phase::Activating,
                Reason::Rebooting,
                format!("rebooting into revision {revision}; its checks run after the boot"),
            )
        }
    }

    /// The rollback failed: the node is degraded.
    pub(super) fn rollback_failed(degraded: Failure) -> Self {
        Report {
            degraded: Some(degraded.clone()),
            ..Report::new(Phase::Failed, Reason::RollbackFailed, degraded.message)
        }
    }
}

/// What the status showed about the plan being handled, kept between reports.
#[derive(Default, Debug, Clone)]
pub(super) struct Shown {
    generation: Option<i64>,
    target: Option<String>,
    desired: Option<DesiredState>,
    artifacts: Vec<ArtifactProgress>,
    conditions: Vec<Condition>,
    started_at: Option<Time>,
    finished_at: Option<Time>,
    /// When download progress was last published (at most about once a second).
    progress_published: Option<Instant>,
}

impl Shown {
    /// Takes what the status now says as what the next report starts from.
    fn remember(&mut self, status: &NodeUpdatePlanStatus) {
        self.conditions = status.conditions.clone();
        self.started_at = status.started_at.clone();
        self.finished_at = status.finished_at.clone();
    }

    /// Bytes downloaded of all artifacts, and of how many (when every size is known).
    fn download_totals(&self) -> (u64, Option<u64>) {
        let bytes = |b: i64| u64::try_from(b).unwrap_or(0);
        let done = self.artifacts.iter().map(|a| bytes(a.bytes_done)).sum();
        let total = self
            .artifacts
            .iter()
            .map(|a| a.bytes_total.map(bytes))
            .sum();
        (done, total)
    }
}

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
        agent_version: Some(crate::BUILD_VERSION.to_owned()),
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

impl Agent {
    /// Starts showing `view`'s plan; a new target revision starts afresh.
    pub(super) fn show_plan(&self, view: Option<&PlanView>) {
        let Ok(mut shown) = self.shown.lock() else {
            return;
        };
        let same_target = view.map(|v| &v.revision) == shown.target.as_ref();
        shown.generation = view.and_then(|v| v.generation);
        shown.desired = view.map(|v| v.desired);
        if !same_target {
            shown.target = view.map(|v| v.revision.clone());
            shown.artifacts = view
                .map(|v| {
                    v.content
                        .artifacts
                        .iter()
                        .map(|a| ArtifactProgress {
                            name: a.name.clone(),
                            bytes_done: 0,
                            bytes_total: a.size.map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
                            source: None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            shown.started_at = None;
            shown.finished_at = None;
        }
    }

    /// Records download progress; returns whether it is time to publish it.
    pub(super) fn set_bytes(&self, index: usize, done: u64) -> bool {
        if let Ok(mut shown) = self.shown.lock()
            && let Some(a) = shown.artifacts.get_mut(index)
        {
            a.bytes_done = i64::try_from(done).unwrap_or(i64::MAX);
        }
        self.progress_due(Duration::from_secs(1))
    }

    /// Records the URL that served an artifact's bytes (shown with the next report).
    pub(super) fn set_source(&self, index: usize, source: String) {
        if let Ok(mut shown) = self.shown.lock()
            && let Some(a) = shown.artifacts.get_mut(index)
        {
            a.source = Some(source);
        }
    }

    /// Whether at least `every` passed since progress was last published (and if so,
    /// notes that it is being published now).
    pub(super) fn progress_due(&self, every: Duration) -> bool {
        let Ok(mut shown) = self.shown.lock() else {
            return false;
        };
        let due = shown
            .progress_published
            .is_none_or(|at| at.elapsed() >= every);
        if due {
            shown.progress_published = Some(Instant::now());
        }
        due
    }

    /// Logs, meters and publishes `report`. Without a plan there is no status to write
    /// to: only sd_notify hears it.
    pub(super) fn report(&self, view: Option<&PlanView>, report: Report) {
        tracing::info!(phase = ?report.phase, reason = %report.reason, message = %report.message, "status");
        self.metrics.reported(
            Reported {
                revision: view.map(|v| v.revision.as_str()),
                phase: report.phase,
                reason: report.reason,
            },
            Instant::now(),
            SystemTime::now(),
        );
        self.record_running();
        if let Some(status) = self.render(view, &report) {
            self.host.status.publish(status);
        }
    }

    /// The plan's status for `report` (remembered as shown, and told to sd_notify); `None`
    /// without a plan, when only sd_notify hears it.
    pub(super) fn render(
        &self,
        view: Option<&PlanView>,
        report: &Report,
    ) -> Option<NodeUpdatePlanStatus> {
        let Some(view) = view else {
            (self.host.notify)(&notify::status_line(report.phase, &report.message, None));
            return None;
        };
        let mut shown = self.shown.lock().ok()?;
        let seen = Observation {
            report,
            shown: &shown,
            now: Timestamp::now(),
            boot_id: self.boot_id.as_deref(),
        };
        let status = status(&self.journal, view, &seen);
        shown.remember(&status);
        let download = (report.phase == Phase::Downloading).then(|| shown.download_totals());
        (self.host.notify)(&notify::status_line(
            report.phase,
            &report.message,
            download,
        ));
        Some(status)
    }

    /// Shows the committed revision (what the node runs) in the metrics.
    pub(super) fn record_running(&self) {
        let committed = self.journal.committed();
        self.metrics.running(
            committed.map(|c| c.revision()),
            committed.and_then(|c| c.content().kubernetes_version.as_deref()),
        );
    }
}

#[cfg(test)]
mod tests;

/// What a committed plan that restarts `kubelet.service` proved of the kubelet: the version
/// the Node reports (`healthChecks.nodeKubeletVersion`), or why it was not checked, and
/// that the Node reports Ready (`healthChecks.nodeReady`). Empty for a plan that does not
/// restart the kubelet.
fn kubelet_note(content: &UpdateContent) -> String {
    let restarts_kubelet = content
        .activation
        .restart_units
        .iter()
        .any(|u| u.as_str() == "kubelet.service");
    if !restarts_kubelet {
        return String::new();
    }
    let checks = &content.health_checks;
    let ready = if checks.node_ready {
        "; the node reports Ready"
    } else {
        ""
    };
    match (
        checks.node_kubelet_version,
        content.kubernetes_version.as_deref(),
    ) {
        (true, Some(version)) if checks.node_ready => {
            format!("; the node reports kubelet {version} and Ready")
        }
        (true, Some(version)) => format!("; the node reports kubelet {version}"),
        (false, _) => format!(
            "; kubelet version not checked: healthChecks.nodeKubeletVersion is not set{ready}"
        ),
        (true, None) => {
            format!("; kubelet version not checked: the plan names no kubernetesVersion{ready}")
        }
    }
}
