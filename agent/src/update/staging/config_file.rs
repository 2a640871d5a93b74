//! A Config file in the store: its bytes verified, then its mode, its owner (through PID 1:
//! the agent holds no capability to) and its name in the store, in that order, so a stored
//! name always has all three. A Config directory the same way: its archive verified and
//! extracted whole, its files given their owner, the tree renamed into the store.

use std::path::PathBuf;

use inplace_proto::{Artifact, ArtifactType, Reason};

use super::{Job, archive_failure, io_failure};
use crate::archive;
use crate::journal::{Failure, Link};
use crate::owner::{self, FileAttributes};
use crate::store;
use crate::update::report::Report;
use crate::update::{Agent, blocking};

impl Agent {
    /// The artifact's file in the store with its mode and owner, linked at its `path`;
    /// reused when stored already.
    pub(super) async fn stage_config(&self, job: &Job<'_>) -> Result<Link, Failure> {
        let artifact = job.artifact;
        let attributes = job.attributes.ok_or_else(|| Failure {
            reason: Reason::StagingFailed,
            message: format!(
                "artifact {}: its mode and owner were not resolved",
                artifact.name
            ),
        })?;
        if artifact.directory {
            return self.stage_config_tree(job, attributes).await;
        }
        let sha256 = artifact.sha256.clone();
        let target = store::config_file(&self.settings, &sha256, attributes);
        let (t, s) = (target.clone(), sha256.clone());
        let stored = blocking(move || Ok(store::is_config_in_place(&t, &s, attributes.mode)))
            .await
            .unwrap_or(false);
        let target = if stored {
            self.reuse(job, target).await?
        } else {
            let temp = self.download(job, &store::tmp_dir(&self.settings)).await?;
            let placed = self.place_config(artifact, &temp, target, attributes).await;
            if placed.is_err() {
                let _ = tokio::fs::remove_file(&temp).await;
            }
            placed?
        };
        Ok(Link {
            path: PathBuf::from(artifact.path.clone().unwrap_or_default()),
            target,
            sha256,
        })
    }

    /// Gives the download at `temp` its mode, then its owner, then its name `target`.
    async fn place_config(
        &self,
        artifact: &Artifact,
        temp: &std::path::Path,
        target: PathBuf,
        attributes: FileAttributes,
    ) -> Result<PathBuf, Failure> {
        let t = temp.to_path_buf();
        blocking(move || store::set_config_mode(&t, attributes.mode))
            .await
            .map_err(|e| io_failure(artifact, "setting its mode", e))?;
        if !attributes.owned_by_root() {
            self.give_owner(artifact, vec![temp.to_path_buf()], attributes)
                .await?;
        }
        let t = temp.to_path_buf();
        blocking(move || store::place_config(&t, &target))
            .await
            .map_err(|e| io_failure(artifact, "storing the file", e))
    }

    /// The artifact's archive extracted whole into the store, its files with their owner,
    /// linked (the directory) at its `path`; a stored tree is used again as it is (it got
    /// its name only once complete).
    async fn stage_config_tree(
        &self,
        job: &Job<'_>,
        attributes: FileAttributes,
    ) -> Result<Link, Failure> {
        let artifact = job.artifact;
        let target = store::config_tree(&self.settings, &artifact.sha256, attributes);
        let link = |target: PathBuf| Link {
            path: PathBuf::from(artifact.path.clone().unwrap_or_default()),
            target,
            sha256: artifact.sha256.clone(),
        };
        if tokio::fs::metadata(&target).await.is_ok_and(|m| m.is_dir()) {
            self.mark_downloaded(job);
            return Ok(link(target));
        }
        let archive = self.download(job, &store::tmp_dir(&self.settings)).await?;
        let staging =
            store::tmp_dir(&self.settings).join(format!("tree-{:016x}", rand::random::<u64>()));
        let limits = archive::Limits {
            max_entries: 100_000,
            max_bytes: artifact.extraction_limit(),
            reserved_disk_space: self.settings.policy.reserved_disk_space,
        };
        let (a, s) = (archive.clone(), staging.clone());
        let extracted = tokio::task::spawn_blocking(move || {
            let extracted = archive::extract_tree(&a, &s, limits);
            let _ = std::fs::remove_file(&a);
            extracted
        })
        .await
        .map_err(|e| Failure {
            reason: Reason::StagingFailed,
            message: format!("artifact {}: {e}", artifact.name),
        })?
        .map_err(|e| archive_failure(artifact, e));
        let placed = async {
            let files = extracted?;
            if !attributes.owned_by_root() && !files.is_empty() {
                self.give_owner(artifact, files, attributes).await?;
            }
            let s = staging.clone();
            blocking(move || store::place_config(&s, &target))
                .await
                .map_err(|e| io_failure(artifact, "storing the tree", e))
        }
        .await;
        if placed.is_err() {
            let _ = tokio::fs::remove_dir_all(&staging).await;
        }
        self.report(Some(job.view), Report::downloading(job.view));
        placed.map(link)
    }

    /// Gives `files` the artifact's owner through PID 1.
    async fn give_owner(
        &self,
        artifact: &Artifact,
        files: Vec<PathBuf>,
        attributes: FileAttributes,
    ) -> Result<(), Failure> {
        let what = format!("artifact {}", artifact.name);
        self.chown(&files, attributes.owner(), Reason::StagingFailed, &what)
            .await
    }
}

/// Each Config's mode and owner as this node's ids (`None` for other artifacts), looked up
/// once before any download on a blocking thread (NSS may ask a directory service); an
/// owner the node does not know refuses the revision.
pub(super) async fn resolve_attributes(
    artifacts: &[Artifact],
) -> Result<Vec<Option<FileAttributes>>, Failure> {
    let artifacts = artifacts.to_vec();
    tokio::task::spawn_blocking(move || {
        artifacts
            .iter()
            .enumerate()
            .map(|(index, artifact)| {
                (artifact.kind == ArtifactType::Config)
                    .then(|| file_attributes(artifact, index))
                    .transpose()
            })
            .collect()
    })
    .await
    .map_err(|e| Failure {
        reason: Reason::StagingFailed,
        message: format!("resolving the Config artifacts' owners: {e}"),
    })?
}

/// The artifact's `mode` and `owner` as this node's ids.
fn file_attributes(artifact: &Artifact, index: usize) -> Result<FileAttributes, Failure> {
    let refused = |field: &str, message: String| Failure {
        reason: Reason::StagingFailed,
        message: format!(
            "spec.artifacts[{index}].{field} of artifact {}: {message}",
            artifact.name
        ),
    };
    let mode = artifact
        .config_mode()
        .map_err(|message| refused("mode", message))?;
    let (user, group) = artifact
        .config_owner()
        .map_err(|message| refused("owner", message))?;
    let (uid, gid) = owner::resolve(user, group).map_err(|message| refused("owner", message))?;
    Ok(FileAttributes { mode, uid, gid })
}
