//! The agent's metrics, owned by one struct (no global registry), kept in the Prometheus
//! project's client types and rendered in the Prometheus text format (0.0.4) by its
//! encoder; `metrics_server` serves them.
//!
//! They are recorded where the agent reports and commits, not along the way: the
//! coordinator hands every status report to [`AgentMetrics::reported`], which turns the
//! stream of reports into phase durations, update results and failures by reason; the
//! committed revision comes from the journal; downloads are metered around the fetcher.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use inplace_proto::{Phase, Reason};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of a scrape answer.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Histogram bounds for step durations, in seconds: sub-second swaps up to hour-long
/// downloads.
const BUCKETS: [f64; 12] = [
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Every phase, in the order the state set is rendered.
const PHASES: [Phase; 9] = [
    Phase::Pending,
    Phase::Downloading,
    Phase::Staged,
    Phase::Activating,
    Phase::Verifying,
    Phase::Succeeded,
    Phase::RollingBack,
    Phase::RolledBack,
    Phase::Failed,
];

/// A timed step of an update: the `step` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// One artifact's transfer with its sha256 check (successful downloads only).
    Download,
    /// A revision's whole staging: every download, verification and store (the
    /// `Downloading` phase).
    Stage,
    /// Swapping links, refreshing sysext, restarting units (`Activating`).
    Activate,
    /// The health-check window (`Verifying`).
    Health,
    /// Restoring and re-checking the previous revision (`RollingBack`).
    Rollback,
}

impl Step {
    fn as_str(self) -> &'static str {
        match self {
            Step::Download => "download",
            Step::Stage => "stage",
            Step::Activate => "activate",
            Step::Health => "health",
            Step::Rollback => "rollback",
        }
    }

    /// The step a phase times; `None` for phases where the agent waits or is done.
    fn of(phase: Phase) -> Option<Step> {
        match phase {
            Phase::Downloading => Some(Step::Stage),
            Phase::Activating => Some(Step::Activate),
            Phase::Verifying => Some(Step::Health),
            Phase::RollingBack => Some(Step::Rollback),
            Phase::Pending
            | Phase::Staged
            | Phase::Succeeded
            | Phase::RolledBack
            | Phase::Failed => None,
        }
    }
}

/// What one status report says, as far as the metrics care.
#[derive(Debug, Clone, Copy)]
pub struct Reported<'a> {
    /// The plan revision the report is about (`None` when there is no plan to report to).
    pub revision: Option<&'a str>,
    /// The phase reported.
    pub phase: Phase,
    /// The Ready condition's reason (for a rollback: the reason it rolls back).
    pub reason: Reason,
}

/// The report being shown, and what it needs to close its phase.
#[derive(Debug, Clone)]
struct Current {
    revision: Option<String>,
    phase: Phase,
    reason: Reason,
    since: Instant,
    /// Whether this process worked on the revision (downloaded, activated, rolled back),
    /// so a final phase ends an update rather than restating an old result.
    worked: bool,
}

/// The update results counted by `inplace_agent_updates_total`.
const RESULTS: [&str; 3] = ["succeeded", "rolled_back", "failed"];

/// One label: its name and value.
type Label = [(&'static str, &'static str); 1];
/// A step-duration histogram with the agent's buckets.
type StepHistograms = Family<Label, Histogram, fn() -> Histogram>;

/// Every metric the agent exports.
#[derive(Debug)]
pub struct AgentMetrics {
    registry: Registry,
    /// The report being shown: what [`AgentMetrics::reported`] compares the next one with.
    current: Mutex<Option<Current>>,
    steps: StepHistograms,
    downloaded_bytes: Counter,
    updates: Family<Label, Counter>,
    failures: Family<Label, Counter>,
    revision: Family<[(&'static str, String); 2], Gauge>,
    phase: Family<[(&'static str, String); 1], Gauge>,
    last_transition: Gauge<f64, AtomicU64>,
}

impl Default for AgentMetrics {
    fn default() -> AgentMetrics {
        let metrics = AgentMetrics {
            registry: Registry::default(),
            current: Mutex::default(),
            steps: Family::new_with_constructor(|| Histogram::new(BUCKETS)),
            downloaded_bytes: Counter::default(),
            updates: Family::default(),
            failures: Family::default(),
            revision: Family::default(),
            phase: Family::default(),
            last_transition: Gauge::default(),
        };
        for result in RESULTS {
            let _ = metrics.updates.get_or_create(&[("result", result)]);
        }
        metrics.show_phase(None);
        let mut registry = Registry::default();
        // The client appends the period that ends each help text.
        registry.register(
            "inplace_agent_step_duration_seconds",
            "Time an update step took: download (one artifact), stage, activate, health, rollback",
            metrics.steps.clone(),
        );
        registry.register(
            "inplace_agent_downloaded_bytes",
            "Artifact bytes received, failed and abandoned downloads included",
            metrics.downloaded_bytes.clone(),
        );
        registry.register(
            "inplace_agent_updates",
            "Updates this agent carried to an end, by result",
            metrics.updates.clone(),
        );
        registry.register(
            "inplace_agent_failures",
            "Failed or refused updates, by condition reason",
            metrics.failures.clone(),
        );
        registry.register(
            "inplace_agent_revision_info",
            "The committed revision this node runs (absent before the first commit)",
            metrics.revision.clone(),
        );
        registry.register(
            "inplace_agent_phase",
            "1 for the phase last reported about the plan, 0 for the others",
            metrics.phase.clone(),
        );
        registry.register(
            "inplace_agent_last_transition_timestamp_seconds",
            "When the reported phase last changed, in seconds since the Unix epoch (0: not yet)",
            metrics.last_transition.clone(),
        );
        AgentMetrics {
            registry,
            ..metrics
        }
    }
}

impl AgentMetrics {
    /// Records a status report made at `at` (`now` is the wall clock of the same moment).
    /// Repeating the report being shown (a relist, download progress) changes nothing; a
    /// new phase or revision closes the previous phase's step, and a final phase reached
    /// by work of this process counts the update's result and its failure reasons.
    pub fn reported(&self, report: Reported<'_>, at: Instant, now: SystemTime) {
        // A panic while the lock was held leaves a report behind, still worth comparing.
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let previous = current.take();
        if let Some(p) = &previous
            && p.revision.as_deref() == report.revision
            && p.phase == report.phase
            && p.reason == report.reason
        {
            *current = previous;
            return;
        }
        if let Some(p) = &previous
            && p.phase != report.phase
            && let Some(step) = Step::of(p.phase)
        {
            self.observe(step, at.saturating_duration_since(p.since));
        }
        let same_revision = previous
            .as_ref()
            .is_some_and(|p| p.revision.as_deref() == report.revision);
        let worked = Step::of(report.phase).is_some()
            || (same_revision && previous.as_ref().is_some_and(|p| p.worked));
        let rolled_back_for = previous
            .as_ref()
            .filter(|p| same_revision && p.phase == Phase::RollingBack)
            .map(|p| p.reason);
        if report.phase.is_final() && worked {
            let result = match report.phase {
                Phase::Succeeded => "succeeded",
                Phase::RolledBack => "rolled_back",
                _ => "failed",
            };
            self.updates.get_or_create(&[("result", result)]).inc();
        }
        let failed = |reason: Reason| {
            self.failures
                .get_or_create(&[("reason", reason.as_str())])
                .inc();
        };
        match report.phase {
            // A refusal (invalid plan, policy, downgrade, …) is a failure of the plan even
            // though nothing was done; a denied revision or a node staying degraded only
            // restates a failure counted before.
            Phase::Failed
                if worked
                    || !matches!(
                        report.reason,
                        Reason::RevisionDenied | Reason::RollbackFailed
                    ) =>
            {
                if let Some(cause) = rolled_back_for {
                    failed(cause);
                }
                failed(report.reason);
            }
            Phase::RolledBack => {
                if let Some(cause) = rolled_back_for {
                    failed(cause);
                }
            }
            _ => {}
        }
        if previous
            .as_ref()
            .is_none_or(|p| p.phase != report.phase || !same_revision)
            && let Ok(since_epoch) = now.duration_since(SystemTime::UNIX_EPOCH)
        {
            self.last_transition.set(since_epoch.as_secs_f64());
        }
        self.show_phase(Some(report.phase));
        *current = Some(Current {
            revision: report.revision.map(str::to_owned),
            phase: report.phase,
            reason: report.reason,
            since: if previous.as_ref().is_some_and(|p| p.phase == report.phase) && same_revision {
                previous.as_ref().map_or(at, |p| p.since)
            } else {
                at
            },
            worked: worked && !report.phase.is_final(),
        });
    }

    /// Records the committed revision (what the node runs) and its Kubernetes version.
    pub fn running(&self, revision: Option<&str>, kubernetes_version: Option<&str>) {
        self.revision.clear();
        if let Some(revision) = revision {
            self.revision
                .get_or_create(&[
                    ("revision", revision.to_owned()),
                    (
                        "kubernetes_version",
                        kubernetes_version.unwrap_or_default().to_owned(),
                    ),
                ])
                .set(1);
        }
    }

    /// Starts metering one artifact's download: bytes count as they arrive (also when the
    /// download fails or is abandoned), the duration once it succeeds.
    pub fn download(&self) -> DownloadMeter<'_> {
        DownloadMeter {
            metrics: self,
            started: Instant::now(),
            last: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail, and every label is a plain string.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry);
        text
    }

    fn observe(&self, step: Step, took: Duration) {
        self.steps
            .get_or_create(&[("step", step.as_str())])
            .observe(took.as_secs_f64());
    }

    /// The phase state set: 1 for `shown`, 0 for every other phase.
    fn show_phase(&self, shown: Option<Phase>) {
        for phase in PHASES {
            self.phase
                .get_or_create(&[("phase", format!("{phase:?}"))])
                .set(i64::from(shown == Some(phase)));
        }
    }
}

/// Meters one download; see [`AgentMetrics::download`]. Pass [`DownloadMeter::progress`]
/// the fetcher's byte counts.
#[derive(Debug)]
pub struct DownloadMeter<'a> {
    metrics: &'a AgentMetrics,
    started: Instant,
    last: AtomicU64,
    bytes: AtomicU64,
}

impl DownloadMeter<'_> {
    /// The fetcher reports `done` bytes of the file so far. A resumed attempt continues
    /// the count; a smaller count means the fetcher started over from zero, so all of it
    /// was transferred again.
    pub fn progress(&self, done: u64) {
        let last = self.last.swap(done, Ordering::Relaxed);
        let received = if done >= last { done - last } else { done };
        self.bytes.fetch_add(received, Ordering::Relaxed);
    }

    /// The download succeeded: its duration counts.
    pub fn succeeded(self) {
        self.metrics.observe(Step::Download, self.started.elapsed());
    }
}

impl Drop for DownloadMeter<'_> {
    fn drop(&mut self) {
        self.metrics
            .downloaded_bytes
            .inc_by(self.bytes.load(Ordering::Relaxed));
    }
}

#[cfg(test)]
mod tests;
