//! Staging: download, verify and store every artifact of a revision without touching what
//! runs; reuse what is stored already; deny a revision that fails before anything runs is
//! touched; collect the files no kept revision references.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::Utc;
use inplace_proto::{Artifact, ArtifactType, Reason, UpdateContent};

use super::report::Report;
use super::{Agent, AgentError, blocking};
use crate::archive;
use crate::fetch::FetchError;
use crate::journal::{Failure, Journal, Link};
use crate::machine::PlanView;
use crate::owner::FileAttributes;
use crate::self_update::image;
use crate::signature::{self, CheckedSignature};
use crate::store;

mod config_file;

/// How staging ended.
pub(super) enum Staging {
    /// Every artifact is stored; the journal says `Staged`.
    Done,
    /// The revision failed and is denied (reported).
    Failed,
    /// The plan moved on meanwhile.
    Superseded,
}

/// One artifact of the revision being staged.
struct Job<'a> {
    view: &'a PlanView,
    /// Its place in the plan (and in the status's download progress).
    index: usize,
    artifact: &'a Artifact,
    /// Its signature, checked as far as it goes without the artifact's bytes.
    signature: Option<&'a Arc<CheckedSignature>>,
    /// A Config's mode and owner as this node's ids (resolved once, before any download).
    attributes: Option<FileAttributes>,
}

/// Returns when the plan on `plans` no longer asks for `revision`; never without a channel.
pub(super) async fn moved_on(
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

impl Agent {
    /// Downloads, verifies and stores every artifact of the plan's revision. A failure of
    /// the revision is reported and denied; `Err` stops the agent. When the plan moves to
    /// another revision (or goes away) meanwhile, staging stops at once: downloads are
    /// not worth finishing for a revision nobody wants.
    pub(super) async fn stage(&mut self, view: &PlanView) -> Result<Staging, AgentError> {
        let fresh = self
            .journal
            .in_flight()
            .is_none_or(|f| f.revision() != view.revision);
        // Partial downloads of this revision's artifacts (an agent restarted mid-download)
        // are resumed; those of anything else (a stopped staging) are swept.
        let resumable = view
            .content
            .artifacts
            .iter()
            .flat_map(crate::fetch::partial_names)
            .collect();
        self.collect_keeping(Vec::new(), resumable).await;
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
        let artifacts = staged_artifacts(&view.content);
        let checked = match self.refuse_symlinked_targets(&view.content).await {
            Ok(()) => config_file::resolve_attributes(&artifacts).await,
            Err(failure) => Err(failure),
        };
        let attributes = match checked {
            Ok(attributes) => attributes,
            Err(failure) => {
                self.deny(view, failure, None).await?;
                return Ok(Staging::Failed);
            }
        };
        self.report(Some(view), Report::downloading(view));
        let mut staged_links = Vec::new();
        let mut plans = self.plans.clone();
        for (index, artifact) in artifacts.iter().enumerate() {
            let staged = tokio::select! {
                staged = self.stage_artifact(view, index, artifact, attributes[index]) => staged,
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
                    let stored = staged_links.iter().map(|l: &Link| l.target.clone());
                    self.deny(view, failure, Some(stored.collect())).await?;
                    return Ok(Staging::Failed);
                }
            }
        }
        self.journal.staged(staged_links)?;
        self.save().await?;
        self.failpoint("stage.done");
        Ok(Staging::Done)
    }

    /// Refuses, before any download, a binary or archive member whose directory is
    /// reached through a symlink below its allowed target directory. (The swap opens each
    /// directory with `O_NOFOLLOW` too; this check names the field before anything changed.)
    async fn refuse_symlinked_targets(&self, content: &UpdateContent) -> Result<(), Failure> {
        let targets: Vec<(String, PathBuf)> = content
            .artifacts
            .iter()
            .enumerate()
            .flat_map(|(i, a)| {
                let at = format!("spec.artifacts[{i}]");
                let binary = a.path.iter().map(move |p| (format!("{at}.path"), p));
                let at = format!("spec.artifacts[{i}]");
                let members = a
                    .members
                    .iter()
                    .enumerate()
                    .map(move |(j, m)| (format!("{at}.members[{j}].to"), &m.to));
                binary.chain(members)
            })
            .map(|(field, path)| (field, PathBuf::from(path)))
            .collect();
        let allowed = self.settings.policy.link_roots();
        let found = blocking(move || {
            for (field, path) in &targets {
                let base = crate::beneath::base_of(path, &allowed);
                let dir = path.parent().unwrap_or(path);
                if let Some(symlink) = crate::beneath::symlink_below(base, dir)? {
                    return Ok(Some(format!(
                        "{field}: {} is reached through {}, a symlink; links are never \
                         made through one below {}",
                        path.display(),
                        symlink.display(),
                        base.display()
                    )));
                }
            }
            Ok(None)
        })
        .await;
        match found {
            Ok(None) => Ok(()),
            Ok(Some(message)) => Err(Failure {
                reason: Reason::TargetThroughSymlink,
                message,
            }),
            Err(e) => Err(Failure {
                reason: Reason::StagingFailed,
                message: format!("cannot check the target directories: {e}"),
            }),
        }
    }

    /// The revision failed before anything that runs was touched: it is denied (journal
    /// saved), the files this pass `stored` are collected (with leftovers; `None`: nothing
    /// was stored by it) and the failure is reported.
    pub(super) async fn deny(
        &mut self,
        view: &PlanView,
        failure: Failure,
        stored: Option<Vec<PathBuf>>,
    ) -> Result<(), AgentError> {
        self.journal.deny(failure.clone(), Utc::now())?;
        self.save().await?;
        if let Some(stored) = stored {
            self.collect(stored).await;
        }
        self.report(Some(view), Report::failed(failure));
        Ok(())
    }

    async fn stage_artifact(
        &self,
        view: &PlanView,
        index: usize,
        artifact: &Artifact,
        attributes: Option<FileAttributes>,
    ) -> Result<Vec<Link>, Failure> {
        // Before the artifact: a bad signature costs no download.
        let fetcher = self.host.fetcher.as_ref();
        let policy = &self.settings.policy;
        let signature = match &view.content.agent {
            // The agent image travels alone: it is the only artifact of its revision.
            Some(agent) => {
                let keys = &self.settings.self_update.trusted_keys_dir;
                image::prepare_signature(fetcher, agent, artifact, keys).await?
            }
            None => {
                let version = view.content.kubernetes_version.as_deref();
                signature::prepare(fetcher, artifact, version, policy).await?
            }
        };
        let job = Job {
            view,
            index,
            artifact,
            signature: signature.as_ref(),
            attributes,
        };
        match artifact.kind {
            ArtifactType::Sysext => self.stage_sysext(&job).await.map(|l| vec![l]),
            ArtifactType::Binary => self.stage_binary(&job).await.map(|l| vec![l]),
            // The policy has already kept its path inside a configuration root.
            ArtifactType::Config => self.stage_config(&job).await.map(|l| vec![l]),
            ArtifactType::Archive => self.stage_archive(&job).await,
        }
    }

    /// A sysext image under `/opt/extensions/<name>/`, linked as `<name>.raw`; an image
    /// already stored with the right sha256 is reused.
    async fn stage_sysext(&self, job: &Job<'_>) -> Result<Link, Failure> {
        let artifact = job.artifact;
        let dir = store::sysext_dir(&self.settings.paths, &artifact.name);
        let file = sysext_file_name(artifact);
        let path = store::sysext_link(&self.settings.paths, &artifact.name);
        let sha256 = artifact.sha256.clone();
        let (d, f, s) = (dir.clone(), file.clone(), sha256.clone());
        let existing = blocking(move || Ok(store::find_sysext(&d, &f, &s)))
            .await
            .ok()
            .flatten();
        let target = match existing {
            Some(existing) => self.reuse(job, existing).await?,
            None => {
                let s = sha256.clone();
                let into = dir.clone();
                self.download_and_store(job, &dir, "storing the image", move |temp| {
                    store::place_sysext(temp, &into, &file, &s)
                })
                .await?
            }
        };
        Ok(Link {
            path,
            target,
            sha256,
        })
    }

    /// A file in the content-addressed store, linked at the artifact's `path`; reused when
    /// stored already.
    async fn stage_binary(&self, job: &Job<'_>) -> Result<Link, Failure> {
        let artifact = job.artifact;
        let cas = store::cas_dir(&self.settings);
        let path = PathBuf::from(artifact.path.clone().unwrap_or_default());
        let sha256 = artifact.sha256.clone();
        let existing = cas.join(&sha256);
        let (e, s) = (existing.clone(), sha256.clone());
        let stored = blocking(move || Ok(store::is_verified(&e, &s)))
            .await
            .unwrap_or(false);
        let target = if stored {
            self.reuse(job, existing).await?
        } else {
            let s = sha256.clone();
            let tmp = store::tmp_dir(&self.settings);
            self.download_and_store(job, &tmp, "storing the file", move |temp| {
                store::place_cas(temp, &cas, &s)
            })
            .await?
        };
        Ok(Link {
            path,
            target,
            sha256,
        })
    }

    /// The named members of a tar archive, each in the content-addressed store and linked
    /// at its `to`.
    async fn stage_archive(&self, job: &Job<'_>) -> Result<Vec<Link>, Failure> {
        let artifact = job.artifact;
        // Members already extracted from this archive (by an earlier `Staged` pass of this
        // revision, or a kept revision) are reused when their stored files still verify:
        // the archive may be gone from the server by now.
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
                self.mark_downloaded(job);
                return Ok(links);
            }
        }
        let temp = self.download(job, &store::tmp_dir(&self.settings)).await?;
        let placed = self.extract_into_store(artifact, temp).await?;
        self.report(Some(job.view), Report::downloading(job.view));
        Ok(artifact
            .members
            .iter()
            .filter_map(|m| {
                placed
                    .iter()
                    .find(|(from, _, _)| *from == m.from)
                    .map(|(_, target, sha)| Link {
                        path: PathBuf::from(&m.to),
                        target: target.clone(),
                        sha256: sha.clone(),
                    })
            })
            .collect())
    }

    /// Extracts the archive at `temp` (then removed) into a fresh staging directory and
    /// moves each member into the content-addressed store: (member, stored file, sha256).
    async fn extract_into_store(
        &self,
        artifact: &Artifact,
        temp: PathBuf,
    ) -> Result<Vec<(String, PathBuf, String)>, Failure> {
        let staging =
            store::tmp_dir(&self.settings).join(format!("extract-{:016x}", rand::random::<u64>()));
        let members: Vec<String> = artifact.members.iter().map(|m| m.from.clone()).collect();
        let limits = archive::Limits {
            max_entries: 100_000,
            max_bytes: artifact.extraction_limit(),
            reserved_disk_space: self.settings.policy.reserved_disk_space,
        };
        let cas = store::cas_dir(&self.settings);
        let result = tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = members.iter().map(String::as_str).collect();
            let extracted = archive::extract_members(&temp, &refs, &staging, limits);
            let _ = std::fs::remove_file(&temp);
            let extracted = extracted?;
            let mut placed = Vec::new();
            for e in extracted {
                let target = store::place_cas(&e.path, &cas, &e.sha256)?;
                placed.push((e.from, target, e.sha256));
            }
            let _ = std::fs::remove_dir_all(&staging);
            Ok::<_, archive::ArchiveError>(placed)
        })
        .await
        .map_err(|e| Failure {
            reason: Reason::StagingFailed,
            message: format!("artifact {}: {e}", artifact.name),
        })?;
        result.map_err(|e| archive_failure(artifact, e))
    }

    /// Downloads the job's artifact into `dir` and moves it where `place` puts it (on a
    /// blocking thread); `what` names that step in a failure.
    async fn download_and_store(
        &self,
        job: &Job<'_>,
        dir: &Path,
        what: &str,
        place: impl FnOnce(&Path) -> std::io::Result<PathBuf> + Send + 'static,
    ) -> Result<PathBuf, Failure> {
        let temp = self.download(job, dir).await?;
        let target = blocking(move || place(&temp))
            .await
            .map_err(|e| io_failure(job.artifact, what, e))?;
        self.report(Some(job.view), Report::downloading(job.view));
        Ok(target)
    }

    /// A stored file used again: its signature is checked, its bytes count as downloaded.
    async fn reuse(&self, job: &Job<'_>, stored: PathBuf) -> Result<PathBuf, Failure> {
        signature::verify_file(job.signature, &job.artifact.name, &stored).await?;
        self.mark_downloaded(job);
        Ok(stored)
    }

    fn mark_downloaded(&self, job: &Job<'_>) {
        if let Some(size) = job.artifact.size {
            self.set_bytes(job.index, size);
        }
    }

    /// Fetches the job's artifact into `dir` and checks its signature, metering bytes and
    /// time and showing the progress in the status (about once a second) and, once done,
    /// the URL that served it.
    async fn download(&self, job: &Job<'_>, dir: &Path) -> Result<PathBuf, Failure> {
        let meter = self.metrics.download();
        let progress = |done: u64| {
            meter.progress(done);
            if self.set_bytes(job.index, done) {
                self.report(Some(job.view), Report::downloading(job.view));
            }
        };
        let fetched = self
            .host
            .fetcher
            .fetch(job.artifact, dir, &progress)
            .await
            .map_err(|e: FetchError| Failure {
                reason: e.reason(),
                message: e.to_string(),
            })?;
        meter.succeeded();
        self.set_source(job.index, fetched.source);
        signature::verify_download(job.signature, &job.artifact.name, &fetched.path).await?;
        Ok(fetched.path)
    }
}

/// What staging stores for `content`: its artifacts, or the agent image as a sysext.
fn staged_artifacts(content: &UpdateContent) -> Cow<'_, [Artifact]> {
    match &content.agent {
        Some(agent) => Cow::Owned(vec![image::as_artifact(agent)]),
        None => Cow::Borrowed(&content.artifacts),
    }
}

/// A failure to store an artifact: `DiskFull` when the disk is, else `StagingFailed`.
fn io_failure(artifact: &Artifact, what: &str, e: std::io::Error) -> Failure {
    Failure {
        reason: if store::is_disk_full(&e) {
            Reason::DiskFull
        } else {
            Reason::StagingFailed
        },
        message: format!("artifact {}: {what}: {e}", artifact.name),
    }
}

/// An archive of `artifact` refused or not extracted: `DiskFull` when the disk is, else
/// `StagingFailed`.
fn archive_failure(artifact: &Artifact, e: archive::ArchiveError) -> Failure {
    Failure {
        reason: match &e {
            archive::ArchiveError::Io(io) if store::is_disk_full(io) => Reason::DiskFull,
            archive::ArchiveError::NoRoom { .. } => Reason::DiskFull,
            _ => Reason::StagingFailed,
        },
        message: format!("artifact {}: {e}", artifact.name),
    }
}

/// The file name a sysext image is stored under: the URL's last segment (`<name>.raw` for
/// a registry artifact, whose reference ends in a digest).
fn sysext_file_name(artifact: &Artifact) -> String {
    Some(&artifact.url)
        .filter(|url| !inplace_proto::oci::is_oci(url))
        .and_then(|url| url::Url::parse(url).ok())
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
                    .find(|l| l.path == Path::new(&recorded_to.to))?;
                Some(Link {
                    path: PathBuf::from(&member.to),
                    target: link.target.clone(),
                    sha256: link.sha256.clone(),
                })
            })
        })
        .collect()
}
