//! Downloads: one streaming pass through sha256 into a temporary file in the target
//! directory (so the final rename stays on one file system), size enforced while
//! streaming, Range resume only when the server proves it is the same object, bounded
//! retries with backoff and jitter, `Retry-After` honoured, redirects checked against the
//! node policy. An `oci://` artifact is resolved to its registry blob first (`oci`), then
//! downloaded the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use inplace_proto::Artifact;
use reqwest::StatusCode;
use sha2::Digest;

use crate::credentials::CredentialSettings;
use crate::settings::{DownloadSettings, Policy};

mod attempt;
mod error;
mod oci;
mod partial;
mod resume;

use attempt::retry_after;
pub use error::FetchError;
use partial::Partial;
pub use resume::partial_names;

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
    /// Where registries and their token services may be reached.
    policy: Policy,
    /// Where the node's credentials are.
    credentials: CredentialSettings,
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
                .user_agent(format!("inplace-agent/{}", crate::BUILD_VERSION))
                .no_proxy()
        })?;
        Ok(HttpFetcher {
            client,
            settings: settings.clone(),
            max_size: policy.max_artifact_size,
            policy: policy.clone(),
            credentials: CredentialSettings::default(),
        })
    }

    /// The fetcher with the node's credentials (by default, none: every request is
    /// anonymous).
    pub fn with_credentials(mut self, credentials: CredentialSettings) -> Self {
        self.credentials = credentials;
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
    ) -> Result<PathBuf, FetchError> {
        let deadline = self.settings.artifact_deadline;
        let (source, artifact) = tokio::time::timeout(deadline, self.source_of(artifact))
            .await
            .unwrap_or_else(|_| {
                Err(FetchError::DeadlineExceeded {
                    artifact: artifact.name.clone(),
                    deadline,
                    done: 0,
                })
            })?;
        let artifact = &artifact;
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
        let result = tokio::time::timeout(
            deadline,
            self.fetch_into(artifact, &source, &mut partial, limit, progress),
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
    /// Where `artifact`'s bytes come from, and the artifact as fetched (for a registry
    /// artifact, with the size its manifest gives).
    async fn source_of(&self, artifact: &Artifact) -> Result<(Source, Artifact), FetchError> {
        if !inplace_proto::oci::is_oci(&artifact.url) {
            let secret =
                self.credentials
                    .for_url(&artifact.url)
                    .map_err(|detail| FetchError::Registry {
                        artifact: artifact.name.clone(),
                        detail,
                    })?;
            let server = url::Url::parse(&artifact.url)
                .ok()
                .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
                .unwrap_or_default();
            let source = Source {
                url: artifact.url.clone(),
                blob: None,
                auth: secret.map(|s| oci::Auth::new(server, Some(s))),
            };
            return Ok((source, artifact.clone()));
        }
        let reference = inplace_proto::oci::Reference::parse(&artifact.url).map_err(|detail| {
            FetchError::Registry {
                artifact: artifact.name.clone(),
                detail,
            }
        })?;
        let (url, artifact, blob, auth) = self.resolve_blob(artifact, &reference).await?;
        let source = Source {
            url,
            blob: Some(blob),
            auth: Some(auth),
        };
        Ok((source, artifact))
    }

    /// Sends the request `make` builds, with `auth`'s credential when given; a 401 with a
    /// challenge renews the token (or turns on Basic) and sends it once more. A 401 that
    /// stands ends the fetch, naming the server (never the secret).
    async fn send_as<T>(
        &self,
        make: impl Fn() -> reqwest::RequestBuilder,
        auth: Option<&oci::Auth>,
        what: &str,
        url: &str,
    ) -> Result<reqwest::Response, Attempt<T>> {
        let build = || match auth {
            Some(auth) => auth.apply(make()),
            None => make(),
        };
        let response = self.send(build(), what, url).await?;
        let Some(auth) = auth.filter(|_| response.status() == StatusCode::UNAUTHORIZED) else {
            return Ok(response);
        };
        let refused = || {
            Attempt::Fail(FetchError::Registry {
                artifact: what.to_owned(),
                detail: auth.refused(url),
            })
        };
        match auth.renew(self, response.headers(), what).await {
            Ok(true) => match self.send(build(), what, url).await? {
                again if again.status() == StatusCode::UNAUTHORIZED => Err(refused()),
                again => Ok(again),
            },
            Ok(false) => Err(refused()),
            Err(e @ FetchError::Transport { .. }) => Err(Attempt::Retry {
                error: e,
                after: None,
            }),
            Err(e @ FetchError::Http { status, .. })
                if StatusCode::from_u16(status).is_ok_and(is_retryable) =>
            {
                Err(Attempt::Retry {
                    error: e,
                    after: None,
                })
            }
            Err(e) => Err(Attempt::Fail(e)),
        }
    }

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

    /// [`Fetcher::fetch_small`], for a registry with the media types to accept and its
    /// token.
    async fn fetch_small_as(
        &self,
        what: &str,
        url: &str,
        limit: usize,
        registry: Option<(&str, &oci::Auth)>,
    ) -> Result<Vec<u8>, FetchError> {
        let mut last_error = None;
        for n in 0..self.settings.attempts {
            match self.small_attempt(what, url, limit, registry).await {
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

    /// One attempt of [`HttpFetcher::fetch_small_as`].
    async fn small_attempt(
        &self,
        what: &str,
        url: &str,
        limit: usize,
        registry: Option<(&str, &oci::Auth)>,
    ) -> Attempt<Vec<u8>> {
        let transport = |detail: String| FetchError::Transport {
            artifact: what.to_owned(),
            detail,
        };
        let make = || match registry {
            Some((accept, _)) => self.client.get(url).header(reqwest::header::ACCEPT, accept),
            None => self.client.get(url),
        };
        let auth = registry.map(|(_, auth)| auth);
        let response = match self.send_as(make, auth, what, url).await {
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
