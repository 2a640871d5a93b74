//! The host-changing primitives activation and rollback are made of: point the links at a
//! revision, refresh sysext and the units, restore what the paths held before — and the
//! check that the host still matches the committed revision (drift).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use inplace_proto::{ArtifactType, CONFEXT_DIR, Reason, UpdateContent};

use super::{Agent, blocking};
use crate::beneath;
use crate::health;
use crate::journal::{Failure, InFlight, Link};
use crate::links;
use crate::owner::Owner;
use crate::store;
use crate::systemd::ExtensionClass;

/// Which extension classes a change touched: their refresh must run even when the
/// revision has none left (a dropped or restored extension is unmerged or merged again).
#[derive(Debug, Clone, Copy, Default)]
struct Touched {
    sysext: bool,
    confext: bool,
}

impl Agent {
    /// Points every link at its target, removes the links the revision dropped, refreshes
    /// sysext and confext (a dropped extension is unmerged), reloads, restarts units.
    /// Idempotent, so a resumed activation runs it again from the start.
    pub(super) async fn switch_to(
        &self,
        targets: &[Link],
        removals: &[PathBuf],
        content: &UpdateContent,
    ) -> Result<(), Failure> {
        let unsealed = self.swap_links(targets, removals).await?;
        let mut touched = self.touched(
            targets
                .iter()
                .map(|l| l.path.as_path())
                .chain(removals.iter().map(PathBuf::as_path)),
        );
        touched.confext |= unsealed;
        self.refresh(content, touched, "activate").await
    }

    /// Makes the directories of `paths` writable when configuration extensions merged
    /// read-only over `/etc` keep them from it (systemd-confext's default: the whole of
    /// `/etc` is a read-only overlay, `/etc/extensions` included): unmerges them, to be
    /// merged again by the refresh that follows (or by the next boot). Returns whether the
    /// refresh must merge them again: when it unmerged them, and when it finds them
    /// unmerged already (an agent stopped between this and the refresh; its resumed swap
    /// comes here again). A mutable merge, or no configuration extension, is left alone.
    async fn unseal_etc(&self, paths: Vec<PathBuf>) -> Result<bool, Failure> {
        let etc = self.settings.paths.merged_root.join("etc");
        let (sealed, left_unmerged) = blocking(move || {
            let merged = etc.join(".systemd-confext").exists();
            let left_unmerged = !merged && has_confext_images(Path::new(CONFEXT_DIR));
            let sealed = merged
                && paths.iter().any(|path| {
                    path.starts_with(&etc)
                        && path.parent().is_some_and(|dir| {
                            nix::sys::statvfs::statvfs(dir).is_ok_and(|fs| {
                                fs.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY)
                            })
                        })
                });
            Ok((sealed, left_unmerged))
        })
        .await
        .unwrap_or((false, false));
        if left_unmerged {
            tracing::info!(
                "configuration extensions in {CONFEXT_DIR} are not merged (a swap was interrupted): the refresh merges them again"
            );
            return Ok(true);
        }
        if !sealed {
            return Ok(false);
        }
        tracing::info!("configuration extensions keep /etc read-only: unmerging them for the swap");
        self.host
            .systemd
            .unmerge_extensions(ExtensionClass::Confext)
            .await
            .map_err(|e| Failure {
                reason: Reason::UnitFailed,
                message: format!(
                    "unmerging configuration extensions to write below /etc (systemd-confext unmerge): {e}; see journalctl -u {}",
                    ExtensionClass::Confext.refresh_unit()
                ),
            })?;
        Ok(true)
    }

    /// Which extension classes a change of `paths` concerns: a link in the sysext
    /// directory, a configuration extension's link.
    fn touched<'p>(&self, paths: impl Iterator<Item = &'p Path>) -> Touched {
        let extensions = &self.settings.paths.extensions_dir;
        let mut touched = Touched::default();
        for path in paths {
            touched.sysext |= path.starts_with(extensions);
            touched.confext |= path.starts_with(CONFEXT_DIR);
        }
        touched
    }

    /// Points every link at its target and removes the links the revision dropped; nothing
    /// that runs is told (a reboot activation stops here). Idempotent. Returns whether
    /// configuration extensions were unmerged to write below `/etc` ([`Self::unseal_etc`]).
    pub(super) async fn swap_links(
        &self,
        targets: &[Link],
        removals: &[PathBuf],
    ) -> Result<bool, Failure> {
        let written = targets
            .iter()
            .map(|l| l.path.clone())
            .chain(removals.iter().cloned())
            .collect();
        let unsealed = self.unseal_etc(written).await?;
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
        })?;
        Ok(unsealed)
    }

    /// Refreshes sysext and confext (each when `touched` or `content` has one), proves
    /// `content`'s extensions merged, reloads units when asked, restarts `content`'s units
    /// in order and proves each one started (a restart job can end `done` and start
    /// nothing). `stage` ("activate" or "rollback") names the failpoints passed.
    async fn refresh(
        &self,
        content: &UpdateContent,
        touched: Touched,
        stage: &'static str,
    ) -> Result<(), Failure> {
        let systemd = &self.host.systemd;
        if touched.sysext || content.has_sysext() {
            self.refresh_class(ExtensionClass::Sysext, content).await?;
            self.failpoint(&format!("{stage}.sysext_refreshed"));
        }
        if touched.confext || content.has_confext() {
            self.refresh_class(ExtensionClass::Confext, content).await?;
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
        let unsealed = self.restore_links(flight).await?;
        let mut touched = self.touched(flight.before().iter().map(|b| b.path.as_path()));
        touched.confext |= unsealed;
        // What runs now is the committed revision (or, on a first install, whatever ran
        // before): restart the units the failed revision restarted, then check them.
        let content = self.previous_content(flight);
        self.refresh(&content, touched, "rollback").await?;
        self.check_previous(flight).await
    }

    /// Every managed path back to what it held before `flight`, in reverse order, each
    /// restored file with its owner; nothing that runs is told (a rollback by reboot stops
    /// here). Returns whether configuration extensions were unmerged to write below `/etc`
    /// ([`Self::unseal_etc`]).
    pub(super) async fn restore_links(&self, flight: &InFlight) -> Result<bool, Failure> {
        let before = flight.before().to_vec();
        let unsealed = self
            .unseal_etc(before.iter().map(|b| b.path.clone()).collect())
            .await?;
        let lock = self.settings.paths.lock_file.clone();
        let owners = blocking(move || {
            let mut owners: BTreeMap<Owner, Vec<PathBuf>> = BTreeMap::new();
            for b in before.iter().rev() {
                links::restore_prior(&b.path, &b.prior)?;
                crate::failpoints::hit(&lock, "rollback.restore");
                if let Some(owner) = links::owner_to_give_back(&b.path, &b.prior)? {
                    owners.entry(owner).or_default().push(b.path.clone());
                }
            }
            Ok(owners)
        })
        .await
        .map_err(|e| Failure {
            reason: Reason::RollbackFailed,
            message: format!("cannot restore links: {e}"),
        })?;
        self.give_back_owners(owners).await?;
        Ok(unsealed)
    }

    /// Restored files whose copies are the agent's get their owners back through PID 1.
    async fn give_back_owners(&self, owners: BTreeMap<Owner, Vec<PathBuf>>) -> Result<(), Failure> {
        for (owner, paths) in owners {
            let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            let what = format!("restoring {}", names.join(", "));
            self.chown(&paths, owner, Reason::RollbackFailed, &what)
                .await?;
        }
        Ok(())
    }

    /// `paths` given `owner` by PID 1 (the agent holds no capability); a failure has
    /// `reason` and names `what`.
    pub(super) async fn chown(
        &self,
        paths: &[PathBuf],
        owner: Owner,
        reason: Reason,
        what: &str,
    ) -> Result<(), Failure> {
        let Owner { uid, gid } = owner;
        self.host
            .systemd
            .chown(paths, uid, gid)
            .await
            .map_err(|e| Failure {
                reason,
                message: format!(
                    "{what}: giving it owner {uid}:{gid} (chown through PID 1): {e}; see journalctl -u {}",
                    crate::systemd::CHOWN_UNIT
                ),
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

    /// Runs `class`'s refresh and proves `content`'s extensions of that class merged.
    async fn refresh_class(
        &self,
        class: ExtensionClass,
        content: &UpdateContent,
    ) -> Result<(), Failure> {
        let tool = class.name();
        self.host
            .systemd
            .refresh_extensions(class)
            .await
            .map_err(|e| Failure {
                reason: Reason::UnitFailed,
                message: format!(
                    "refreshing extensions ({tool} refresh): {e}; see journalctl -u {}",
                    class.refresh_unit()
                ),
            })?;
        self.merged(content, class, &format!("{tool} refresh"))
            .await
    }

    /// Whether `content`'s extensions, system and configuration, are merged (after `by`:
    /// a boot).
    pub(super) async fn extensions_merged(
        &self,
        content: &UpdateContent,
        by: &str,
    ) -> Result<(), Failure> {
        self.merged(content, ExtensionClass::Sysext, by).await?;
        self.merged(content, ExtensionClass::Confext, by).await
    }

    /// Whether `content`'s extensions of `class` are merged: each one's release file is in
    /// the merged tree.
    async fn merged(
        &self,
        content: &UpdateContent,
        class: ExtensionClass,
        by: &str,
    ) -> Result<(), Failure> {
        let paths = &self.settings.paths;
        let releases = content.artifacts.iter().filter_map(|a| match class {
            ExtensionClass::Sysext => (a.kind == ArtifactType::Sysext)
                .then(|| (a.name.as_str(), store::extension_release(paths, &a.name))),
            ExtensionClass::Confext => a
                .confext_name()
                .map(|name| (name, store::confext_release(paths, name))),
        });
        for (name, release) in releases {
            if !tokio::fs::try_exists(&release).await.unwrap_or(false) {
                return Err(Failure {
                    reason: Reason::ExtensionNotMerged,
                    message: format!(
                        "extension {name} is not merged after {by}: {} is missing (image incompatible with this host?)",
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

/// Whether `dir` holds a configuration extension image (`*.raw`), which systemd-confext
/// merges at boot and at every refresh.
fn has_confext_images(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| {
        entries
            .any(|entry| entry.is_ok_and(|e| e.path().extension().is_some_and(|ext| ext == "raw")))
    })
}
