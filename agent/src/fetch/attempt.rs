//! One request for an artifact and what its answer means: resuming where the bytes on disk
//! end (Range + If-Range), judging the status and headers, streaming the body, and deciding
//! whether the attempt is done, worth repeating, or final. A registry blob is named by its
//! digest, so it cannot change under a resume: its digest is the validator and its range is
//! asked for without `If-Range`.

use std::path::PathBuf;
use std::time::Duration;

use inplace_proto::Artifact;
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap};

use super::partial::{BodyEnd, Partial};
use super::{Attempt, FetchError, HttpFetcher, Progress, Source, is_disk_full, is_retryable};

/// `Retry-After` as seconds or an HTTP date.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = text.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = chrono::DateTime::parse_from_rfc2822(text).ok()?;
    let delta = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    delta.to_std().ok()
}

/// The validator to resume with: the ETag, unless it is weak (`W/`: `If-Range` only
/// works with a strong one), else Last-Modified.
fn validator(headers: &HeaderMap) -> Option<String> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    text(header::ETAG)
        .filter(|etag| !etag.starts_with("W/"))
        .or_else(|| text(header::LAST_MODIFIED))
        .map(str::to_owned)
}

/// The digest a registry says it serves (`Docker-Content-Digest`).
fn served_digest(headers: &HeaderMap) -> Option<&str> {
    headers.get("docker-content-digest")?.to_str().ok()
}

/// Parses `bytes <start>-<end>/<total>`; returns start and total (when known).
fn content_range(headers: &HeaderMap) -> Option<(u64, Option<u64>)> {
    let text = headers.get(header::CONTENT_RANGE)?.to_str().ok()?;
    let rest = text.strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _end) = range.split_once('-')?;
    Some((start.parse().ok()?, total.parse().ok()))
}

impl HttpFetcher {
    /// One request and its body: ask (resuming when the bytes on disk can be continued),
    /// judge the answer, stream the body, judge how it ended.
    pub(super) async fn attempt(
        &self,
        artifact: &Artifact,
        source: &Source,
        partial: &mut Partial,
        limit: u64,
        progress: Progress<'_>,
    ) -> Attempt {
        // All the bytes are on disk already (an earlier process was killed while flushing
        // them): a Range for nothing would be answered 416 and start it all again; the
        // hash check decides instead.
        if partial.done > 0 && artifact.size == Some(partial.done) {
            return Attempt::Done(());
        }
        let resuming = partial.done > 0 && partial.validator.is_some();
        let make = || {
            let request = self.client.get(&source.url);
            match (&partial.validator, &source.blob) {
                (Some(_), Some(_)) if resuming => {
                    // Closed: some registries do not understand an open range. The size is
                    // the manifest's, so known.
                    let last = artifact.size.unwrap_or(limit).saturating_sub(1);
                    request.header(header::RANGE, format!("bytes={}-{last}", partial.done))
                }
                (Some(v), None) if resuming => request
                    .header(header::RANGE, format!("bytes={}-", partial.done))
                    .header(header::IF_RANGE, v.as_str()),
                _ => request,
            }
        };
        let auth = source.auth.as_ref();
        let response = match self.send_as(make, auth, &artifact.name, &source.url).await {
            Ok(response) => response,
            Err(attempt) => return attempt,
        };
        let answer = accept_answer(artifact, source, partial, limit, resuming, &response).await;
        if let Err(attempt) = answer {
            return attempt;
        }
        let mut body = response.bytes_stream();
        let settings = &self.settings;
        match partial
            .stream(
                &mut body,
                limit,
                settings.stall_timeout,
                settings.min_speed,
                progress,
            )
            .await
        {
            Ok(end) => self.judge_body(artifact, partial, limit, end),
            Err(e) => Attempt::Fail(io_error(&artifact.name, e)),
        }
    }

    /// What a body that ended so means: done, worth another attempt, or final.
    fn judge_body(
        &self,
        artifact: &Artifact,
        partial: &Partial,
        limit: u64,
        end: BodyEnd,
    ) -> Attempt {
        let name = &artifact.name;
        let settings = &self.settings;
        let retry = |detail: String| Attempt::Retry {
            error: transport_error(name, detail),
            after: None,
        };
        match end {
            BodyEnd::Complete => {}
            BodyEnd::Stalled => {
                return retry(format!(
                    "stalled: no bytes for {:?} after {} bytes",
                    settings.stall_timeout, partial.done
                ));
            }
            BodyEnd::TooSlow => {
                return retry(format!(
                    "too slow: under {} bytes/s over {:?}, after {} bytes",
                    settings.min_speed, settings.stall_timeout, partial.done
                ));
            }
            BodyEnd::Broken(detail) => {
                return retry(format!(
                    "transfer broke after {} bytes: {detail}",
                    partial.done
                ));
            }
            BodyEnd::TooLong => {
                let which = if artifact.size.is_some() {
                    " (the declared size)"
                } else {
                    " (the node's limit)"
                };
                return Attempt::Fail(FetchError::SizeMismatch {
                    artifact: name.clone(),
                    detail: format!("the server sent more than {limit} bytes{which}"),
                });
            }
        }
        if let Some(size) = artifact.size
            && partial.done != size
        {
            return Attempt::Retry {
                error: FetchError::SizeMismatch {
                    artifact: name.clone(),
                    detail: format!("the body ended after {} of {size} bytes", partial.done),
                },
                after: None,
            };
        }
        Attempt::Done(())
    }
}

/// Whether the answer's body may be streamed into `partial`: a 206 continuing the same
/// object where the bytes on disk end, or a 200 (from zero, announcing an acceptable size).
/// Anything else resets or ends the attempt.
async fn accept_answer(
    artifact: &Artifact,
    source: &Source,
    partial: &mut Partial,
    limit: u64,
    resuming: bool,
    response: &reqwest::Response,
) -> Result<(), Attempt> {
    let name = &artifact.name;
    let status = response.status();
    let headers = response.headers();
    let io = |e| Attempt::Fail(io_error(name, e));
    let http_error = || FetchError::Http {
        artifact: name.clone(),
        url: source.url.clone(),
        status: status.as_u16(),
    };
    match status {
        StatusCode::PARTIAL_CONTENT if resuming => {
            let same_object = match &source.blob {
                Some(blob) => served_digest(headers).is_none_or(|d| d == blob.digest),
                None => validator(headers).is_none_or(|v| Some(&v) == partial.validator.as_ref()),
            };
            let starts_right = content_range(headers).is_some_and(|(start, total)| {
                start == partial.done && total.is_none_or(|t| artifact.size.is_none_or(|s| s == t))
            });
            if same_object && starts_right {
                return Ok(());
            }
            // Never stitch two objects: start again from zero.
            partial.reset().await.map_err(io)?;
            Err(Attempt::Retry {
                error: transport_error(
                    name,
                    "the server's partial answer did not match; restarting".into(),
                ),
                after: Some(Duration::ZERO),
            })
        }
        StatusCode::OK => {
            if partial.done > 0 {
                // Range ignored, or the object changed (If-Range): restart from zero.
                partial.reset().await.map_err(io)?;
            }
            partial.validator = match &source.blob {
                Some(blob) => Some(blob.digest.clone()),
                None => validator(headers),
            };
            partial.remember_validator().await.map_err(io)?;
            let Some(length) = response.content_length() else {
                return Ok(());
            };
            let size_mismatch = |detail| {
                Err(Attempt::Fail(FetchError::SizeMismatch {
                    artifact: name.clone(),
                    detail,
                }))
            };
            if let Some(size) = artifact.size
                && length != size
            {
                return size_mismatch(format!(
                    "the server announces {length} bytes, the plan says {size}"
                ));
            }
            if length > limit {
                return size_mismatch(format!(
                    "the server announces {length} bytes, more than the limit of {limit}"
                ));
            }
            Ok(())
        }
        StatusCode::RANGE_NOT_SATISFIABLE => {
            partial.reset().await.map_err(io)?;
            Err(Attempt::Retry {
                error: http_error(),
                after: Some(Duration::ZERO),
            })
        }
        s if is_retryable(s) => Err(Attempt::Retry {
            error: http_error(),
            after: retry_after(headers),
        }),
        _ => Err(Attempt::Fail(http_error())),
    }
}

fn transport_error(artifact: &str, detail: String) -> FetchError {
    FetchError::Transport {
        artifact: artifact.to_owned(),
        detail,
    }
}

/// A file-system error while downloading; a full disk is its own kind (the caller fills in
/// the directory).
fn io_error(artifact: &str, e: std::io::Error) -> FetchError {
    if is_disk_full(&e) {
        FetchError::DiskFull {
            artifact: artifact.to_owned(),
            dir: PathBuf::new(),
        }
    } else {
        FetchError::Io {
            artifact: artifact.to_owned(),
            detail: e.to_string(),
        }
    }
}
