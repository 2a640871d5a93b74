//! The journal's named transitions (the table on [`Journal`]): each checks the step it
//! starts from, so an impossible sequence is a [`TransitionError`] and the journal is left
//! as it was. A child of `journal` so that it, and only it, changes the private fields.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use inplace_proto::UpdateContent;

use super::{
    Before, FailedRevision, Failure, InFlight, Installed, Journal, Link, MAX_FAILED, Step,
    TransitionError,
};

impl Journal {
    /// The in-flight revision, if its step is one of `from`; otherwise the refusal of
    /// `transition`.
    pub(super) fn flight_at(
        &mut self,
        transition: &'static str,
        from: &[Step],
    ) -> Result<&mut InFlight, TransitionError> {
        let step = self.step();
        match self.in_flight.as_mut() {
            Some(flight) if from.contains(&flight.step) => Ok(flight),
            _ => Err(TransitionError {
                transition,
                from: step,
            }),
        }
    }

    /// Takes the in-flight revision out, if its step is one of `from`; otherwise the
    /// refusal of `transition` (and the journal is unchanged).
    pub(super) fn take_flight(
        &mut self,
        transition: &'static str,
        from: &[Step],
    ) -> Result<InFlight, TransitionError> {
        match self.in_flight.take() {
            Some(flight) if from.contains(&flight.step) => Ok(flight),
            other => {
                let from = other.as_ref().map(|f| f.step);
                self.in_flight = other;
                Err(TransitionError { transition, from })
            }
        }
    }

    /// Nothing in flight → `Staging`: work on `revision` starts (before any download).
    pub fn begin_staging(
        &mut self,
        revision: &str,
        generation: Option<i64>,
        content: &UpdateContent,
        at: DateTime<Utc>,
    ) -> Result<(), TransitionError> {
        if self.in_flight.is_some() {
            return Err(TransitionError {
                transition: "begin_staging",
                from: self.step(),
            });
        }
        self.in_flight = Some(InFlight {
            revision: revision.to_owned(),
            generation,
            content: content.clone(),
            step: Step::Staging,
            links: Vec::new(),
            before: Vec::new(),
            failure: None,
            started_at: at,
            switch: None,
            reboot: None,
        });
        Ok(())
    }

    /// `Staging` (or `Staged`, staged again) → `Staged`: every artifact is verified and
    /// stored at `links`' targets.
    pub fn staged(&mut self, links: Vec<Link>) -> Result<(), TransitionError> {
        let flight = self.flight_at("staged", &[Step::Staging, Step::Staged])?;
        flight.links = links;
        flight.step = Step::Staged;
        Ok(())
    }

    /// `Staging`/`Staged` → nothing in flight: the plan no longer wants this revision.
    /// Returns it (its files may be collected).
    pub fn abandon_staging(&mut self) -> Result<InFlight, TransitionError> {
        self.take_flight("abandon_staging", &[Step::Staging, Step::Staged])
    }

    /// `Staging`/`Staged` → nothing in flight, the revision denied: it failed before
    /// anything that runs was touched. Returns it (its files may be collected).
    pub fn deny(
        &mut self,
        failure: Failure,
        at: DateTime<Utc>,
    ) -> Result<InFlight, TransitionError> {
        let flight = self.take_flight("deny", &[Step::Staging, Step::Staged])?;
        self.remember_failed(&flight.revision, failure, at, false);
        Ok(flight)
    }

    /// Counts an activation attempt of the in-flight revision (`Staged`, or `Activating`/
    /// `Verifying` resumed after a restart); returns the count.
    pub fn count_attempt(&mut self) -> Result<u32, TransitionError> {
        let revision = self
            .flight_at(
                "count_attempt",
                &[Step::Staged, Step::Activating, Step::Verifying],
            )?
            .revision
            .clone();
        let attempts = self.attempts.entry(revision).or_insert(0);
        *attempts += 1;
        Ok(*attempts)
    }

    /// `Staged` → `Activating`, with what every managed path holds now (`before`, recorded
    /// before the first swap). Returns the paths activation removes.
    pub fn activating(&mut self, before: Vec<Before>) -> Result<Vec<PathBuf>, TransitionError> {
        let flight = self.flight_at("activating", &[Step::Staged])?;
        flight.before = before;
        flight.step = Step::Activating;
        Ok(flight.removals())
    }

    /// `Activating`/`Verifying` → `Activating`: a restart interrupted the activation; it is
    /// redone with the priors recorded the first time. Returns the paths it removes.
    pub fn resume_activating(&mut self) -> Result<Vec<PathBuf>, TransitionError> {
        let flight = self.flight_at("resume_activating", &[Step::Activating, Step::Verifying])?;
        flight.step = Step::Activating;
        Ok(flight.removals())
    }

    /// `Activating` → `Verifying`: the links are swapped and the units restarted.
    pub fn verifying(&mut self) -> Result<(), TransitionError> {
        self.flight_at("verifying", &[Step::Activating])?.step = Step::Verifying;
        Ok(())
    }

    /// `Verifying` → nothing in flight: the in-flight revision becomes the committed one,
    /// the committed one the previous. Returns the revision that fell off (its files may
    /// be collected).
    pub fn commit(&mut self, at: DateTime<Utc>) -> Result<Option<Installed>, TransitionError> {
        let flight = self.take_flight("commit", &[Step::Verifying])?;
        let installed = Installed {
            revision: flight.revision,
            content: flight.content,
            links: flight.links,
            committed_at: at,
        };
        // Keep the committed revision's count (the status shows it); forget the rest.
        self.attempts
            .retain(|revision, _| *revision == installed.revision);
        self.failed.clear();
        let dropped = self.previous.take();
        self.previous = self.committed.replace(installed);
        Ok(dropped)
    }

    /// `Activating`/`Verifying` (or `RollingBack`, resumed) → `RollingBack`, because of
    /// `failure` (`None`: the plan moved on; the revision is not at fault). Returns the
    /// revision being rolled back.
    pub fn rolling_back(&mut self, failure: Option<Failure>) -> Result<&InFlight, TransitionError> {
        let flight = self.flight_at(
            "rolling_back",
            &[Step::Activating, Step::Verifying, Step::RollingBack],
        )?;
        flight.step = Step::RollingBack;
        flight.failure = failure;
        Ok(flight)
    }

    /// `RollingBack`/`RebootingBack` → nothing in flight: what ran before is restored (and
    /// booted) and healthy. A
    /// revision that failed is denied (and shown as rolled back). Returns it.
    pub fn rolled_back(&mut self, at: DateTime<Utc>) -> Result<InFlight, TransitionError> {
        self.end_rollback("rolled_back", at, true)
    }

    /// `RollingBack`/`RebootingBack` → nothing in flight, the node degraded: the rollback itself failed
    /// (`degraded` says how). A revision that failed is denied. Returns it.
    pub fn rollback_failed(
        &mut self,
        degraded: Failure,
        at: DateTime<Utc>,
    ) -> Result<InFlight, TransitionError> {
        let flight = self.end_rollback("rollback_failed", at, false)?;
        self.degraded = Some(degraded);
        Ok(flight)
    }

    fn end_rollback(
        &mut self,
        transition: &'static str,
        at: DateTime<Utc>,
        restored: bool,
    ) -> Result<InFlight, TransitionError> {
        let flight = self.take_flight(transition, &[Step::RollingBack, Step::RebootingBack])?;
        self.attempts.remove(&flight.revision);
        if let Some(failure) = &flight.failure {
            self.remember_failed(&flight.revision, failure.clone(), at, restored);
        }
        Ok(flight)
    }

    /// Marks the node degraded: no automatic action until a person clears it (a failed
    /// rollback, or a journal that could not be read).
    pub fn mark_degraded(&mut self, failure: Failure) {
        self.degraded = Some(failure);
    }

    /// A person asked to retry `revision` with `token`: its failure is forgotten (it may be
    /// staged again) and the token remembered, so it is never honoured twice. Returns the
    /// failure forgotten, if the revision had failed. Any step: only the denylist changes.
    pub fn honour_retry(&mut self, token: &str, revision: &str) -> Option<FailedRevision> {
        self.retry_honoured = Some(token.to_owned());
        let index = self.failed.iter().position(|f| f.revision == revision)?;
        Some(self.failed.remove(index))
    }

    /// Clears the degraded mark (`inplace-agent clear-degraded`); returns what it said.
    pub fn clear_degraded(&mut self) -> Option<Failure> {
        self.degraded.take()
    }

    /// Adds `revision` to the bounded denylist (the oldest are forgotten first).
    pub(super) fn remember_failed(
        &mut self,
        revision: &str,
        failure: Failure,
        at: DateTime<Utc>,
        rolled_back: bool,
    ) {
        self.failed.retain(|f| f.revision != revision);
        self.failed.push(FailedRevision {
            revision: revision.to_owned(),
            failure,
            at,
            rolled_back,
        });
        if self.failed.len() > MAX_FAILED {
            let excess = self.failed.len() - MAX_FAILED;
            self.failed.drain(..excess);
        }
    }
}
