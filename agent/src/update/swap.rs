//! The host-changing primitives activation and rollback are made of: point the links at a
//! revision, refresh sysext and the units, restore what the paths held before — and the
//! check that the host still matches the committed revision (drift).

use std::path::PathBuf;

use inplace_proto::{ArtifactType, Reason, UpdateContent};

use super::{Agent, blocking};
use crate::beneath;
use crate::health;
use crate::journal::{Failure, InFlight, Link};
use crate::links;
use crate::store;
use crate::systemd::SYSEXT_REFRESH_UNIT;

impl Agent {
    /// Points every link at its target, removes the links the revision dropped, refreshes
    /// sysext (a dropped extension is unmerged), reloads, restarts units. Idempotent, so a
    /// resumed activation runs it again from the start.
    pub(super) async fn switch_to(
        &self,
        targets: &[Link],
        removals: &[PathBuf],
        content: &UpdateContent,
    ) -> Result<(), Failure> {
        self.swap_links(targets, removals).await?;
        let extensions = &self.settings.paths.extensions_dir;
        let sysext_touched = targets.iter().any(|l| l.path.starts_with(extensions))
            || removals.iter().any(|p| p.starts_with(extensions));
        self.refresh(content, sysext_touched, "activate").await
    }

    /// Points every link at its target and removes the links the revision dropped; nothing
    /// that runs is told (a reboot activation stops here). Idempotent.
    pub(super) async fn swap_links(
        &self,
        targets: &[Link],
        removals: &[PathBuf],
    ) -> Result<(), Failure> {
        let swaps = targets.to_vec();
        let dropped = removals.to_vec();
        let lock = self.settings.paths.lock_file.clone();
        let allowed = self.settings.policy.link_roots();
        blocking(move || {
            for link in &swaps {
                let base = beneath::base_of(&link.path, &allowed);
                beneath::swap_symlink(base, &link.path, &link.target)?;
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
        })
    }

    /// Refreshes sysext (when `sysext_touched`), proves `content`'s extensions merged,
    /// reloads units when asked, restarts `content`'s units in order and proves each one
    /// started (a restart job can end `done` and start nothing).
    /// `stage` ("activate" or "rollback") names the failpoints passed.
    async fn refresh(
        &self,
        content: &UpdateContent,
        sysext_touched: bool,
        stage: &'static str,
    ) -> Result<(), Failure> {
        let systemd = &self.host.systemd;
        if sysext_touched || content.has_sysext() {
            systemd.refresh_extensions().await.map_err(|e| Failure {
                reason: Reason::UnitFailed,
                message: format!(
                    "refreshing extensions (systemd-sysext refresh): {e}; see journalctl -u {SYSEXT_REFRESH_UNIT}"
                ),
            })?;
            self.extensions_merged(content, "systemd-sysext refresh")
                .await?;
            self.failpoint(&format!("{stage}.sysext_refreshed"));
        }
        if content.daemon_reload() {
            systemd.daemon_reload().await.map_err(|e| Failure {
                reason: Reason::UnitFailed,
                message: format!("daemon-reload: {e}"),
            })?;
        }
        let unit_failed = |e: crate::systemd::SystemdError| Failure {
            reason: Reason::UnitFailed,
            message: e.to_string(),
        };
        for unit in &content.activation.restart_units {
            let before = systemd.unit_state(unit).await.map_err(unit_failed)?;
            systemd.restart_unit(unit).await.map_err(unit_failed)?;
            let after = systemd.unit_state(unit).await.map_err(unit_failed)?;
            if !after.started_since(&before) {
                return Err(Failure {
                    reason: Reason::UnitFailed,
                    message: format!(
                        "{unit} did not start after its restart (InvocationID and ActiveEnterTimestamp unchanged, now {}/{}): a Condition not met, or the unit refuses restarts; what ran before may still run",
                        after.active_state, after.sub_state
                    ),
                });
            }
            self.failpoint(&format!("{stage}.unit_restarted"));
        }
        Ok(())
    }

    /// Puts every path back to what it held before `flight` (reverse order), restarts what
    /// `flight` restarted and verifies what runs now: the committed revision, or on a
    /// first install whatever ran before.
    pub(super) async fn restore(&self, flight: &InFlight) -> Result<(), Failure> {
        self.restore_links(flight).await?;
        let sysext_touched = flight
            .before()
            .iter()
            .any(|b| b.path.starts_with(&self.settings.paths.extensions_dir));
        // What runs now is the committed revision (or, on a first install, whatever ran
        // before): restart the units the failed revision restarted, then check them.
        let content = self.previous_content(flight);
        self.refresh(&content, sysext_touched, "rollback").await?;
        self.check_previous(flight).await
    }

    /// Every managed path back to what it held before `flight`, in reverse order; nothing
    /// that runs is told (a rollback by reboot stops here).
    pub(super) async fn restore_links(&self, flight: &InFlight) -> Result<(), Failure> {
        let before = flight.before().to_vec();
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
        })
    }

    /// What runs after a rollback of `flight`: the committed revision's content (on a first
    /// install, `flight`'s without artifacts), restarting what `flight` restarted.
    fn previous_content(&self, flight: &InFlight) -> UpdateContent {
        let committed = self.journal.committed().map(|c| c.content());
        let mut content = committed.cloned().unwrap_or_else(|| UpdateContent {
            artifacts: Vec::new(),
            ..flight.content().clone()
        });
        content.activation.restart_units = flight.content().activation.restart_units.clone();
        content.activation.daemon_reload =
            Some(flight.content().daemon_reload() || content.daemon_reload());
        content
    }

    /// The previous revision's health checks, after `flight` was rolled back.
    pub(super) async fn check_previous(&self, flight: &InFlight) -> Result<(), Failure> {
        let committed = self.journal.committed().map(|c| c.content());
        let content = self.previous_content(flight);
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

    /// Whether `content`'s extensions are merged (after `by`: a refresh, a boot).
    pub(super) async fn extensions_merged(
        &self,
        content: &UpdateContent,
        by: &str,
    ) -> Result<(), Failure> {
        for artifact in content
            .artifacts
            .iter()
            .filter(|a| a.kind == ArtifactType::Sysext)
        {
            let release = store::extension_release(&self.settings.paths, &artifact.name);
            if !tokio::fs::try_exists(&release).await.unwrap_or(false) {
                return Err(Failure {
                    reason: Reason::ExtensionNotMerged,
                    message: format!(
                        "extension {} is not merged after {by}: {} is missing (image incompatible with this host?)",
                        artifact.name,
                        release.display()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The first managed path that no longer points at the committed revision's file (or
    /// whose file is gone), described; `None` when the host matches the journal.
    pub(super) fn drift(&self) -> Option<String> {
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
}
