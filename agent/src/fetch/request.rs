//! Requests below the artifact download: sending with a server's credential (and the 401 →
//! token → again dance), the transport's verdicts, small files into memory (signatures,
//! manifests, tokens) with their own bounded retries, and the pause between attempts.

use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;

use super::attempt::retry_after;
use super::{Attempt, FetchError, HttpFetcher, backoff, error_chain, is_retryable, oci};

impl HttpFetcher {
    /// Sends the request `make` builds, with `auth`'s credential when given; a 401 with a
    /// challenge renews the token (or turns on Basic) and sends it once more. A 401 that
    /// stands ends the fetch, naming the server (never the secret).
    pub(super) async fn send_as<T>(
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
    pub(super) async fn send<T>(
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
    pub(super) async fn fetch_small_as(
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
    pub(super) async fn pause_after_attempt(&self, n: u32, after: Option<Duration>) {
        if n + 1 < self.settings.attempts {
            let delay = after
                .unwrap_or_else(|| backoff(&self.settings, n))
                .min(self.settings.max_backoff);
            tokio::time::sleep(delay).await;
        }
    }
}
