//! Activation and its two endings: swap to the staged revision, verify its health for the
//! whole window, then commit it — or roll back to what ran before.

use std::path::PathBuf;
use std::time::Duration;

use chrono::Utc;
use inplace_proto::Reason;

use super::collect::flight_targets;
use super::report::Report;
use super::{Agent, AgentError, blocking};
use crate::health;
use crate::journal::{self, Before, Failure, InFlight, Link, Step};
use crate::links;
use crate::machine::{PlanView, RollbackCause};
use crate::store;

impl Agent {
    /// Swaps, refreshes, restarts, verifies; then commits or rolls back. Resumes an
    /// activation a restart interrupted (the attempt counter bounds that).
    pub(super) async fn activate(&mut self, view: &PlanView) -> Result<(), AgentError> {
        let Some(flight) = self.journal.in_flight() else {
            return Ok(());
        };
        let revision = flight.revision().to_owned();
        let resumed = matches!(flight.step(), Step::Activating | Step::Verifying);
        let booted = flight.step() == Step::Verifying && flight.reboot().is_some();
        let flight_links = flight.links().to_vec();
        if booted {
            // The reboot did the activation; a restart interrupted the checks after it.
            self.journal.count_attempt()?;
            self.save().await?;
            return self.verify_boot(view).await;
        }
        if !resumed && view.content.reboots() && !self.may_reboot(view).await? {
            return Ok(());
        }
        self.journal.count_attempt()?;

        // Re-verify what is staged: a file may have changed since (or a crash hit).
        if let Some(failure) = changed_since_staged(&flight_links).await {
            if resumed {
                return self
                    .roll_back(Some(view), RollbackCause::Failed(failure))
                    .await;
            }
            return self.deny(view, failure, None).await;
        }
        let removals = if resumed {
            self.journal.resume_activating()?
        } else {
            match self.record_priors(&revision, &flight_links).await {
                Ok(before) => self.journal.activating(before)?,
                Err(failure) => return self.deny(view, failure, None).await,
            }
        };
        self.save().await?;
        self.report(Some(view), Report::activating(&revision));
        self.failpoint("activate.begin");
        if view.content.reboots() {
            return self
                .activate_by_reboot(view, &flight_links, &removals)
                .await;
        }

        if let Err(failure) = self
            .switch_to(&flight_links, &removals, &view.content)
            .await
        {
            return self
                .roll_back(Some(view), RollbackCause::Failed(failure))
                .await;
        }
        match self.verify(view, &revision).await? {
            Ok(()) => self.commit(view).await,
            Err(failure) => {
                self.roll_back(Some(view), RollbackCause::Failed(failure))
                    .await
            }
        }
    }

    /// What every managed path holds *before* the first swap, and the links of the
    /// committed revision this one drops (they go, and come back on a rollback, the same
    /// way). Regular files are copied to the revision's backup directory.
    async fn record_priors(
        &self,
        revision: &str,
        flight_links: &[Link],
    ) -> Result<Vec<Before>, Failure> {
        let backup_dir = store::backup_dir(&self.settings, revision);
        let paths: Vec<PathBuf> = flight_links.iter().map(|l| l.path.clone()).collect();
        let committed = self
            .journal
            .committed()
            .map(|c| c.links().to_vec())
            .unwrap_or_default();
        let next = flight_links.to_vec();
        blocking(move || {
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
        .await
        .map_err(|e| Failure {
            reason: Reason::StagingFailed,
            message: format!("cannot record the current links: {e}"),
        })
    }

    /// Journal `Verifying`, then the plan's health checks for the whole window. The
    /// outer `Err` stops the agent; the inner one is the revision's failure.
    async fn verify(
        &mut self,
        view: &PlanView,
        revision: &str,
    ) -> Result<Result<(), Failure>, AgentError> {
        self.journal.verifying()?;
        self.save().await?;
        Ok(self.check_health(view, revision).await)
    }

    /// The plan's health checks for the whole window, reported as they go.
    pub(super) async fn check_health(
        &self,
        view: &PlanView,
        revision: &str,
    ) -> Result<(), Failure> {
        self.report(
            Some(view),
            Report::verifying(format!("verifying revision {revision}")),
        );
        self.failpoint("verify.begin");
        let checks = health::Plan::of(
            &view.content.health_checks,
            view.content.kubernetes_version.as_deref(),
            self.settings.activation.health_interval,
        );
        // The status shows the health clock, but writes at most every 5 s per node.
        let progress = |line: String| {
            self.failpoint("verify.progress");
            if self.progress_due(Duration::from_secs(5)) {
                self.report(Some(view), Report::verifying(line));
            }
        };
        health::verify(
            &checks,
            self.host.systemd.as_ref(),
            self.host.probes.as_ref(),
            &progress,
        )
        .await
    }

    /// The verified revision becomes the committed one; the revision that falls off (two
    /// stay on disk) has its files and backups collected.
    pub(super) async fn commit(&mut self, view: &PlanView) -> Result<(), AgentError> {
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
            Report::committed(&revision, Some(&view.content)),
        );
        Ok(())
    }

    /// Restores what ran before the in-flight revision, and verifies it.
    pub(super) async fn roll_back(
        &mut self,
        view: Option<&PlanView>,
        cause: RollbackCause,
    ) -> Result<(), AgentError> {
        if self.journal.in_flight().is_none() {
            return Ok(());
        }
        if self.journal.step() == Some(Step::RebootingBack) {
            return self.finish_reboot_back(view).await;
        }
        let failure = match cause {
            RollbackCause::Failed(f) => Some(f),
            RollbackCause::Superseded => None,
        };
        let flight = self.journal.rolling_back(failure.clone())?.clone();
        self.save().await?;
        self.failpoint("rollback.begin");
        // Report only about the revision the plan asks for.
        let view = view.filter(|v| v.revision == flight.revision());
        let why = why_rolled_back(failure.as_ref());
        tracing::warn!(revision = %flight.revision(), %why, "rolling back");
        self.report(
            view,
            Report::rolling_back(flight.revision(), failure.as_ref(), &why),
        );
        if flight.reboot().is_some() {
            // The node booted into it: only a reboot brings back what ran before.
            return self.reboot_back(view, &flight, &why).await;
        }
        match self.restore(&flight).await {
            Ok(()) => self.rolled_back(view, &flight, &why).await,
            Err(rollback) => self.rollback_failed(view, &flight, &why, rollback).await,
        }
    }

    /// The rollback of `flight` (rolled back because `why`) failed: the node is degraded.
    pub(super) async fn rollback_failed(
        &mut self,
        view: Option<&PlanView>,
        flight: &InFlight,
        why: &str,
        rollback: Failure,
    ) -> Result<(), AgentError> {
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
        self.report(view, Report::rollback_failed(degraded));
        Ok(())
    }

    /// What ran before runs again: the journal says so, `flight`'s files and backups are
    /// collected, and a failed revision is reported rolled back (a superseded one is not
    /// reported: the plan has moved on).
    pub(super) async fn rolled_back(
        &mut self,
        view: Option<&PlanView>,
        flight: &InFlight,
        why: &str,
    ) -> Result<(), AgentError> {
        self.journal.rolled_back(Utc::now())?;
        self.save().await?;
        self.failpoint("rollback.saved");
        self.collect(flight_targets(flight)).await;
        let backups = store::backup_dir(&self.settings, flight.revision());
        let _ = tokio::fs::remove_dir_all(backups).await;
        if flight.failure().is_some() {
            self.report(view, Report::rolled_back(flight.revision(), why));
        }
        Ok(())
    }
}

/// Why a revision is rolled back, for the reports (`None`: the plan moved on).
pub(super) fn why_rolled_back(failure: Option<&Failure>) -> String {
    failure.map_or_else(
        || "the plan changed".to_owned(),
        |f| format!("{}: {}", f.reason, f.message),
    )
}

/// The failure of the first staged file that no longer matches its sha256, if any.
async fn changed_since_staged(staged: &[Link]) -> Option<Failure> {
    let to_check = staged.to_vec();
    let changed = blocking(move || {
        Ok(to_check
            .into_iter()
            .find(|l| !store::still_staged(&l.target, &l.sha256)))
    })
    .await
    .ok()
    .flatten()?;
    Some(Failure {
        reason: Reason::StagingFailed,
        message: format!(
            "staged file {} no longer matches its sha256",
            changed.target.display()
        ),
    })
}
