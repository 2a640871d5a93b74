//! The coordinator: carries out what [`machine::decide`] chooses, one atomic step at a
//! time, persisting the journal before each step's first side effect and reporting every
//! step into the plan's status.
//!
//! The invariant after any crash: the node runs the committed revision or the new verified
//! one; links only ever point at complete, verified files; the previous revision stays on
//! disk until the new one is committed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use chrono::Utc;
use inplace_proto::reason::plan_condition;
use inplace_proto::{
    Artifact, ArtifactProgress, ArtifactType, DesiredState, NodeUpdatePlan, NodeUpdatePlanStatus,
    Phase, Reason, UpdateContent,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::archive;
use crate::fetch::{FetchError, Fetcher, Progress};
use crate::health::{self, Probes};
use crate::journal::{
    self, Before, Failure, InFlight, Journal, JournalError, JournalFile, Link, Step,
    TransitionError,
};
use crate::links;
use crate::machine::{self, Action, PlanView, RollbackCause};
use crate::metrics::{AgentMetrics, Reported};
use crate::notify;
use crate::settings::Settings;
use crate::signature;
use crate::status::StatusSink;
use crate::store;
use crate::systemd::SystemdManager;

/// The unit that merges sysext images.
pub const SYSEXT_UNIT: &str = "systemd-sysext.service";

/// Errors that stop the agent (the journal cannot be written: acting on would break the
/// crash-safety promise). Step failures are not errors: they are reported and rolled back.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The journal could not be read or written.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The journal refused a step transition: a bug in the coordinator. Stopping leaves
    /// the journal on disk as it was, consistent.
    #[error(transparent)]
    Transition(#[from] TransitionError),
}

/// The edges the coordinator talks to.
#[derive(Clone)]
pub struct Host {
    /// PID 1.
    pub systemd: Arc<dyn SystemdManager>,
    /// Downloads.
    pub fetcher: Arc<dyn Fetcher>,
    /// HTTP and kubelet-version checks.
    pub probes: Arc<dyn Probes>,
    /// The plan's status.
    pub status: Arc<dyn StatusSink>,
    /// Human-readable "what am I doing" (sd_notify `STATUS=`).
    pub notify: Arc<dyn Fn(&str) + Send + Sync>,
}

/// A report about the plan's target revision.
struct Report {
    phase: Phase,
    reason: Reason,
    message: String,
    degraded: Option<Failure>,
}

impl Report {
    fn new(phase: Phase, reason: Reason, message: impl Into<String>) -> Self {
        Report {
            phase,
            reason,
            message: message.into(),
            degraded: None,
        }
    }
}

/// The agent's coordinator.
pub struct Agent {
    settings: Settings,
    host: Host,
    journal_file: JournalFile,
    journal: Journal,
    boot_id: Option<String>,
    /// What the status shows about the plan being handled.
    shown: Mutex<Shown>,
    /// The plan channel, when following one (lets a long staging notice a new plan).
    plans: Option<tokio::sync::watch::Receiver<crate::watch::PlanState>>,
    /// What the metrics endpoint shows.
    metrics: Arc<AgentMetrics>,
}

/// How staging ended.
enum Staging {
    Done,
    Failed(Failure),
    Superseded,
}

/// Returns when the plan on `plans` no longer asks for `revision`; never without a channel.
async fn moved_on(
    plans: Option<&mut tokio::sync::watch::Receiver<crate::watch::PlanState>>,
    revision: &str,
) {
    let Some(plans) = plans else {
        return std::future::pending().await;
    };
    loop {
        if plans.changed().await.is_err() {
            return std::future::pending().await;
        }
        let wanted = match &*plans.borrow_and_update() {
            None => true,
            Some(None) => false,
            Some(Some(plan)) => inplace_proto::revision_of(&plan.spec.content) == revision,
        };
        if !wanted {
            return;
        }
    }
}

#[derive(Default)]
struct Shown {
    generation: Option<i64>,
    target: Option<String>,
    desired: Option<DesiredState>,
    artifacts: Vec<ArtifactProgress>,
    conditions: Vec<Condition>,
    started_at: Option<Time>,
    finished_at: Option<Time>,
    /// When download progress was last published (at most about once a second).
    progress_published: Option<std::time::Instant>,
}

impl Agent {
    /// Loads the journal. An unreadable journal is moved aside and the node marked
    /// degraded: without it the agent cannot know what to restore.
    pub async fn open(settings: Settings, host: Host) -> Result<Agent, AgentError> {
        let journal_file = JournalFile::new(&settings.state_dir);
        let journal = match journal_file.load().await {
            Ok(journal) => journal,
            Err(e @ JournalError::Corrupt { .. }) => {
                tracing::error!(error = %e, "journal unreadable; marking the node degraded");
                let mut journal = Journal::default();
                journal.mark_degraded(Failure {
                    reason: Reason::RollbackFailed,
                    message: format!("{e}; a person must check this node"),
                });
                journal_file.save(&journal).await?;
                journal
            }
            Err(e) => return Err(e.into()),
        };
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_owned());
        let agent = Agent {
            settings,
            host,
            journal_file,
            journal,
            boot_id,
            shown: Mutex::new(Shown::default()),
            plans: None,
            metrics: Arc::default(),
        };
        agent.record_running();
        Ok(agent)
    }

    /// The agent's metrics, for the metrics endpoint.
    pub fn metrics(&self) -> Arc<AgentMetrics> {
        self.metrics.clone()
    }

    /// Follows the plan channel fed by `watch::run`: acts on every new plan state, until
    /// the channel closes. Before the first complete list nothing is done, except that an
    /// interrupted rollback is finished (it does not depend on the plan).
    pub async fn follow(
        &mut self,
        mut plans: tokio::sync::watch::Receiver<crate::watch::PlanState>,
    ) -> Result<(), AgentError> {
        self.plans = Some(plans.clone());
        if self.journal.step() == Some(Step::RollingBack) {
            self.handle(None).await?;
        }
        loop {
            let state = plans.borrow_and_update().clone();
            if let Some(plan) = state {
                self.handle(plan.as_ref()).await?;
            }
            if plans.changed().await.is_err() {
                return Ok(());
            }
        }
    }

    /// The journal as it is now (for tests and diagnostics).
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Acts on the plan (or its absence) until the node is at a stable point: the plan's
    /// revision committed, staged, refused, or rolled back.
    pub async fn handle(&mut self, plan: Option<&NodeUpdatePlan>) -> Result<(), AgentError> {
        use tracing::Instrument;
        let plan = plan.filter(|p| p.metadata.name.as_deref() == Some(&self.settings.node_name));
        let view = plan.map(|p| PlanView::new(p, &self.settings.policy));
        // Every log line of this pass carries the plan's revision and generation (journald
        // fields REVISION, GENERATION).
        let span = tracing::info_span!(
            "plan",
            revision = view.as_ref().map_or("", |v| v.revision.as_str()),
            generation = view.as_ref().and_then(|v| v.generation),
        );
        self.handle_view(view).instrument(span).await
    }

    async fn handle_view(&mut self, view: Option<PlanView>) -> Result<(), AgentError> {
        self.show_plan(view.as_ref());
        loop {
            if machine::staging_is_stale(view.as_ref(), &self.journal) {
                self.abandon_staging().await?;
            }
            let action = machine::decide(
                view.as_ref(),
                &self.journal,
                self.settings.activation.max_attempts,
            );
            tracing::info!(action = action_name(&action), "decided");
            match action {
                Action::Idle => return Ok(()),
                Action::StayDegraded(failure) => {
                    let mut report = Report::new(
                        Phase::Failed,
                        Reason::RollbackFailed,
                        format!("node degraded, no automatic action: {}", failure.message),
                    );
                    report.degraded = Some(failure);
                    self.report(view.as_ref(), report);
                    return Ok(());
                }
                Action::UpToDate => {
                    let revision = view
                        .as_ref()
                        .map(|v| v.revision.clone())
                        .unwrap_or_default();
                    let mut report = Report::new(
                        Phase::Succeeded,
                        Reason::Succeeded,
                        format!("revision {revision} is committed and healthy"),
                    );
                    // Report only: re-applying could fight whoever changed the host; a new
                    // plan revision (or putting the link back) ends it.
                    if let Some(drift) = self.drift() {
                        tracing::warn!(message = %drift, "host drifted from the committed revision");
                        report.message =
                            format!("revision {revision} is committed, but the host drifted");
                        report.degraded = Some(Failure {
                            reason: Reason::Drifted,
                            message: drift,
                        });
                    }
                    self.report(view.as_ref(), report);
                    return Ok(());
                }
                Action::Refuse(problems) => {
                    self.report(
                        view.as_ref(),
                        Report::new(Phase::Failed, problems.reason(), problems.to_string()),
                    );
                    return Ok(());
                }
                Action::Deny(failed) if failed.rolled_back() => {
                    // What happened to this revision, also after a restart that finished
                    // an interrupted rollback without a plan to report to.
                    self.report(
                        view.as_ref(),
                        Report::new(
                            Phase::RolledBack,
                            Reason::RolledBack,
                            format!(
                                "rolled back revision {} ({}: {}); the previous revision runs; not retried until the plan changes",
                                failed.revision(),
                                failed.failure().reason,
                                failed.failure().message
                            ),
                        ),
                    );
                    return Ok(());
                }
                Action::Deny(failed) => {
                    self.report(
                        view.as_ref(),
                        Report::new(
                            Phase::Failed,
                            Reason::RevisionDenied,
                            format!(
                                "revision {} failed on this node before ({}: {}); not retried until the plan changes",
                                failed.revision(),
                                failed.failure().reason,
                                failed.failure().message
                            ),
                        ),
                    );
                    return Ok(());
                }
                Action::Stage { activate } => {
                    let Some(view) = view.as_ref() else {
                        return Ok(());
                    };
                    match self.stage(view).await? {
                        Staging::Done => {}
                        Staging::Failed(failure) => {
                            self.report(
                                Some(view),
                                Report::new(Phase::Failed, failure.reason, failure.message),
                            );
                            return Ok(());
                        }
                        // The caller acts on the new plan (and abandons this staging).
                        Staging::Superseded => return Ok(()),
                    }
                    if !activate {
                        self.report(
                            Some(view),
                            Report::new(
                                Phase::Staged,
                                Reason::Staged,
                                format!(
                                    "revision {} is staged; the running revision is untouched",
                                    view.revision
                                ),
                            ),
                        );
                        return Ok(());
                    }
                    self.activate(view).await?;
                    return Ok(());
                }
                Action::ResumeActivation => {
                    let Some(view) = view.as_ref() else {
                        return Ok(());
                    };
                    self.activate(view).await?;
                    return Ok(());
                }
                Action::RollBack(cause) => {
                    let superseded = cause == RollbackCause::Superseded;
                    self.roll_back(view.as_ref(), cause).await?;
                    if !superseded {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// The first managed path that no longer points at the committed revision's file (or
    /// whose file is gone), described; `None` when the host matches the journal.
    fn drift(&self) -> Option<String> {
        let committed = self.journal.committed()?;
        committed.links().iter().find_map(|l| {
            if !links::points_at(&l.path, &l.target) {
                let now = std::fs::read_link(&l.path).map_or_else(
                    |_| "is not a symlink (or is missing)".to_owned(),
                    |t| format!("points at {}", t.display()),
                );
                Some(format!(
                    "{} {now}, not at {} (committed revision {})",
                    l.path.display(),
                    l.target.display(),
                    committed.revision()
                ))
            } else if !l.target.exists() {
                Some(format!(
                    "{} points at {}, which is missing (committed revision {})",
                    l.path.display(),
                    l.target.display(),
                    committed.revision()
                ))
            } else {
                None
            }
        })
    }

    /// A crash-injection point (inert without the `failpoints` feature).
    fn failpoint(&self, name: &str) {
        crate::failpoints::hit(&self.settings.paths.lock_file, name);
    }

    async fn save(&self) -> Result<(), AgentError> {
        Ok(self.journal_file.save(&self.journal).await?)
    }

    fn show_plan(&self, view: Option<&PlanView>) {
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
                        })
                        .collect()
                })
                .unwrap_or_default();
            shown.started_at = None;
            shown.finished_at = None;
        }
    }

    /// Records download progress; returns whether it is time to publish it.
    fn set_bytes(&self, index: usize, done: u64) -> bool {
        if let Ok(mut shown) = self.shown.lock()
            && let Some(a) = shown.artifacts.get_mut(index)
        {
            a.bytes_done = i64::try_from(done).unwrap_or(i64::MAX);
        }
        self.progress_due(std::time::Duration::from_secs(1))
    }

    /// Whether at least `every` passed since progress was last published (and if so,
    /// notes that it is being published now).
    fn progress_due(&self, every: std::time::Duration) -> bool {
        let Ok(mut shown) = self.shown.lock() else {
            return false;
        };
        let due = shown
            .progress_published
            .is_none_or(|at| at.elapsed() >= every);
        if due {
            shown.progress_published = Some(std::time::Instant::now());
        }
        due
    }

    /// Builds and publishes the status. Without a plan there is nothing to write to.
    fn report(&self, view: Option<&PlanView>, report: Report) {
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
        let Some(view) = view else {
            (self.host.notify)(&notify::status_line(report.phase, &report.message, None));
            return;
        };
        let Ok(mut shown) = self.shown.lock() else {
            return;
        };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let ready = report.phase == Phase::Succeeded
            || (report.phase == Phase::Staged && view.desired == DesiredState::Staged);
        let degraded = report.degraded.as_ref();
        let wanted = [
            (
                plan_condition::READY,
                ready,
                report.reason,
                report.message.clone(),
            ),
            (
                plan_condition::DEGRADED,
                degraded.is_some(),
                degraded.map_or(Reason::AsExpected, |d| d.reason),
                degraded.map_or_else(String::new, |d| d.message.clone()),
            ),
        ];
        let conditions: Vec<Condition> = wanted
            .into_iter()
            .map(|(kind, status, reason, message)| {
                let status = if status { "True" } else { "False" }.to_owned();
                let last_transition_time = shown
                    .conditions
                    .iter()
                    .find(|c| c.type_ == kind && c.status == status)
                    .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
                Condition {
                    type_: kind.to_owned(),
                    status,
                    reason: reason.as_str().to_owned(),
                    message,
                    observed_generation: view.generation,
                    last_transition_time,
                }
            })
            .collect();
        shown.conditions = conditions.clone();
        if shown.started_at.is_none() && !report.phase.is_final() {
            shown.started_at = Some(now.clone());
        }
        // The first time the target reaches a final phase; a later pass (an agent restart,
        // a relist) keeps that time.
        if !report.phase.is_final() {
            shown.finished_at = None;
        } else if shown.finished_at.is_none() {
            shown.finished_at = Some(now.clone());
        }
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
        let download = (report.phase == Phase::Downloading).then(|| {
            let bytes = |b: i64| u64::try_from(b).unwrap_or(0);
            let done: u64 = shown.artifacts.iter().map(|a| bytes(a.bytes_done)).sum();
            let total: Option<u64> = shown
                .artifacts
                .iter()
                .map(|a| a.bytes_total.map(bytes))
                .sum();
            (done, total)
        });
        (self.host.notify)(&notify::status_line(
            report.phase,
            &report.message,
            download,
        ));
        let status = NodeUpdatePlanStatus {
            observed_generation: view.generation,
            phase: Some(report.phase),
            current_revision: self.journal.current_revision().map(str::to_owned),
            target_revision: Some(view.revision.clone()),
            progress,
            artifacts: shown.artifacts.clone(),
            attempts: self
                .journal
                .attempts(&view.revision)
                .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
            failed_revisions: self
                .journal
                .failed()
                .iter()
                .map(|f| f.revision().to_owned())
                .collect(),
            conditions,
            started_at: shown.started_at.clone(),
            finished_at: shown.finished_at.clone(),
            agent_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            boot_id: self.boot_id.clone(),
        };
        drop(shown);
        self.host.status.publish(status);
    }

    /// Shows the committed revision (what the node runs) in the metrics.
    fn record_running(&self) {
        let committed = self.journal.committed();
        self.metrics.running(
            committed.map(|c| c.revision()),
            committed.and_then(|c| c.content().kubernetes_version.as_deref()),
        );
    }

    /// Fetches one artifact into `dir`, metering its bytes and time.
    async fn download(
        &self,
        artifact: &Artifact,
        dir: &Path,
        progress: Progress<'_>,
    ) -> Result<PathBuf, FetchError> {
        let meter = self.metrics.download();
        let metered = |done: u64| {
            meter.progress(done);
            progress(done);
        };
        let fetched = self.host.fetcher.fetch(artifact, dir, &metered).await;
        if fetched.is_ok() {
            meter.succeeded();
        }
        fetched
    }

    /// Drops a staging that is no longer wanted: temporary files and files no kept
    /// revision references.
    async fn abandon_staging(&mut self) -> Result<(), AgentError> {
        if self.journal.in_flight().is_none() {
            return Ok(());
        }
        let flight = self.journal.abandon_staging()?;
        tracing::info!(revision = %flight.revision(), "abandoning staging");
        self.save().await?;
        self.collect(flight_targets(&flight)).await;
        Ok(())
    }

    /// Removes those of `candidates` that no kept revision references, and leftovers.
    async fn collect(&self, candidates: Vec<PathBuf>) {
        let keep = referenced(&self.journal);
        // Our partial downloads: the state's temp dir and every sysext image directory.
        let mut partial_dirs = vec![store::tmp_dir(&self.settings)];
        if let Ok(mut entries) = tokio::fs::read_dir(&self.settings.paths.images_dir).await {
            while let Ok(Some(entry)) = entries.next_entry().await {
                partial_dirs.push(entry.path());
            }
        }
        let _ = tokio::task::spawn_blocking(move || {
            store::remove_unreferenced(&candidates, &keep);
            store::remove_partials(&partial_dirs);
        })
        .await;
    }

    /// Downloads, verifies and stores every artifact of the plan's revision. A failure of
    /// the revision is reported and denied; `Err` stops the agent. When the plan moves to
    /// another revision (or goes away) meanwhile, staging stops at once: downloads are
    /// not worth finishing for a revision nobody wants.
    async fn stage(&mut self, view: &PlanView) -> Result<Staging, AgentError> {
        let fresh = self
            .journal
            .in_flight()
            .is_none_or(|f| f.revision() != view.revision);
        // Partial downloads of an earlier run (a crash, a stopped staging) are never resumed
        // across processes: sweep them.
        self.collect(Vec::new()).await;
        if fresh {
            self.journal.begin_staging(
                &view.revision,
                view.generation,
                &view.content,
                Utc::now(),
            )?;
            self.save().await?;
        }
        self.failpoint("stage.begin");
        self.report(
            Some(view),
            Report::new(
                Phase::Downloading,
                Reason::Downloading,
                format!(
                    "downloading and verifying {} artifact(s) of revision {}",
                    view.content.artifacts.len(),
                    view.revision
                ),
            ),
        );
        let mut staged_links = Vec::new();
        let mut plans = self.plans.clone();
        for (index, artifact) in view.content.artifacts.iter().enumerate() {
            let staged = tokio::select! {
                staged = self.stage_artifact(view, index, artifact) => staged,
                () = moved_on(plans.as_mut(), &view.revision) => {
                    tracing::info!(revision = %view.revision, "plan changed during staging; stopping");
                    return Ok(Staging::Superseded);
                }
            };
            match staged {
                Ok(links) => {
                    self.failpoint("stage.artifact");
                    staged_links.extend(links);
                }
                Err(failure) => {
                    tracing::warn!(artifact = %artifact.name, reason = %failure.reason, message = %failure.message, "staging failed");
                    let candidates: Vec<PathBuf> = staged_links
                        .iter()
                        .map(|l: &Link| l.target.clone())
                        .collect();
                    self.journal.deny(failure.clone(), Utc::now())?;
                    self.save().await?;
                    self.collect(candidates).await;
                    return Ok(Staging::Failed(failure));
                }
            }
        }
        self.journal.staged(staged_links)?;
        self.save().await?;
        self.failpoint("stage.done");
        Ok(Staging::Done)
    }

    async fn stage_artifact(
        &self,
        view: &PlanView,
        index: usize,
        artifact: &Artifact,
    ) -> Result<Vec<Link>, Failure> {
        let settings = &self.settings;
        let progress = |done: u64| {
            if self.set_bytes(index, done) {
                self.report(Some(view), self.downloading_report(view));
            }
        };
        let fetch_failure = |e: FetchError| Failure {
            reason: e.reason(),
            message: e.to_string(),
        };
        let io_failure = |what: &str, e: std::io::Error| Failure {
            reason: if store::is_disk_full(&e) {
                Reason::DiskFull
            } else {
                Reason::StagingFailed
            },
            message: format!("artifact {}: {what}: {e}", artifact.name),
        };
        let sha = artifact.sha256.clone();
        let done = |this: &Self| {
            if let Some(size) = artifact.size {
                this.set_bytes(index, size);
            }
        };
        // Before the artifact: a bad signature costs no download.
        let signature = signature::prepare(
            self.host.fetcher.as_ref(),
            artifact,
            view.content.kubernetes_version.as_deref(),
            &settings.policy.trusted_keys_dir,
        )
        .await?;
        match artifact.kind {
            ArtifactType::Sysext => {
                let dir = store::sysext_dir(&settings.paths, &artifact.name);
                let file = sysext_file_name(artifact);
                let link = store::sysext_link(&settings.paths, &artifact.name);
                let (d, f, s) = (dir.clone(), file.clone(), sha.clone());
                if let Some(existing) = blocking(move || Ok(store::find_sysext(&d, &f, &s)))
                    .await
                    .ok()
                    .flatten()
                {
                    signature::verify_file(signature.as_ref(), &artifact.name, &existing).await?;
                    done(self);
                    return Ok(vec![Link {
                        path: link,
                        target: existing,
                        sha256: sha,
                    }]);
                }
                let temp = self
                    .download(artifact, &dir, &progress)
                    .await
                    .map_err(fetch_failure)?;
                signature::verify_download(signature.as_ref(), &artifact.name, &temp).await?;
                let s = sha.clone();
                let target = blocking(move || store::place_sysext(&temp, &dir, &file, &s))
                    .await
                    .map_err(|e| io_failure("storing the image", e))?;
                self.report(Some(view), self.downloading_report(view));
                Ok(vec![Link {
                    path: link,
                    target,
                    sha256: sha,
                }])
            }
            ArtifactType::Binary => {
                let cas = store::cas_dir(settings);
                let path = PathBuf::from(artifact.path.clone().unwrap_or_default());
                let existing = cas.join(&sha);
                let s = sha.clone();
                let e2 = existing.clone();
                if blocking(move || Ok(store::is_verified(&e2, &s)))
                    .await
                    .unwrap_or(false)
                {
                    signature::verify_file(signature.as_ref(), &artifact.name, &existing).await?;
                    done(self);
                    return Ok(vec![Link {
                        path,
                        target: existing,
                        sha256: sha,
                    }]);
                }
                let temp = self
                    .download(artifact, &store::tmp_dir(settings), &progress)
                    .await
                    .map_err(fetch_failure)?;
                signature::verify_download(signature.as_ref(), &artifact.name, &temp).await?;
                let s = sha.clone();
                let target = blocking(move || store::place_cas(&temp, &cas, &s))
                    .await
                    .map_err(|e| io_failure("storing the file", e))?;
                self.report(Some(view), self.downloading_report(view));
                Ok(vec![Link {
                    path,
                    target,
                    sha256: sha,
                }])
            }
            ArtifactType::Archive => {
                // Members already extracted from this archive (by an earlier `Staged` pass
                // of this revision, or a kept revision) are reused when their stored files
                // still verify: the archive may be gone from the server by now.
                if let Some(links) = archive_members_on_record(&self.journal, artifact) {
                    let to_check = links.clone();
                    let verified = blocking(move || {
                        Ok(to_check
                            .iter()
                            .all(|l| store::is_verified(&l.target, &l.sha256)))
                    })
                    .await
                    .unwrap_or(false);
                    if verified {
                        done(self);
                        return Ok(links);
                    }
                }
                let tmp = store::tmp_dir(settings);
                let temp = self
                    .download(artifact, &tmp, &progress)
                    .await
                    .map_err(fetch_failure)?;
                signature::verify_download(signature.as_ref(), &artifact.name, &temp).await?;
                let staging = tmp.join(format!("extract-{:016x}", rand::random::<u64>()));
                let members: Vec<String> =
                    artifact.members.iter().map(|m| m.from.clone()).collect();
                let limits = archive::Limits {
                    max_entries: 100_000,
                    max_bytes: settings.policy.max_artifact_size.saturating_mul(4),
                };
                let cas = store::cas_dir(settings);
                let (t, st) = (temp.clone(), staging.clone());
                let result = tokio::task::spawn_blocking(move || {
                    let refs: Vec<&str> = members.iter().map(String::as_str).collect();
                    let extracted = archive::extract_members(&t, &refs, &st, limits);
                    let _ = std::fs::remove_file(&t);
                    let extracted = extracted?;
                    let mut placed = Vec::new();
                    for e in extracted {
                        let target = store::place_cas(&e.path, &cas, &e.sha256)?;
                        placed.push((e.from, target, e.sha256));
                    }
                    let _ = std::fs::remove_dir_all(&st);
                    Ok::<_, archive::ArchiveError>(placed)
                })
                .await
                .map_err(|e| Failure {
                    reason: Reason::StagingFailed,
                    message: format!("artifact {}: {e}", artifact.name),
                })?;
                let placed = result.map_err(|e| Failure {
                    reason: match &e {
                        archive::ArchiveError::Io(io) if store::is_disk_full(io) => {
                            Reason::DiskFull
                        }
                        _ => Reason::StagingFailed,
                    },
                    message: format!("artifact {}: {e}", artifact.name),
                })?;
                self.report(Some(view), self.downloading_report(view));
                Ok(artifact
                    .members
                    .iter()
                    .filter_map(|m| {
                        placed.iter().find(|(from, _, _)| *from == m.from).map(
                            |(_, target, sha)| Link {
                                path: PathBuf::from(&m.to),
                                target: target.clone(),
                                sha256: sha.clone(),
                            },
                        )
                    })
                    .collect())
            }
        }
    }

    fn downloading_report(&self, view: &PlanView) -> Report {
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

    /// Swaps, refreshes, restarts, verifies; then commits or rolls back.
    async fn activate(&mut self, view: &PlanView) -> Result<(), AgentError> {
        let Some(flight) = self.journal.in_flight() else {
            return Ok(());
        };
        let revision = flight.revision().to_owned();
        let resumed = matches!(flight.step(), Step::Activating | Step::Verifying);
        let flight_links = flight.links().to_vec();
        self.journal.count_attempt()?;

        // Re-verify what is staged: a file may have changed since (or a crash hit).
        let to_check = flight_links.clone();
        let changed = blocking(move || {
            Ok(to_check
                .into_iter()
                .find(|l| !store::is_verified(&l.target, &l.sha256)))
        })
        .await
        .ok()
        .flatten();
        if let Some(link) = changed {
            let failure = Failure {
                reason: Reason::StagingFailed,
                message: format!(
                    "staged file {} no longer matches its sha256",
                    link.target.display()
                ),
            };
            if resumed {
                return self
                    .roll_back(Some(view), RollbackCause::Failed(failure))
                    .await;
            }
            self.journal.deny(failure.clone(), Utc::now())?;
            self.save().await?;
            self.report(
                Some(view),
                Report::new(Phase::Failed, failure.reason, failure.message),
            );
            return Ok(());
        }

        let removals = if resumed {
            self.journal.resume_activating()?
        } else {
            // Record what every managed path holds *before* the first swap, and which
            // links of the committed revision this one drops (they go, and come back on
            // a rollback, the same way).
            let backup_dir = store::backup_dir(&self.settings, &revision);
            let paths: Vec<PathBuf> = flight_links.iter().map(|l| l.path.clone()).collect();
            let committed = self
                .journal
                .committed()
                .map(|c| c.links().to_vec())
                .unwrap_or_default();
            let next = flight_links.clone();
            let before = blocking(move || {
                let mut before = paths
                    .into_iter()
                    .map(|path| {
                        let prior = links::capture_prior(&path, &backup_dir)?;
                        Ok(Before { path, prior })
                    })
                    .collect::<std::io::Result<Vec<_>>>()?;
                before.extend(journal::retired(&committed, &next, |l| {
                    links::points_at(&l.path, &l.target)
                }));
                Ok(before)
            })
            .await;
            let before = match before {
                Ok(before) => before,
                Err(e) => {
                    let failure = Failure {
                        reason: Reason::StagingFailed,
                        message: format!("cannot record the current links: {e}"),
                    };
                    self.journal.deny(failure.clone(), Utc::now())?;
                    self.save().await?;
                    self.report(
                        Some(view),
                        Report::new(Phase::Failed, failure.reason, failure.message),
                    );
                    return Ok(());
                }
            };
            self.journal.activating(before)?
        };
        self.save().await?;
        self.report(
            Some(view),
            Report::new(
                Phase::Activating,
                Reason::Activating,
                format!("activating revision {revision}"),
            ),
        );
        self.failpoint("activate.begin");

        if let Err(failure) = self
            .switch_to(&flight_links, &removals, &view.content)
            .await
        {
            return self
                .roll_back(Some(view), RollbackCause::Failed(failure))
                .await;
        }

        self.journal.verifying()?;
        self.save().await?;
        self.report(
            Some(view),
            Report::new(
                Phase::Verifying,
                Reason::Verifying,
                format!("verifying revision {revision}"),
            ),
        );
        self.failpoint("verify.begin");
        let checks = health::Plan::of(
            &view.content.health_checks,
            view.content.kubernetes_version.as_deref(),
            self.settings.activation.health_interval,
        );
        let result = {
            // The status shows the health clock, but writes at most every 5 s per node.
            let progress = |line: String| {
                self.failpoint("verify.progress");
                if self.progress_due(std::time::Duration::from_secs(5)) {
                    self.report(
                        Some(view),
                        Report::new(Phase::Verifying, Reason::Verifying, line),
                    );
                }
            };
            health::verify(
                &checks,
                self.host.systemd.as_ref(),
                self.host.probes.as_ref(),
                &progress,
            )
            .await
        };
        match result {
            Ok(()) => self.commit(view).await,
            Err(failure) => {
                self.roll_back(Some(view), RollbackCause::Failed(failure))
                    .await
            }
        }
    }

    /// Points every link at its target, removes the links the revision dropped, refreshes
    /// sysext (a dropped extension is unmerged), reloads, restarts units. Idempotent, so a
    /// resumed activation runs it again from the start.
    async fn switch_to(
        &self,
        targets: &[Link],
        removals: &[PathBuf],
        content: &UpdateContent,
    ) -> Result<(), Failure> {
        let swaps = targets.to_vec();
        let dropped = removals.to_vec();
        let lock = self.settings.paths.lock_file.clone();
        blocking(move || {
            for link in &swaps {
                links::swap_symlink(&link.path, &link.target)?;
                crate::failpoints::hit(&lock, "activate.swap");
            }
            for path in &dropped {
                links::remove_durably(path).map_err(|e| {
                    std::io::Error::new(e.kind(), format!("removing {}: {e}", path.display()))
                })?;
                crate::failpoints::hit(&lock, "activate.remove");
            }
            Ok(())
        })
        .await
        .map_err(|e| Failure {
            reason: Reason::StagingFailed,
            message: format!("cannot swap links: {e}"),
        })?;
        let extensions = &self.settings.paths.extensions_dir;
        let sysext_touched = targets.iter().any(|l| l.path.starts_with(extensions))
            || removals.iter().any(|p| p.starts_with(extensions));
        self.refresh(content, sysext_touched, "activate").await
    }

    /// Refreshes sysext (when `sysext_touched`), proves `content`'s extensions merged,
    /// reloads units when asked, restarts `content`'s units in order.
    /// `stage` ("activate" or "rollback") names the failpoints passed.
    async fn refresh(
        &self,
        content: &UpdateContent,
        sysext_touched: bool,
        stage: &'static str,
    ) -> Result<(), Failure> {
        let systemd = &self.host.systemd;
        if sysext_touched || content.has_sysext() {
            systemd
                .restart_unit(SYSEXT_UNIT)
                .await
                .map_err(|e| Failure {
                    reason: Reason::UnitFailed,
                    message: format!("refreshing extensions: {e}"),
                })?;
            for artifact in content
                .artifacts
                .iter()
                .filter(|a| a.kind == ArtifactType::Sysext)
            {
                let release = store::extension_release(&self.settings.paths, &artifact.name);
                let present = tokio::fs::try_exists(&release).await.unwrap_or(false);
                if !present {
                    return Err(Failure {
                        reason: Reason::ExtensionNotMerged,
                        message: format!(
                            "extension {} is not merged after refreshing {SYSEXT_UNIT}: {} is missing (image incompatible with this host?)",
                            artifact.name,
                            release.display()
                        ),
                    });
                }
            }
            self.failpoint(&format!("{stage}.sysext_refreshed"));
        }
        if content.daemon_reload() {
            systemd.daemon_reload().await.map_err(|e| Failure {
                reason: Reason::UnitFailed,
                message: format!("daemon-reload: {e}"),
            })?;
        }
        for unit in &content.activation.restart_units {
            systemd.restart_unit(unit).await.map_err(|e| Failure {
                reason: Reason::UnitFailed,
                message: e.to_string(),
            })?;
            self.failpoint(&format!("{stage}.unit_restarted"));
        }
        Ok(())
    }

    async fn commit(&mut self, view: &PlanView) -> Result<(), AgentError> {
        let revision = view.revision.clone();
        self.failpoint("commit.before");
        let dropped = self.journal.commit(Utc::now())?;
        self.save().await?;
        self.failpoint("commit.saved");
        tracing::info!(%revision, "committed");
        if let Some(dropped) = dropped {
            let candidates = dropped.links().iter().map(|l| l.target.clone()).collect();
            self.collect(candidates).await;
            let backups = store::backup_dir(&self.settings, dropped.revision());
            let _ = tokio::fs::remove_dir_all(backups).await;
        }
        self.report(
            Some(view),
            Report::new(
                Phase::Succeeded,
                Reason::Succeeded,
                format!("revision {revision} is committed and healthy"),
            ),
        );
        Ok(())
    }

    /// Restores what ran before the in-flight revision, and verifies it.
    async fn roll_back(
        &mut self,
        view: Option<&PlanView>,
        cause: RollbackCause,
    ) -> Result<(), AgentError> {
        if self.journal.in_flight().is_none() {
            return Ok(());
        }
        let failure = match &cause {
            RollbackCause::Failed(f) => Some(f.clone()),
            RollbackCause::Superseded => None,
        };
        let flight = self.journal.rolling_back(failure.clone())?.clone();
        self.save().await?;
        self.failpoint("rollback.begin");
        // Report only about the revision the plan asks for.
        let view = view.filter(|v| v.revision == flight.revision());
        let why = failure.as_ref().map_or_else(
            || "the plan changed".to_owned(),
            |f| format!("{}: {}", f.reason, f.message),
        );
        tracing::warn!(revision = %flight.revision(), %why, "rolling back");
        self.report(
            view,
            Report::new(
                Phase::RollingBack,
                failure.as_ref().map_or(Reason::Activating, |f| f.reason),
                format!("rolling back revision {}: {why}", flight.revision()),
            ),
        );

        let outcome = self.restore(&flight).await;
        match outcome {
            Ok(()) => {
                self.journal.rolled_back(Utc::now())?;
                self.save().await?;
                self.failpoint("rollback.saved");
                self.collect(flight_targets(&flight)).await;
                let backups = store::backup_dir(&self.settings, flight.revision());
                let _ = tokio::fs::remove_dir_all(backups).await;
                if failure.is_some() {
                    self.report(
                        view,
                        Report::new(
                            Phase::RolledBack,
                            Reason::RolledBack,
                            format!(
                                "rolled back revision {} ({why}); the previous revision runs and is healthy",
                                flight.revision()
                            ),
                        ),
                    );
                }
            }
            Err(rollback) => {
                let degraded = Failure {
                    reason: Reason::RollbackFailed,
                    message: format!(
                        "rollback of revision {} failed: {}; it was rolled back because {why}",
                        flight.revision(),
                        rollback.message
                    ),
                };
                tracing::error!(message = %degraded.message, "rollback failed; node degraded");
                self.journal.rollback_failed(degraded.clone(), Utc::now())?;
                self.save().await?;
                let mut report = Report::new(
                    Phase::Failed,
                    Reason::RollbackFailed,
                    degraded.message.clone(),
                );
                report.degraded = Some(degraded);
                self.report(view, report);
            }
        }
        Ok(())
    }

    async fn restore(&self, flight: &InFlight) -> Result<(), Failure> {
        let before = flight.before().to_vec();
        let sysext_touched = before
            .iter()
            .any(|b| b.path.starts_with(&self.settings.paths.extensions_dir));
        let lock = self.settings.paths.lock_file.clone();
        blocking(move || {
            for b in before.iter().rev() {
                links::restore_prior(&b.path, &b.prior)?;
                crate::failpoints::hit(&lock, "rollback.restore");
            }
            Ok(())
        })
        .await
        .map_err(|e| Failure {
            reason: Reason::RollbackFailed,
            message: format!("cannot restore links: {e}"),
        })?;
        // What runs now is the committed revision (or, on a first install, whatever ran
        // before): restart the units the failed revision restarted, then check them.
        let committed = self.journal.committed().map(|c| c.content());
        let mut content = committed.cloned().unwrap_or_else(|| UpdateContent {
            artifacts: Vec::new(),
            ..flight.content().clone()
        });
        content.activation.restart_units = flight.content().activation.restart_units.clone();
        content.activation.daemon_reload =
            Some(flight.content().daemon_reload() || content.daemon_reload());
        self.refresh(&content, sysext_touched, "rollback").await?;
        let mut checks = health::Plan::of(
            &content.health_checks,
            content.kubernetes_version.as_deref(),
            self.settings.activation.health_interval,
        );
        if committed.is_none() {
            // Nothing committed: the expected kubelet version is unknown.
            checks.kubelet_version = None;
        }
        let progress = |line: String| {
            self.failpoint("rollback.verify");
            (self.host.notify)(&format!("rolling back: {line}"));
        };
        health::verify(
            &checks,
            self.host.systemd.as_ref(),
            self.host.probes.as_ref(),
            &progress,
        )
        .await
    }
}

fn action_name(action: &Action) -> &'static str {
    match action {
        Action::Idle => "Idle",
        Action::StayDegraded(_) => "StayDegraded",
        Action::UpToDate => "UpToDate",
        Action::Refuse(_) => "Refuse",
        Action::Deny(_) => "Deny",
        Action::Stage { activate: false } => "Stage",
        Action::Stage { activate: true } => "StageAndActivate",
        Action::ResumeActivation => "ResumeActivation",
        Action::RollBack(_) => "RollBack",
    }
}

/// The file name a sysext image is stored under: the URL's last segment.
fn sysext_file_name(artifact: &Artifact) -> String {
    url::Url::parse(&artifact.url)
        .ok()
        .and_then(|u| inplace_proto::validate::url_file_name(&u).map(str::to_owned))
        .unwrap_or_else(|| format!("{}.raw", artifact.name))
}

/// The links `artifact`'s members would get from files the journal already records for
/// the same archive (same sha256, same member names) in the in-flight, committed or
/// previous revision; `None` unless every member has one. The files still need checking.
fn archive_members_on_record(journal: &Journal, artifact: &Artifact) -> Option<Vec<Link>> {
    let kept = journal
        .in_flight()
        .map(|f| (f.content(), f.links()))
        .into_iter()
        .chain(journal.committed().map(|c| (c.content(), c.links())))
        .chain(journal.previous().map(|c| (c.content(), c.links())));
    artifact
        .members
        .iter()
        .map(|member| {
            kept.clone().find_map(|(content, links)| {
                let recorded_to = content
                    .artifacts
                    .iter()
                    .filter(|a| a.kind == ArtifactType::Archive && a.sha256 == artifact.sha256)
                    .flat_map(|a| a.members.iter())
                    .find(|m| m.from == member.from)?;
                let link = links
                    .iter()
                    .find(|l| l.path == std::path::Path::new(&recorded_to.to))?;
                Some(Link {
                    path: PathBuf::from(&member.to),
                    target: link.target.clone(),
                    sha256: link.sha256.clone(),
                })
            })
        })
        .collect()
}

/// Every stored file a kept revision points at.
fn referenced(journal: &Journal) -> HashSet<PathBuf> {
    let committed = journal.committed().into_iter().flat_map(|c| c.links());
    let previous = journal.previous().into_iter().flat_map(|c| c.links());
    let flight = journal.in_flight().into_iter().flat_map(|c| c.links());
    committed
        .chain(previous)
        .chain(flight)
        .map(|l| l.target.clone())
        .collect()
}

fn flight_targets(flight: &InFlight) -> Vec<PathBuf> {
    flight.links().iter().map(|l| l.target.clone()).collect()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}
