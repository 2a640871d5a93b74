//! Downloads: one streaming pass through sha256 into a temporary file in the target
//! directory (so the final rename stays on one file system), size enforced while
//! streaming, Range resume only when the server proves it is the same object, bounded
//! retries with backoff and jitter, `Retry-After` honoured, redirects checked against the
//! node policy. An `oci://` artifact is resolved to its registry blob first (`oci`), then
//! downloaded the same way. Mirrors come before the origin (`sources`); requests below
//! the download (credentials, small files) are in `request`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use inplace_proto::Artifact;
use reqwest::StatusCode;
use sha2::Digest;

use crate::credentials::CredentialSettings;
use crate::mirrors::Mirrors;
use crate::settings::{DownloadSettings, Policy};

mod attempt;
mod error;
mod oci;
mod partial;
mod request;
mod resume;
mod sources;

pub use error::FetchError;
use partial::Partial;
pub use resume::partial_names;

/// Reports bytes done so far (called from the download loop; keep it cheap).
pub type Progress<'a> = &'a (dyn Fn(u64) + Send + Sync);

/// Downloads one artifact into a verified temporary file.
#[async_trait]
pub trait Fetcher: Send + Sync {
    /// Downloads `artifact` into a temporary file in `dir` and returns its path and where
    /// its bytes came from: the file is complete, flushed and matches the plan's sha256
    /// (and size, when given). A partial download an earlier process left in `dir` is
    /// resumed ([`partial_names`]). On error no temporary file is left behind.
    async fn fetch(
        &self,
        artifact: &Artifact,
        dir: &Path,
        progress: Progress<'_>,
    ) -> Result<Fetched, FetchError>;

    /// Downloads a small file (a signature) into memory: at most `limit` bytes, with the
    /// same redirect policy, retries and timeouts as artifacts. `what` names it in errors.
    async fn fetch_small(&self, what: &str, url: &str, limit: usize)
    -> Result<Vec<u8>, FetchError>;
}

/// A verified download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The temporary file holding the artifact.
    pub path: PathBuf,
    /// The URL that served the bytes: the artifact's own, a mirror's, or for a registry
    /// artifact the blob's at its registry or mirror (before any redirect).
    pub source: String,
    /// The sources tried first and why each was passed over (`mirror URL: reason`).
    pub skipped: Vec<String>,
}

/// The real fetcher, over reqwest.
pub struct HttpFetcher {
    client: reqwest::Client,
    settings: DownloadSettings,
    max_size: u64,
    /// Where registries and their token services may be reached.
    policy: Policy,
    /// Where the node's credentials are.
    credentials: CredentialSettings,
    /// Where else the artifacts are served.
    mirrors: Mirrors,
}

/// Where an artifact's bytes are fetched from.
struct Source {
    /// The artifact's own URL, or its registry blob's.
    url: String,
    /// For a registry blob: its digest.
    blob: Option<oci::Blob>,
    /// The registry's or the server's credential and token, when it may need one.
    auth: Option<oci::Auth>,
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
                .user_agent(format!("inplace-agent/{}", crate::build_version()))
                .no_proxy()
        })?;
        Ok(HttpFetcher {
            client,
            settings: settings.clone(),
            max_size: policy.max_artifact_size,
            policy: policy.clone(),
            credentials: CredentialSettings::default(),
            mirrors: Mirrors::default(),
        })
    }

    /// The fetcher with the node's credentials (by default, none: every request is
    /// anonymous).
    pub fn with_credentials(mut self, credentials: CredentialSettings) -> Self {
        self.credentials = credentials;
        self
    }

    /// The fetcher with the node's mirrors (by default, none: the origin alone).
    pub fn with_mirrors(mut self, mirrors: Mirrors) -> Self {
        self.mirrors = mirrors;
        self
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
        self.fetch_small_as(what, url, limit, None).await
    }

    async fn fetch(
        &self,
        artifact: &Artifact,
        dir: &Path,
        progress: Progress<'_>,
    ) -> Result<Fetched, FetchError> {
        self.fetch_from_sources(artifact, dir, progress).await
    }
}

impl HttpFetcher {
    async fn fetch_into(
        &self,
        artifact: &Artifact,
        source: &Source,
        partial: &mut Partial,
        limit: u64,
        progress: Progress<'_>,
    ) -> Result<(), FetchError> {
        let mut last_error = None;
        for n in 0..self.settings.attempts {
            match self
                .attempt(artifact, source, partial, limit, progress)
                .await
            {
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
