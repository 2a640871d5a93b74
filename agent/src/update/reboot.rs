//! A revision activated by a reboot (`activation.mode: Reboot`, or one artifact's
//! `activation: Reboot`): the links are swapped as for any activation, then — instead of
//! refreshing extensions and restarting units — the reboot is journaled with this boot's
//! ID and asked of logind. The agent that starts in the next boot sees the boot ID changed,
//! checks that the boot brought the revision (links in place, extensions merged) and runs
//! the health checks; then it commits, or restores the links and reboots again into the
//! previous revision, verifies that and reports `RolledBack`.
//!
//! A blocking shutdown inhibitor is waited for, never overridden: before anything is
//! swapped (the plan may still move on meanwhile), and again if one is taken between the
//! check and the call (logind refuses then, `power.rs`).

use std::path::PathBuf;

use inplace_proto::Reason;

use super::activation::why_rolled_back;
use super::report::Report;
use super::{Agent, AgentError};
use crate::journal::{Failure, InFlight, Link};
use crate::links;
use crate::machine::{self, PlanView, RollbackCause};
use crate::power::blocking_reboot;

/// How asking for a reboot ended.
enum Asked {
    /// logind accepted it: the node goes down.
    Accepted,
    /// logind refused it and no inhibitor explains why.
    Refused(Failure),
}

impl Agent {
    /// Whether a reboot activation of the plan's revision may start: this boot's ID is
    /// known (the journal needs it) and no inhibitor blocks a reboot (waited for; false
    /// when the plan moved on meanwhile: nothing was touched). A revision on a node whose
    /// boot ID cannot be read is denied.
    pub(super) async fn may_reboot(&mut self, view: &PlanView) -> Result<bool, AgentError> {
        if self.boot_id.is_none() {
            let failure = Failure {
                reason: Reason::RebootFailed,
                message: "this boot's ID cannot be read (/proc/sys/kernel/random/boot_id, or the unit's boot_id credential): a reboot could not be told from a restart".to_owned(),
            };
            self.deny(view, failure, None).await?;
            return Ok(false);
        }
        let mut plans = self.plans.clone();
        loop {
            let Some(blocking) = self.reboot_blocked().await else {
                return Ok(true);
            };
            self.report(
                Some(view),
                Report::reboot_inhibited(&view.revision, &blocking, false),
            );
            tokio::select! {
                () = tokio::time::sleep(self.settings.activation.health_interval) => {}
                () = super::staging::moved_on(plans.as_mut(), &view.revision) => return Ok(false),
            }
        }
    }

    /// Who blocks a reboot now, if anyone. An unreadable list blocks nothing here: logind
    /// itself refuses a reboot an inhibitor blocks.
    async fn reboot_blocked(&self) -> Option<String> {
        match self.host.power.inhibitors().await {
            Ok(all) => blocking_reboot(&all),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list inhibitors; logind checks them");
                None
            }
        }
    }

    /// `Activating` a reboot revision: swap the links (nothing that runs is told), journal
    /// the reboot with this boot's ID, ask for it.
    pub(super) async fn activate_by_reboot(
        &mut self,
        view: &PlanView,
        targets: &[Link],
        removals: &[PathBuf],
    ) -> Result<(), AgentError> {
        if let Err(failure) = self.swap_links(targets, removals).await {
            return self
                .roll_back(Some(view), RollbackCause::Failed(failure))
                .await;
        }
        let boot = self.boot_id.clone().unwrap_or_default();
        self.journal.rebooting(&boot)?;
        self.save().await?;
        self.failpoint("reboot.journaled");
        self.reboot_into(Some(view), &view.revision).await
    }

    /// The step `Rebooting`, found by a (re)started agent: in the boot that asked for it,
    /// ask again (the agent stopped before the node went down); in a later boot, journal
    /// that it happened and verify it. True when the plan must be decided on again (the
    /// boot is verified only while the plan still asks for the revision; otherwise it is
    /// rolled back, superseded).
    pub(super) async fn resume_reboot(
        &mut self,
        view: Option<&PlanView>,
    ) -> Result<bool, AgentError> {
        let Some(flight) = self.journal.in_flight().cloned() else {
            return Ok(false);
        };
        let happened = flight
            .reboot()
            .is_some_and(|r| r.happened(self.boot_id.as_deref()));
        if !happened {
            let view = view.filter(|v| v.revision == flight.revision());
            self.reboot_into(view, flight.revision()).await?;
            return Ok(false);
        }
        self.journal.rebooted()?;
        self.save().await?;
        self.failpoint("reboot.booted");
        tracing::info!(revision = %flight.revision(), "booted into the revision; verifying");
        match view.filter(|_| machine::still_wanted(view, flight.revision())) {
            Some(view) => {
                self.verify_boot(view).await?;
                Ok(false)
            }
            None => Ok(true),
        }
    }

    /// Asks logind to reboot into the revision (inhibitors waited for); a refusal no
    /// inhibitor explains rolls the revision back without a reboot (it never booted).
    async fn reboot_into(
        &mut self,
        view: Option<&PlanView>,
        revision: &str,
    ) -> Result<(), AgentError> {
        match self.ask_reboot(view, revision, false).await {
            Asked::Accepted => Ok(()),
            Asked::Refused(failure) => {
                self.journal.reboot_refused(failure.clone())?;
                self.save().await?;
                self.roll_back(view, RollbackCause::Failed(failure)).await
            }
        }
    }

    /// Waits until no inhibitor blocks a reboot (reported), then asks logind for it.
    /// `back`: the reboot into the previous revision.
    async fn ask_reboot(&self, view: Option<&PlanView>, revision: &str, back: bool) -> Asked {
        loop {
            if let Some(blocking) = self.reboot_blocked().await {
                self.report(view, Report::reboot_inhibited(revision, &blocking, back));
                tokio::time::sleep(self.settings.activation.health_interval).await;
                continue;
            }
            match self.host.power.reboot().await {
                Ok(()) => {
                    tracing::info!(%revision, back, "reboot asked of logind");
                    self.report(view, Report::rebooting(revision, back));
                    return Asked::Accepted;
                }
                // An inhibitor taken since the check: wait for it like any other.
                Err(_) if self.reboot_blocked().await.is_some() => {}
                Err(e) => {
                    return Asked::Refused(Failure {
                        reason: Reason::RebootFailed,
                        message: format!("logind refused the reboot: {e}"),
                    });
                }
            }
        }
    }

    /// After the boot: the revision's links in place and its extensions merged, then its
    /// health checks for the whole window; commit, or roll back (by a reboot).
    pub(super) async fn verify_boot(&mut self, view: &PlanView) -> Result<(), AgentError> {
        let Some(flight) = self.journal.in_flight().cloned() else {
            return Ok(());
        };
        let checked = match self.boot_brought(&flight).await {
            Ok(()) => self.check_health(view, &view.revision).await,
            Err(failure) => Err(failure),
        };
        match checked {
            Ok(()) => self.commit(view).await,
            Err(failure) => {
                self.roll_back(Some(view), RollbackCause::Failed(failure))
                    .await
            }
        }
    }

    /// Whether the boot brought `flight`: every link points at its file, every extension
    /// is merged.
    async fn boot_brought(&self, flight: &InFlight) -> Result<(), Failure> {
        if let Some(link) = flight
            .links()
            .iter()
            .find(|l| !links::points_at(&l.path, &l.target))
        {
            return Err(Failure {
                reason: Reason::RebootFailed,
                message: format!(
                    "after the reboot {} does not point at {}",
                    link.path.display(),
                    link.target.display()
                ),
            });
        }
        self.extensions_merged(flight.content(), "the reboot").await
    }

    /// Rolls back `flight`, which the node booted into: the prior links back, the reboot
    /// into them journaled and asked for.
    pub(super) async fn reboot_back(
        &mut self,
        view: Option<&PlanView>,
        flight: &InFlight,
        why: &str,
    ) -> Result<(), AgentError> {
        if let Err(failure) = self.restore_links(flight).await {
            return self.rollback_failed(view, flight, why, failure).await;
        }
        let boot = self.boot_id.clone().unwrap_or_default();
        self.journal.rebooting_back(&boot)?;
        self.save().await?;
        self.failpoint("rollback.reboot_journaled");
        self.ask_reboot_back(view, flight, why).await
    }

    /// Asks for the reboot into the previous revision; a refusal degrades the node.
    async fn ask_reboot_back(
        &mut self,
        view: Option<&PlanView>,
        flight: &InFlight,
        why: &str,
    ) -> Result<(), AgentError> {
        match self.ask_reboot(view, flight.revision(), true).await {
            Asked::Accepted => Ok(()),
            Asked::Refused(failure) => self.rollback_failed(view, flight, why, failure).await,
        }
    }

    /// The step `RebootingBack`, found by a (re)started agent: in the boot that asked for
    /// it, ask again; in a later boot, verify the previous revision and end the rollback.
    pub(super) async fn finish_reboot_back(
        &mut self,
        view: Option<&PlanView>,
    ) -> Result<(), AgentError> {
        let Some(flight) = self.journal.in_flight().cloned() else {
            return Ok(());
        };
        let view = view.filter(|v| v.revision == flight.revision());
        let why = why_rolled_back(flight.failure());
        let happened = flight
            .reboot()
            .is_some_and(|r| r.happened(self.boot_id.as_deref()));
        if !happened {
            return self.ask_reboot_back(view, &flight, &why).await;
        }
        self.failpoint("rollback.booted");
        match self.check_previous(&flight).await {
            Ok(()) => self.rolled_back(view, &flight, &why).await,
            Err(failure) => self.rollback_failed(view, &flight, &why, failure).await,
        }
    }
}
