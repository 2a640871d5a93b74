//! Downloads: one streaming pass through sha256 into a temporary file in the target
//! directory (so the final rename stays on one file system), size enforced while
//! streaming, Range resume only when the server proves it is the same object, bounded
//! retries with backoff and jitter, `Retry-After` honoured, redirects checked against the
//! node policy.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use inplace_proto::{Artifact, Reason};
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap};
use sha2::{Digest, Sha256};

use crate::settings::{DownloadSettings, Policy};

mod resume;
pub use resume::partial_names;

/// Why a download failed. Each kind maps to a condition reason.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The server answered with a status that will not change on retry (404, 401, 403,
    /// other 4xx), or retryable statuses until the attempts ran out.
    #[error("artifact {artifact}: {url} answered HTTP {status}")]
    Http {
        /// The artifact.
        artifact: String,
        /// The URL.
        url: String,
        /// The last status code.
        status: u16,
    },
    /// Connection, TLS or timeout problems until the attempts ran out.
    #[error("artifact {artifact}: {detail}")]
    Transport {
        /// The artifact.
        artifact: String,
        /// What happened on the last attempt.
        detail: String,
    },
    /// A redirect went somewhere the node policy forbids.
    #[error("artifact {artifact}: redirect refused: {detail}")]
    RedirectRefused {
        /// The artifact.
        artifact: String,
        /// Where to and why.
        detail: String,
    },
    /// The bytes do not hash to the plan's sha256 (on every attempt).
    #[error("artifact {artifact}: sha256 is {actual}, the plan says {expected}")]
    HashMismatch {
        /// The artifact.
        artifact: String,
        /// From the plan.
        expected: String,
        /// What arrived.
        actual: String,
    },
    /// More or fewer bytes than declared or allowed.
    #[error("artifact {artifact}: {detail}")]
    SizeMismatch {
        /// The artifact.
        artifact: String,
        /// What the server sent versus the limit.
        detail: String,
    },
    /// Not downloaded within `[download] artifact_deadline` of the first request.
    #[error(
        "artifact {artifact}: not downloaded within the [download] artifact_deadline of {deadline:?} ({done} bytes in)"
    )]
    DeadlineExceeded {
        /// The artifact.
        artifact: String,
        /// The configured deadline.
        deadline: Duration,
        /// Bytes received when it passed.
        done: u64,
    },
    /// No space left on the target file system; the temporary file was removed.
    #[error("artifact {artifact}: no space left in {dir}")]
    DiskFull {
        /// The artifact.
        artifact: String,
        /// The directory.
        dir: PathBuf,
    },
    /// Another local I/O error.
    #[error("artifact {artifact}: {detail}")]
    Io {
        /// The artifact.
        artifact: String,
        /// The cause.
        detail: String,
    },
}

impl FetchError {
    /// The condition reason for this error.
    pub fn reason(&self) -> Reason {
        match self {
            FetchError::Http { .. }
            | FetchError::Transport { .. }
            | FetchError::DeadlineExceeded { .. }
            | FetchError::Io { .. } => Reason::DownloadFailed,
            FetchError::RedirectRefused { .. } => Reason::PolicyDenied,
            FetchError::HashMismatch { .. } => Reason::HashMismatch,
            FetchError::SizeMismatch { .. } => Reason::SizeMismatch,
            FetchError::DiskFull { .. } => Reason::DiskFull,
        }
    }
}

/// Reports bytes done so far (called from the download loop; keep it cheap).
pub type Progress<'a> = &'a (dyn Fn(u64) + Send + Sync);

/// Downloads one artifact into a verified temporary file.
#[async_trait]
pub trait Fetcher: Send + Sync {
    /// Downloads `artifact` into a temporary file in `dir` and returns its path: the file
    /// is complete, flushed and matches the plan's sha256 (and size, when given). A partial
    /// download an earlier process left in `dir` is resumed ([`partial_names`]). On error
    /// no temporary file is left behind.
    async fn fetch(
        &self,
        artifact: &Artifact,
        dir: &Path,
        progress: Progress<'_>,
    ) -> Result<PathBuf, FetchError>;

    /// Downloads a small file (a signature) into memory: at most `limit` bytes, with the
    /// same redirect policy, retries and timeouts as artifacts. `what` names it in errors.
    async fn fetch_small(&self, what: &str, url: &str, limit: usize)
    -> Result<Vec<u8>, FetchError>;
}

/// The real fetcher, over reqwest.
pub struct HttpFetcher {
    client: reqwest::Client,
    settings: DownloadSettings,
    max_size: u64,
}

/// Installs ring as the process-wide rustls provider (kube-rs uses ring too). Idempotent.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl HttpFetcher {
    /// A fetcher that follows redirects only within `policy`.
    pub fn new(settings: &DownloadSettings, policy: &Policy) -> Result<Self, reqwest::Error> {
        install_crypto_provider();
        let redirect = || {
            let policy = policy.clone();
            reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 5 {
                    return attempt.error("more than 5 redirects");
                }
                match crate::policy::url_problem(attempt.url().as_str(), &policy) {
                    Some(problem) => attempt.error(problem),
                    None => attempt.follow(),
                }
            })
        };
        let client = build_client(|| {
            reqwest::Client::builder()
                .redirect(redirect())
                .connect_timeout(settings.connect_timeout)
                .read_timeout(settings.stall_timeout)
                .user_agent(concat!("inplace-agent/", env!("CARGO_PKG_VERSION")))
                .no_proxy()
        })?;
        Ok(HttpFetcher {
            client,
            settings: settings.clone(),
            max_size: policy.max_artifact_size,
        })
    }
}

/// Builds a client with the system's trust roots. A host without any (a minimal image)
/// still gets a client: plain-http requests work and every https request fails closed.
pub fn build_client(
    builder: impl Fn() -> reqwest::ClientBuilder,
) -> Result<reqwest::Client, reqwest::Error> {
    builder().build().or_else(|e| {
        tracing::warn!(error = %error_chain(&e), "no usable system trust roots; https requests will fail");
        builder().tls_certs_only(Vec::new()).build()
    })
}

/// What one attempt ended with, and what it delivered.
enum Attempt<T = ()> {
    Done(T),
    /// Try again after at least this long (from `Retry-After`), keeping resumable bytes.
    Retry {
        error: FetchError,
        after: Option<Duration>,
    },
    Fail(FetchError),
}

/// Bytes are handed to the writer thread in blocks of this size: large enough that the
/// channel and thread hand-off cost nothing next to the write and the hash.
const BLOCK: usize = 512 << 10;

/// Blocks waiting for the writer. Two keep the network and the disk both busy; more would
/// only pile up in memory while the disk is the slower side (as it is for a large artifact
/// once writeback throttles), so the fetcher's memory stays flat at about
/// (QUEUED + 2) × BLOCK whatever the artifact's size.
const QUEUED: usize = 2;

/// Every this many bytes the writer asks the kernel to start writing back and drop what is
/// already on disk, so the final `fsync` has little left to do and a 1 GiB artifact does
/// not push the node's working set out of the page cache.
const WRITEBACK_WINDOW: u64 = 16 << 20;

/// The temporary file and the running hash of what it holds. Writes and hashing happen on
/// a blocking thread, block by block, while the next block is received.
struct Sink {
    file: std::fs::File,
    hasher: Sha256,
    /// Bytes in the file.
    len: u64,
    /// Where the last writeback hint ended.
    advised: u64,
}

impl Sink {
    fn write_block(&mut self, block: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        self.file.write_all(block)?;
        self.hasher.update(block);
        self.len += block.len() as u64;
        if self.len - self.advised >= WRITEBACK_WINDOW {
            // Pages still dirty from the last window are dropped by this call's successor;
            // the hint is advisory, so its failure changes nothing.
            let start = self.advised.saturating_sub(WRITEBACK_WINDOW);
            let _ = nix::fcntl::posix_fadvise(
                &self.file,
                start as i64,
                (self.len - start) as i64,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            );
            self.advised = self.len;
        }
        Ok(())
    }

    fn truncate(&mut self) -> std::io::Result<()> {
        use std::io::Seek;
        self.file.set_len(0)?;
        self.file.seek(std::io::SeekFrom::Start(0))?;
        self.hasher = Sha256::new();
        self.len = 0;
        self.advised = 0;
        Ok(())
    }
}

/// The partial download carried between attempts.
struct Partial {
    path: PathBuf,
    /// Where `validator` is kept for a process that resumes after this one.
    validator_path: PathBuf,
    /// `None` only while a blocking task holds it.
    sink: Option<Sink>,
    done: u64,
    /// ETag or Last-Modified of the object the bytes came from.
    validator: Option<String>,
}

impl Partial {
    /// Runs `work` on the sink on a blocking thread (file I/O never runs on the runtime).
    async fn with_sink<R: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Sink) -> std::io::Result<R> + Send + 'static,
    ) -> std::io::Result<R> {
        let mut sink = self.take_sink()?;
        let (sink, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut sink);
            (sink, result)
        })
        .await
        .map_err(std::io::Error::other)?;
        self.sink = Some(sink);
        result
    }

    fn take_sink(&mut self) -> std::io::Result<Sink> {
        self.sink
            .take()
            .ok_or_else(|| std::io::Error::other("the temporary file was lost by a failed write"))
    }

    async fn reset(&mut self) -> std::io::Result<()> {
        self.with_sink(Sink::truncate).await?;
        self.done = 0;
        self.validator = None;
        self.remember_validator().await
    }

    /// Streams `body` into the sink: the writer thread writes and hashes one block while
    /// the next is received. Every byte received is in the file when this returns, so a
    /// retry resumes exactly at `done`.
    async fn stream<B>(
        &mut self,
        body: &mut B,
        limit: u64,
        stall: Duration,
        min_speed: u64,
        progress: Progress<'_>,
    ) -> Result<BodyEnd, std::io::Error>
    where
        B: futures::Stream<Item = reqwest::Result<Bytes>> + Unpin,
    {
        let mut sink = self.take_sink()?;
        let (blocks, mut incoming) = tokio::sync::mpsc::channel::<Bytes>(QUEUED);
        let writer = tokio::task::spawn_blocking(move || {
            while let Some(block) = incoming.blocking_recv() {
                if let Err(e) = sink.write_block(&block) {
                    return (sink, Err(e));
                }
            }
            (sink, Ok(()))
        });
        let mut pending = BytesMut::with_capacity(BLOCK);
        let mut window = SpeedWindow::new(stall, min_speed);
        let end = loop {
            let chunk = match tokio::time::timeout(stall, body.next()).await {
                Err(_) => break BodyEnd::Stalled,
                Ok(None) => break BodyEnd::Complete,
                Ok(Some(Err(e))) => break BodyEnd::Broken(error_chain(&e)),
                Ok(Some(Ok(chunk))) => chunk,
            };
            if self.done + chunk.len() as u64 > limit {
                break BodyEnd::TooLong;
            }
            if window.too_slow(chunk.len() as u64) {
                break BodyEnd::TooSlow;
            }
            self.done += chunk.len() as u64;
            pending.extend_from_slice(&chunk);
            if pending.len() >= BLOCK && blocks.send(pending.split().freeze()).await.is_err() {
                // The writer stopped on an error; it is returned below.
                break BodyEnd::Complete;
            }
            progress(self.done);
        };
        if !pending.is_empty() {
            let _ = blocks.send(pending.freeze()).await;
        }
        drop(blocks);
        let (sink, written) = writer.await.map_err(std::io::Error::other)?;
        self.done = sink.len;
        self.sink = Some(sink);
        written.map(|()| end)
    }
}

/// Bytes received per window of `length`: a transfer is too slow when a whole window
/// brought fewer than `min_speed` bytes per second (curl's `--speed-limit`/`--speed-time`).
struct SpeedWindow {
    length: Duration,
    min_speed: u64,
    started: std::time::Instant,
    bytes: u64,
}

impl SpeedWindow {
    fn new(length: Duration, min_speed: u64) -> Self {
        SpeedWindow {
            length,
            min_speed,
            started: std::time::Instant::now(),
            bytes: 0,
        }
    }

    /// Counts `received` bytes; true when the window that just closed was too slow.
    fn too_slow(&mut self, received: u64) -> bool {
        self.bytes += received;
        let elapsed = self.started.elapsed();
        if self.min_speed == 0 || elapsed < self.length {
            return false;
        }
        let slow = (self.bytes as f64) < self.min_speed as f64 * elapsed.as_secs_f64();
        self.started = std::time::Instant::now();
        self.bytes = 0;
        slow
    }
}

/// How a response body ended.
enum BodyEnd {
    Complete,
    Stalled,
    TooSlow,
    Broken(String),
    /// More bytes than the limit arrived (the excess was not written).
    TooLong,
}

fn is_disk_full(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(nix::libc::ENOSPC) || e.kind() == std::io::ErrorKind::StorageFull
}

/// The delay before attempt `n + 1`: exponential, capped, with jitter (50–100 %).
pub fn backoff(settings: &DownloadSettings, n: u32) -> Duration {
    let base = settings
        .initial_backoff
        .saturating_mul(1u32 << n.min(16))
        .min(settings.max_backoff);
    let factor = 0.5 + rand::random::<f64>() * 0.5;
    base.mul_f64(factor)
}

/// `Retry-After` as seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
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

/// Parses `bytes <start>-<end>/<total>`; returns start and total (when known).
fn content_range(headers: &HeaderMap) -> Option<(u64, Option<u64>)> {
    let text = headers.get(header::CONTENT_RANGE)?.to_str().ok()?;
    let rest = text.strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _end) = range.split_once('-')?;
    Some((start.parse().ok()?, total.parse().ok()))
}

impl HttpFetcher {
    async fn attempt(
        &self,
        artifact: &Artifact,
        partial: &mut Partial,
        limit: u64,
        progress: Progress<'_>,
    ) -> Attempt {
        let name = &artifact.name;
        let transport = |detail: String| FetchError::Transport {
            artifact: name.clone(),
            detail,
        };
        let io = |e: std::io::Error| {
            if is_disk_full(&e) {
                FetchError::DiskFull {
                    artifact: name.clone(),
                    // The caller fills in the directory.
                    dir: PathBuf::new(),
                }
            } else {
                FetchError::Io {
                    artifact: name.clone(),
                    detail: e.to_string(),
                }
            }
        };
        // All the bytes are on disk already (an earlier process was killed while flushing
        // them): a Range for nothing would be answered 416 and start it all again; the
        // hash check decides instead.
        if partial.done > 0 && artifact.size == Some(partial.done) {
            return Attempt::Done(());
        }
        let mut request = self.client.get(&artifact.url);
        let resuming = partial.done > 0 && partial.validator.is_some();
        if resuming && let Some(v) = &partial.validator {
            request = request
                .header(header::RANGE, format!("bytes={}-", partial.done))
                .header(header::IF_RANGE, v.as_str());
        }
        let response = match self.send(request, name, &artifact.url).await {
            Ok(response) => response,
            Err(attempt) => return attempt,
        };
        let status = response.status();
        let headers = response.headers().clone();
        let http_error = || FetchError::Http {
            artifact: name.clone(),
            url: artifact.url.clone(),
            status: status.as_u16(),
        };
        match status {
            StatusCode::PARTIAL_CONTENT if resuming => {
                let same_object =
                    validator(&headers).is_none_or(|v| Some(&v) == partial.validator.as_ref());
                let starts_right = content_range(&headers).is_some_and(|(start, total)| {
                    start == partial.done
                        && total.is_none_or(|t| artifact.size.is_none_or(|s| s == t))
                });
                if !(same_object && starts_right) {
                    // Never stitch two objects: start again from zero.
                    if let Err(e) = partial.reset().await {
                        return Attempt::Fail(io(e));
                    }
                    return Attempt::Retry {
                        error: transport(
                            "the server's partial answer did not match; restarting".into(),
                        ),
                        after: Some(Duration::ZERO),
                    };
                }
            }
            StatusCode::OK => {
                if partial.done > 0 {
                    // Range ignored, or the object changed (If-Range): restart from zero.
                    if let Err(e) = partial.reset().await {
                        return Attempt::Fail(io(e));
                    }
                }
                partial.validator = validator(&headers);
                if let Err(e) = partial.remember_validator().await {
                    return Attempt::Fail(io(e));
                }
                if let Some(length) = response.content_length() {
                    if let Some(size) = artifact.size
                        && length != size
                    {
                        return Attempt::Fail(FetchError::SizeMismatch {
                            artifact: name.clone(),
                            detail: format!(
                                "the server announces {length} bytes, the plan says {size}"
                            ),
                        });
                    }
                    if length > limit {
                        return Attempt::Fail(FetchError::SizeMismatch {
                            artifact: name.clone(),
                            detail: format!(
                                "the server announces {length} bytes, more than the limit of {limit}"
                            ),
                        });
                    }
                }
            }
            StatusCode::RANGE_NOT_SATISFIABLE => {
                if let Err(e) = partial.reset().await {
                    return Attempt::Fail(io(e));
                }
                return Attempt::Retry {
                    error: http_error(),
                    after: Some(Duration::ZERO),
                };
            }
            s if is_retryable(s) => {
                return Attempt::Retry {
                    error: http_error(),
                    after: retry_after(&headers),
                };
            }
            _ => return Attempt::Fail(http_error()),
        }

        let mut body = response.bytes_stream();
        let end = match partial
            .stream(
                &mut body,
                limit,
                self.settings.stall_timeout,
                self.settings.min_speed,
                progress,
            )
            .await
        {
            Ok(end) => end,
            Err(e) => return Attempt::Fail(io(e)),
        };
        match end {
            BodyEnd::Complete => {}
            BodyEnd::Stalled => {
                return Attempt::Retry {
                    error: transport(format!(
                        "stalled: no bytes for {:?} after {} bytes",
                        self.settings.stall_timeout, partial.done
                    )),
                    after: None,
                };
            }
            BodyEnd::TooSlow => {
                return Attempt::Retry {
                    error: transport(format!(
                        "too slow: under {} bytes/s over {:?}, after {} bytes",
                        self.settings.min_speed, self.settings.stall_timeout, partial.done
                    )),
                    after: None,
                };
            }
            BodyEnd::Broken(detail) => {
                return Attempt::Retry {
                    error: transport(format!(
                        "transfer broke after {} bytes: {detail}",
                        partial.done
                    )),
                    after: None,
                };
            }
            BodyEnd::TooLong => {
                return Attempt::Fail(FetchError::SizeMismatch {
                    artifact: name.clone(),
                    detail: format!(
                        "the server sent more than {limit} bytes{}",
                        if artifact.size.is_some() {
                            " (the declared size)"
                        } else {
                            " (the node's limit)"
                        }
                    ),
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

/// Statuses that may change on retry.
fn is_retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

/// The error and its causes on one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[async_trait]
impl Fetcher for HttpFetcher {
    async fn fetch_small(
        &self,
        what: &str,
        url: &str,
        limit: usize,
    ) -> Result<Vec<u8>, FetchError> {
        let mut last_error = None;
        for n in 0..self.settings.attempts {
            match self.small_attempt(what, url, limit).await {
                Attempt::Done(bytes) => return Ok(bytes),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry { error, after } => {
                    tracing::info!(what, attempt = n + 1, error = %error, "download attempt failed");
                    last_error = Some(error);
                    self.pause_after_attempt(n, after).await;
                }
            }
        }
        Err(last_error.unwrap_or_else(|| FetchError::Transport {
            artifact: what.to_owned(),
            detail: "no attempt was made".into(),
        }))
    }

    async fn fetch(
        &self,
        artifact: &Artifact,
        dir: &Path,
        progress: Progress<'_>,
    ) -> Result<PathBuf, FetchError> {
        let name = artifact.name.clone();
        let limit = artifact.size.unwrap_or(self.max_size).min(self.max_size);
        let io = |e: std::io::Error| {
            if is_disk_full(&e) {
                FetchError::DiskFull {
                    artifact: name.clone(),
                    dir: dir.to_path_buf(),
                }
            } else {
                FetchError::Io {
                    artifact: name.clone(),
                    detail: format!("{}: {e}", dir.display()),
                }
            }
        };
        tokio::fs::create_dir_all(dir).await.map_err(io)?;
        let mut partial = {
            let (artifact, dir) = (artifact.clone(), dir.to_path_buf());
            tokio::task::spawn_blocking(move || Partial::open(&artifact, &dir, limit))
                .await
                .map_err(std::io::Error::other)
                .and_then(|opened| opened)
                .map_err(io)?
        };
        if partial.done > 0 {
            tracing::info!(artifact = %name, bytes = partial.done, "resuming the partial download of an earlier run");
            progress(partial.done);
        }
        let deadline = self.settings.artifact_deadline;
        let result = tokio::time::timeout(
            deadline,
            self.fetch_into(artifact, &mut partial, limit, progress),
        )
        .await
        .unwrap_or_else(|_| {
            Err(FetchError::DeadlineExceeded {
                artifact: name.clone(),
                deadline,
                done: partial.done,
            })
        });
        partial.forget_validator().await;
        match result {
            Ok(()) => Ok(partial.path),
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
                Err(e)
            }
        }
    }
}

impl HttpFetcher {
    /// Sends `request`: no answer in time and transport errors end the attempt with a retry,
    /// a redirect the policy refused ends it for good.
    async fn send<T>(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
        url: &str,
    ) -> Result<reqwest::Response, Attempt<T>> {
        let transport = |detail: String| FetchError::Transport {
            artifact: what.to_owned(),
            detail,
        };
        match tokio::time::timeout(self.settings.stall_timeout, request.send()).await {
            Err(_) => Err(Attempt::Retry {
                error: transport(format!(
                    "no response from {url} within {:?}",
                    self.settings.stall_timeout
                )),
                after: None,
            }),
            Ok(Err(e)) if e.is_redirect() => Err(Attempt::Fail(FetchError::RedirectRefused {
                artifact: what.to_owned(),
                detail: error_chain(&e),
            })),
            Ok(Err(e)) => Err(Attempt::Retry {
                error: transport(error_chain(&e)),
                after: None,
            }),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// One attempt of [`Fetcher::fetch_small`].
    async fn small_attempt(&self, what: &str, url: &str, limit: usize) -> Attempt<Vec<u8>> {
        let transport = |detail: String| FetchError::Transport {
            artifact: what.to_owned(),
            detail,
        };
        let response = match self.send(self.client.get(url), what, url).await {
            Ok(response) => response,
            Err(attempt) => return attempt,
        };
        let status = response.status();
        if status != StatusCode::OK {
            let error = FetchError::Http {
                artifact: what.to_owned(),
                url: url.to_owned(),
                status: status.as_u16(),
            };
            return if is_retryable(status) {
                Attempt::Retry {
                    error,
                    after: retry_after(response.headers()),
                }
            } else {
                Attempt::Fail(error)
            };
        }
        let too_large = || {
            Attempt::Fail(FetchError::SizeMismatch {
                artifact: what.to_owned(),
                detail: format!("{url} is larger than the limit of {limit} bytes"),
            })
        };
        if response
            .content_length()
            .is_some_and(|length| length > limit as u64)
        {
            return too_large();
        }
        let mut body = response.bytes_stream();
        let mut bytes = Vec::new();
        loop {
            match tokio::time::timeout(self.settings.stall_timeout, body.next()).await {
                Err(_) => {
                    return Attempt::Retry {
                        error: transport(format!(
                            "stalled: no bytes for {:?}",
                            self.settings.stall_timeout
                        )),
                        after: None,
                    };
                }
                Ok(None) => return Attempt::Done(bytes),
                Ok(Some(Err(e))) => {
                    return Attempt::Retry {
                        error: transport(format!("transfer broke: {}", error_chain(&e))),
                        after: None,
                    };
                }
                Ok(Some(Ok(chunk))) => {
                    if bytes.len() + chunk.len() > limit {
                        return too_large();
                    }
                    bytes.extend_from_slice(&chunk);
                }
            }
        }
    }

    /// Waits before attempt `n + 1` (none after the last): `after` (a `Retry-After`) or
    /// the backoff, capped.
    async fn pause_after_attempt(&self, n: u32, after: Option<Duration>) {
        if n + 1 < self.settings.attempts {
            let delay = after
                .unwrap_or_else(|| backoff(&self.settings, n))
                .min(self.settings.max_backoff);
            tokio::time::sleep(delay).await;
        }
    }

    async fn fetch_into(
        &self,
        artifact: &Artifact,
        partial: &mut Partial,
        limit: u64,
        progress: Progress<'_>,
    ) -> Result<(), FetchError> {
        let mut last_error = None;
        for n in 0..self.settings.attempts {
            match self.attempt(artifact, partial, limit, progress).await {
                Attempt::Done(()) => {
                    let expected = artifact.sha256.clone();
                    // Durable before it is called verified: a crash must not leave a
                    // "verified" file half on disk.
                    let mismatch = partial
                        .with_sink(move |sink| {
                            let actual = hex::encode(sink.hasher.clone().finalize());
                            if actual != expected {
                                return Ok(Some(actual));
                            }
                            sink.file.sync_all()?;
                            Ok(None)
                        })
                        .await
                        .map_err(|e| FetchError::Io {
                            artifact: artifact.name.clone(),
                            detail: e.to_string(),
                        })?;
                    let Some(actual) = mismatch else {
                        return Ok(());
                    };
                    let error = FetchError::HashMismatch {
                        artifact: artifact.name.clone(),
                        expected: artifact.sha256.clone(),
                        actual: actual.clone(),
                    };
                    // The same wrong digest twice is what the server serves, not a damaged
                    // transfer: more attempts would only download it again (on every node).
                    if matches!(&last_error, Some(FetchError::HashMismatch { actual: before, .. }) if *before == actual)
                    {
                        partial.reset().await.map_err(|e| FetchError::Io {
                            artifact: artifact.name.clone(),
                            detail: e.to_string(),
                        })?;
                        return Err(error);
                    }
                    tracing::warn!(artifact = %artifact.name, %actual, "sha256 mismatch; downloading again");
                    last_error = Some(error);
                    partial.reset().await.map_err(|e| FetchError::Io {
                        artifact: artifact.name.clone(),
                        detail: e.to_string(),
                    })?;
                    self.pause_after_attempt(n, None).await;
                }
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry { error, after } => {
                    tracing::info!(artifact = %artifact.name, attempt = n + 1, error = %error, "download attempt failed");
                    last_error = Some(error);
                    self.pause_after_attempt(n, after).await;
                }
            }
        }
        Err(last_error.unwrap_or_else(|| FetchError::Transport {
            artifact: artifact.name.clone(),
            detail: "no attempt was made".into(),
        }))
    }
}
