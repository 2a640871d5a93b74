//! An agent update (docs/design/agent-self-update.md, "The protocol"): the old agent (A)
//! journals the switch, keeps its own binary for the guard, arms the guard and swaps its
//! extension link; the new agent (B) finds the switch in flight, proves it can do its job
//! and confirms; A, restored by the guard, reports the rollback. Whichever agent starts
//! with a switch in flight asks `self_update::resume::resolve` what comes next, and
//! [`Agent::resume_switch`] is the one place that maps each answer to its transition.

use std::time::Duration;

use chrono::Utc;
use inplace_proto::Reason;

use super::report::Report;
use super::{Agent, AgentError, blocking};
use crate::journal::Failure;
use crate::links;
use crate::machine::PlanView;
use crate::self_update::host::{self, Observed};
use crate::self_update::resume::{self, Resolution, Switch};
use crate::self_update::{self, ClockReading, GuardPaths, Pending, RolledBack};

/// How often B tries again to write its status while it cannot (the guard's deadline
/// bounds it: the guard removes `pending.json` and restarts the unit).
const CONFIRM_RETRY: Duration = Duration::from_secs(2);

impl Agent {
    fn guard_paths(&self) -> GuardPaths {
        GuardPaths::new(
            &self.settings.state_dir,
            &self.settings.paths.extensions_dir,
        )
    }

    /// A, step 2: the agent image is staged; journal the switch (saved), then arm and swap.
    pub(super) async fn switch_agent(&mut self, view: &PlanView) -> Result<(), AgentError> {
        let (Some(agent), Some(flight)) = (&view.content.agent, self.journal.in_flight()) else {
            return Ok(());
        };
        let Some(next) = flight.links().first().cloned() else {
            return Ok(());
        };
        let link = self.guard_paths().extension_link;
        let Ok(previous_image) = std::fs::read_link(&link) else {
            let failure = Failure {
                reason: Reason::SelfUpdateUnsupported,
                message: format!(
                    "{} is not a link to this agent's image any more; the agent cannot replace itself",
                    link.display()
                ),
            };
            return self.deny(view, failure, None).await;
        };
        self.journal.begin_switch(Switch {
            previous_image,
            next_image: next.target,
            next_sha256: next.sha256,
            expected_version: agent.version.clone(),
            previous_version: Some(self.host.running.version.clone()),
            attempt: 1,
        })?;
        self.save().await?;
        self.failpoint("switch.begin");
        self.arm_and_swap(Some(view)).await
    }

    /// A, steps 3–4 (also a restarted attempt): keep this binary for the guard, arm the
    /// guard, swap. PID 1 ends this process during the swap's restart.
    async fn arm_and_swap(&mut self, view: Option<&PlanView>) -> Result<(), AgentError> {
        let Some(switch) = self.in_flight_switch() else {
            return Ok(());
        };
        self.report(view, Report::switching(&switch.expected_version));
        let paths = self.guard_paths();
        if let Err(failure) = self.arm(&paths, &switch).await {
            return self.end_switch(view, failure).await;
        }
        self.failpoint("switch.armed");
        let systemd = self.host.systemd.as_ref();
        let relinked = || self.failpoint("switch.relinked");
        if let Err(e) = host::swap_to(&paths, &switch.next_image, systemd, relinked).await {
            // The guard is armed: it restores this agent at the deadline, and this agent
            // (or the one after a restart) reports what it found.
            tracing::warn!(error = %e, "the agent switch's swap failed; the guard decides");
            (self.host.notify)(&format!("agent switch failed: {e}; waiting for the guard"));
        }
        Ok(())
    }

    /// A, step 3: the running binary kept (on the blocking pool: it reads ~10 MiB), then
    /// `pending.json` with the deadline, durable before the link moves.
    async fn arm(&self, paths: &GuardPaths, switch: &Switch) -> Result<(), Failure> {
        let failed = |what: &str, e: &dyn std::fmt::Display| Failure {
            reason: Reason::StagingFailed,
            message: format!("agent {}: {what}: {e}", switch.expected_version),
        };
        let (exe, dest) = (self.host.running.exe.clone(), paths.previous_binary.clone());
        let previous_binary_sha256 = blocking(move || {
            if let Some(dir) = dest.parent() {
                std::fs::create_dir_all(dir)?;
            }
            host::keep_previous_binary(&exe, &dest)
        })
        .await
        .map_err(|e| failed("keeping the running agent for the guard", &e))?;
        let confirm_timeout = self.settings.self_update.confirm_timeout.as_secs();
        let (deadline, boot_deadline) =
            ClockReading::read(self.boot_id.clone()).deadline_after(confirm_timeout);
        let pending = Pending {
            previous_image: switch.previous_image.clone(),
            next_image: switch.next_image.clone(),
            expected_version: switch.expected_version.clone(),
            deadline,
            confirm_timeout,
            boot_deadline,
            previous_binary_sha256: Some(previous_binary_sha256),
        };
        let paths = paths.clone();
        blocking(move || self_update::arm(&paths, &pending).map_err(std::io::Error::other))
            .await
            .map_err(|e| failed("arming the guard", &e))
    }

    fn in_flight_switch(&self) -> Option<Switch> {
        self.journal.in_flight().and_then(|f| f.switch()).cloned()
    }

    /// Either agent, at its start (or any pass) with a switch in flight: what it finds
    /// decides the next step, each mapped to its journal transition here.
    pub(super) async fn resume_switch(
        &mut self,
        view: Option<&PlanView>,
    ) -> Result<(), AgentError> {
        let Some(switch) = self.in_flight_switch() else {
            return Ok(());
        };
        let paths = self.guard_paths();
        let read = paths.clone();
        let observed =
            match blocking(move || Observed::read(&read).map_err(std::io::Error::other)).await {
                Ok(observed) => observed,
                Err(e) => {
                    // Nothing is decided on what could not be read; the guard stays in charge.
                    tracing::warn!(error = %e, "cannot read the agent switch's files");
                    (self.host.notify)(&format!("agent switch: {e}"));
                    return Ok(());
                }
            };
        let found = observed.found(&self.host.running.version);
        let max_attempts = self.settings.activation.max_attempts;
        match resume::resolve(&switch, found, max_attempts) {
            Resolution::Confirm => self.confirm(view, &paths, &switch).await,
            Resolution::AwaitGuard(why) => {
                tracing::warn!(%why, "not the agent the switch ordered; waiting for the guard");
                (self.host.notify)(&format!("not confirming the agent switch: {why}"));
                Ok(())
            }
            Resolution::ReportRolledBack(record) => {
                self.report_rolled_back(view, &paths, record).await
            }
            Resolution::ContinueSwitch => {
                let systemd = self.host.systemd.as_ref();
                let relinked = || self.failpoint("switch.relinked");
                if let Err(e) = host::swap_to(&paths, &switch.next_image, systemd, relinked).await {
                    tracing::warn!(error = %e, "the agent switch's swap failed; the guard decides");
                }
                Ok(())
            }
            Resolution::Restart { attempt } => {
                self.disarm(&paths).await;
                self.journal.restart_switch(attempt)?;
                self.save().await?;
                self.arm_and_swap(view).await
            }
            Resolution::GiveUp => self.give_up_switch(view, &paths, &switch).await,
        }
    }

    /// B, steps 6–7: the plan's status written with this agent's identity (retried while
    /// the guard waits, the last error in `STATUS=`), then the guard disarmed, then the
    /// journal committed, then Succeeded.
    async fn confirm(
        &mut self,
        view: Option<&PlanView>,
        paths: &GuardPaths,
        switch: &Switch,
    ) -> Result<(), AgentError> {
        let Some(view) = view else {
            return Ok(());
        };
        let version = &switch.expected_version;
        let proof = Report::confirming(version);
        loop {
            let Some(status) = self.render(Some(view), &proof) else {
                return Ok(());
            };
            match self.host.status.write_now(status).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot write the plan's status; not confirming");
                    (self.host.notify)(&format!("cannot confirm agent {version}: {e}"));
                }
            }
            if !paths.pending.exists() {
                // The guard gave up on this agent (or nothing waits): a later pass retries.
                return Ok(());
            }
            tokio::time::sleep(CONFIRM_RETRY).await;
        }
        self.failpoint("switch.proved");
        if !self.claim_confirmation(paths).await {
            // The guard claimed the restore first (or the guard's file could not be
            // removed): committing now would leave a journal saying this agent runs while
            // the guard puts the old one back.
            return Ok(());
        }
        self.failpoint("switch.disarmed");
        // A guard that died mid-restore may have left its record; this agent confirmed.
        let stale = paths.clone();
        if let Err(e) =
            blocking(move || host::forget_rolled_back(&stale).map_err(std::io::Error::other)).await
        {
            tracing::warn!(error = %e, "cannot remove a stale rollback record");
        }
        let revision = self
            .journal
            .confirm_switch(Utc::now())?
            .revision()
            .to_owned();
        self.save().await?;
        self.failpoint("switch.committed");
        tracing::info!(%revision, %version, "agent switch confirmed");
        self.report(
            about(Some(view), &revision),
            Report::switched(&revision, version),
        );
        Ok(())
    }

    /// A, restored by the guard: the revision denied with the guard's reason, its record
    /// removed, RolledBack reported.
    async fn report_rolled_back(
        &mut self,
        view: Option<&PlanView>,
        paths: &GuardPaths,
        record: RolledBack,
    ) -> Result<(), AgentError> {
        let failure = Failure {
            reason: Reason::parse(&record.reason).unwrap_or(Reason::AgentNotConfirmed),
            message: record.message,
        };
        let flight = self.journal.switch_failed(failure, Utc::now())?;
        self.save().await?;
        let paths = paths.clone();
        if let Err(e) =
            blocking(move || host::forget_rolled_back(&paths).map_err(std::io::Error::other)).await
        {
            tracing::warn!(error = %e, "cannot remove the guard's record");
        }
        self.report_denied(view, flight.revision());
        Ok(())
    }

    /// Too many attempts: disarmed, the link back at the previous image if it moved, the
    /// revision given up.
    async fn give_up_switch(
        &mut self,
        view: Option<&PlanView>,
        paths: &GuardPaths,
        switch: &Switch,
    ) -> Result<(), AgentError> {
        self.disarm(paths).await;
        let (link, previous) = (paths.extension_link.clone(), switch.previous_image.clone());
        if std::fs::read_link(&link).ok().as_deref() != Some(previous.as_path())
            && let Err(e) = blocking(move || links::swap_symlink(&link, &previous)).await
        {
            tracing::warn!(error = %e, "cannot put the agent's link back");
        }
        let attempts = switch.attempt;
        let failure = Failure {
            reason: Reason::TooManyAttempts,
            message: format!(
                "the switch to agent {} was interrupted {attempts} times; giving up",
                switch.expected_version
            ),
        };
        self.end_switch(view, failure).await
    }

    /// The switch failed before anything ran from the new image: denied, reported.
    async fn end_switch(
        &mut self,
        view: Option<&PlanView>,
        failure: Failure,
    ) -> Result<(), AgentError> {
        let flight = self.journal.switch_failed(failure, Utc::now())?;
        self.save().await?;
        self.report_denied(view, flight.revision());
        Ok(())
    }

    fn report_denied(&self, view: Option<&PlanView>, revision: &str) {
        if let Some(failed) = self.journal.failure_of(revision) {
            self.report(about(view, revision), Report::denied(failed));
        }
    }

    /// Removes `pending.json` durably; false (logged, in `STATUS=`) when it could not:
    /// the guard then decides at its deadline.
    /// B's side of the race with the guard (`self_update::claim_confirmation`).
    async fn claim_confirmation(&self, paths: &GuardPaths) -> bool {
        let claim = paths.clone();
        let claimed = blocking(move || {
            self_update::claim_confirmation(&claim).map_err(std::io::Error::other)
        })
        .await;
        let why = match claimed {
            Ok(true) => return true,
            Ok(false) => "the guard is restoring the previous agent".to_owned(),
            Err(e) => format!("cannot disarm the agent switch's guard: {e}"),
        };
        tracing::warn!(%why, "not confirming the agent switch");
        (self.host.notify)(&format!("not confirming the agent switch: {why}"));
        false
    }

    async fn disarm(&self, paths: &GuardPaths) -> bool {
        let paths = paths.clone();
        let disarmed =
            blocking(move || self_update::disarm(&paths).map_err(std::io::Error::other)).await;
        if let Err(e) = &disarmed {
            tracing::warn!(error = %e, "cannot disarm the agent switch's guard");
            (self.host.notify)(&format!("cannot disarm the agent switch's guard: {e}"));
        }
        disarmed.is_ok()
    }
}

/// The plan to report a switch's end to: only one still asking for the switch's
/// `revision` (a plan that moved on meanwhile is decided on next, and must not show the
/// switch's outcome as its own).
fn about<'a>(view: Option<&'a PlanView>, revision: &str) -> Option<&'a PlanView> {
    view.filter(|v| v.revision == revision)
}
