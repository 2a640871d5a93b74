//! Where an artifact's bytes come from: its mirrors in the order the node's `[[mirrors]]`
//! names them, then its origin (`crate::mirrors`). Each source is held to the node policy
//! and gets the credential of its own server; a mirror that fails with something another
//! source may not have (refused by the policy, down, 404, wrong manifest, bytes that do not
//! hash to the plan's sha256) is passed over with its reason and the next one tried. The
//! sha256 is the guarantee, not the mirror: bytes that fail it are dropped before the next
//! source is asked. Local failures (disk, I/O) and the artifact's deadline end the download
//! at once, whichever source was being tried.

use std::path::Path;

use inplace_proto::Artifact;
use inplace_proto::oci::Reference;
use tokio::time::Instant;

use super::partial::Partial;
use super::{FetchError, Fetched, HttpFetcher, Progress, Source, is_disk_full, oci};
use crate::mirrors::Candidate;

impl HttpFetcher {
    /// [`super::Fetcher::fetch`]: the sources in order, into one temporary file that is
    /// removed (with its validator) unless a source delivered the plan's bytes.
    pub(super) async fn fetch_from_sources(
        &self,
        artifact: &Artifact,
        dir: &Path,
        progress: Progress<'_>,
    ) -> Result<Fetched, FetchError> {
        let mut slot = None;
        let mut skipped = Vec::new();
        let result = self
            .try_sources(artifact, dir, progress, &mut slot, &mut skipped)
            .await;
        let Some(mut partial) = slot else {
            return Err(with_skipped(result.err(), skipped, &artifact.name));
        };
        partial.forget_validator().await;
        match result {
            Ok(source) => Ok(Fetched {
                path: partial.path,
                source,
                skipped,
            }),
            Err(mut e) => {
                drop(partial.sink.take());
                if let Err(remove) = tokio::fs::remove_file(&partial.path).await
                    && remove.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(path = %partial.path.display(), error = %remove, "cannot remove temporary file");
                }
                if let FetchError::DiskFull { dir: d, .. } = &mut e {
                    *d = dir.to_path_buf();
                }
                Err(with_skipped(Some(e), skipped, &artifact.name))
            }
        }
    }

    /// Tries each source until one delivers the plan's bytes into `slot` (opened at the
    /// first source that resolves); returns the URL that served them.
    async fn try_sources(
        &self,
        artifact: &Artifact,
        dir: &Path,
        progress: Progress<'_>,
        slot: &mut Option<Partial>,
        skipped: &mut Vec<String>,
    ) -> Result<String, FetchError> {
        let deadline = self.settings.artifact_deadline;
        let until = Instant::now() + deadline;
        let late = |done| FetchError::DeadlineExceeded {
            artifact: artifact.name.clone(),
            deadline,
            done,
        };
        for candidate in self.mirrors.candidates(&artifact.url) {
            let origin = candidate == Candidate::Origin;
            let resolved = tokio::time::timeout_at(until, self.source_of(artifact, &candidate))
                .await
                .unwrap_or_else(|_| Err(late(slot.as_ref().map_or(0, |p| p.done))));
            let (source, sized) = match resolved {
                Ok(resolved) => resolved,
                Err(e) if !origin && moves_on(&e) => {
                    skip(artifact, &candidate, &e, skipped);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let limit = sized.size.unwrap_or(self.max_size).min(self.max_size);
            let partial = match slot {
                Some(partial) => partial,
                None => slot.insert(open_partial(&sized, dir, limit, progress).await?),
            };
            let fetched = self.fetch_into(&sized, &source, partial, limit, progress);
            let result = tokio::time::timeout_at(until, fetched)
                .await
                .unwrap_or_else(|_| Err(late(partial.done)));
            match result {
                Ok(()) => return Ok(source.url),
                Err(e) if !origin && moves_on(&e) => {
                    // A registry blob is named by its digest, so any source may continue
                    // its bytes; another server's file may not be the same object.
                    if source.blob.is_none() && partial.done > 0 {
                        partial
                            .reset()
                            .await
                            .map_err(|io| local_error(&artifact.name, dir, io))?;
                        progress(0);
                    }
                    skip(artifact, &candidate, &e, skipped);
                }
                Err(e) => return Err(e),
            }
        }
        // The origin is always the last candidate, and it returns.
        Err(FetchError::Transport {
            artifact: artifact.name.clone(),
            detail: "no source to fetch from".into(),
        })
    }

    /// Where `candidate` serves `artifact`'s bytes, and the artifact as fetched there (for
    /// a registry artifact, with the size its manifest gives). A mirror outside the node
    /// policy is refused before it is reached.
    async fn source_of(
        &self,
        artifact: &Artifact,
        candidate: &Candidate,
    ) -> Result<(Source, Artifact), FetchError> {
        if let Candidate::Mirror { url, .. } = candidate
            && let Some(problem) = crate::policy::url_problem(url, &self.policy)
        {
            return Err(FetchError::PolicyRefused {
                artifact: artifact.name.clone(),
                detail: problem,
            });
        }
        if !inplace_proto::oci::is_oci(&artifact.url) {
            let url = match candidate {
                Candidate::Mirror { url, .. } => url,
                Candidate::Origin => &artifact.url,
            };
            return Ok((self.http_source(&artifact.name, url)?, artifact.clone()));
        }
        let reference = Reference::parse(&artifact.url).map_err(|detail| FetchError::Registry {
            artifact: artifact.name.clone(),
            detail,
        })?;
        let (endpoint, server) = match candidate {
            Candidate::Mirror { url, server } => (parse(&artifact.name, url)?, server.clone()),
            Candidate::Origin => {
                let endpoint =
                    crate::registry::endpoint(&reference, &self.policy).map_err(|detail| {
                        FetchError::RedirectRefused {
                            artifact: artifact.name.clone(),
                            detail,
                        }
                    })?;
                (endpoint, reference.registry.clone())
            }
        };
        let (url, sized, blob, auth) = self
            .resolve_blob(artifact, &reference, &endpoint, &server)
            .await?;
        let source = Source {
            url,
            blob: Some(blob),
            auth: Some(auth),
        };
        Ok((source, sized))
    }

    /// An http(s) URL as a source, with the node's token for it when it has one.
    fn http_source(&self, artifact: &str, url: &str) -> Result<Source, FetchError> {
        let secret = self
            .credentials
            .for_url(url)
            .map_err(|detail| FetchError::Registry {
                artifact: artifact.to_owned(),
                detail,
            })?;
        let server = url::Url::parse(url)
            .ok()
            .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
            .unwrap_or_default();
        Ok(Source {
            url: url.to_owned(),
            blob: None,
            auth: secret.map(|s| oci::Auth::new(server, Some(s))),
        })
    }
}

/// Whether another source may do better than the one that failed with `e`: not for the
/// node's own disk, nor once the artifact's deadline passed.
fn moves_on(e: &FetchError) -> bool {
    !matches!(
        e,
        FetchError::DiskFull { .. } | FetchError::Io { .. } | FetchError::DeadlineExceeded { .. }
    )
}

/// Notes that `candidate` was passed over, and why, in the log and for the result.
fn skip(artifact: &Artifact, candidate: &Candidate, e: &FetchError, skipped: &mut Vec<String>) {
    let label = candidate.label();
    tracing::warn!(artifact = %artifact.name, source = %label, error = %e, "passing over this source; trying the next");
    let text = e.to_string();
    let why = text
        .strip_prefix(&format!("artifact {}: ", artifact.name))
        .unwrap_or(&text);
    skipped.push(format!("{label}: {why}"));
}

/// The origin's failure `e`, naming the mirrors passed over before it.
fn with_skipped(e: Option<FetchError>, skipped: Vec<String>, artifact: &str) -> FetchError {
    let e = e.unwrap_or_else(|| FetchError::Transport {
        artifact: artifact.to_owned(),
        detail: "no source to fetch from".into(),
    });
    if skipped.is_empty() {
        return e;
    }
    FetchError::Sources {
        skipped,
        last: Box::new(e),
    }
}

/// The temporary file for `artifact` in `dir`, resuming what an earlier process left.
async fn open_partial(
    artifact: &Artifact,
    dir: &Path,
    limit: u64,
    progress: Progress<'_>,
) -> Result<Partial, FetchError> {
    let io = |e| local_error(&artifact.name, dir, e);
    tokio::fs::create_dir_all(dir).await.map_err(io)?;
    let partial = {
        let (artifact, dir) = (artifact.clone(), dir.to_path_buf());
        tokio::task::spawn_blocking(move || Partial::open(&artifact, &dir, limit))
            .await
            .map_err(std::io::Error::other)
            .and_then(|opened| opened)
            .map_err(io)?
    };
    if partial.done > 0 {
        tracing::info!(artifact = %artifact.name, bytes = partial.done, "resuming the partial download of an earlier run");
        progress(partial.done);
    }
    Ok(partial)
}

fn local_error(artifact: &str, dir: &Path, e: std::io::Error) -> FetchError {
    if is_disk_full(&e) {
        FetchError::DiskFull {
            artifact: artifact.to_owned(),
            dir: dir.to_path_buf(),
        }
    } else {
        FetchError::Io {
            artifact: artifact.to_owned(),
            detail: format!("{}: {e}", dir.display()),
        }
    }
}

fn parse(artifact: &str, url: &str) -> Result<url::Url, FetchError> {
    url::Url::parse(url).map_err(|e| FetchError::Registry {
        artifact: artifact.to_owned(),
        detail: format!("{url:?} is not a URL: {e}"),
    })
}
