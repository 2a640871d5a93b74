//! What the status showed about the plan being handled, kept between reports: the
//! conditions and times the next status starts from, and each artifact's download progress
//! (how many bytes are in, which source served them, when progress was last published).

use std::time::{Duration, Instant};

use inplace_proto::{ArtifactProgress, DesiredState, NodeUpdatePlanStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::machine::PlanView;
use crate::update::Agent;

/// What the status showed about the plan being handled, kept between reports.
#[derive(Default, Debug, Clone)]
pub(in crate::update) struct Shown {
    pub(super) generation: Option<i64>,
    pub(super) target: Option<String>,
    pub(super) desired: Option<DesiredState>,
    pub(super) artifacts: Vec<ArtifactProgress>,
    pub(super) conditions: Vec<Condition>,
    pub(super) started_at: Option<Time>,
    pub(super) finished_at: Option<Time>,
    /// When download progress was last published (at most about once a second).
    pub(super) progress_published: Option<Instant>,
}

impl Shown {
    /// Takes what the status now says as what the next report starts from.
    pub(super) fn remember(&mut self, status: &NodeUpdatePlanStatus) {
        self.conditions = status.conditions.clone();
        self.started_at = status.started_at.clone();
        self.finished_at = status.finished_at.clone();
    }

    /// Bytes downloaded of all artifacts, and of how many (when every size is known).
    pub(super) fn download_totals(&self) -> (u64, Option<u64>) {
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

impl Agent {
    /// Starts showing `view`'s plan; a new target revision starts afresh.
    pub(in crate::update) fn show_plan(&self, view: Option<&PlanView>) {
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
    pub(in crate::update) fn set_bytes(&self, index: usize, done: u64) -> bool {
        if let Ok(mut shown) = self.shown.lock()
            && let Some(a) = shown.artifacts.get_mut(index)
        {
            a.bytes_done = i64::try_from(done).unwrap_or(i64::MAX);
        }
        self.progress_due(Duration::from_secs(1))
    }

    /// Records the URL that served an artifact's bytes (shown with the next report).
    pub(in crate::update) fn set_source(&self, index: usize, source: String) {
        if let Ok(mut shown) = self.shown.lock()
            && let Some(a) = shown.artifacts.get_mut(index)
        {
            a.source = Some(source);
        }
    }

    /// Whether at least `every` passed since progress was last published (and if so,
    /// notes that it is being published now).
    pub(in crate::update) fn progress_due(&self, every: Duration) -> bool {
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
}
