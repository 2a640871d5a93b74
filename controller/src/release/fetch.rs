//! Fetches a small text file (a `SHA256SUMS`) over http(s) for `release from-sha256sums`:
//! a size cap, an overall timeout, no downgrade from https to http on redirects, and every
//! failure naming the URL; and the HTTP client every outbound request of the controller is
//! built with ([`build_client`], also used by the alert gate).

use std::time::Duration;

use url::Url;

/// The most a SHA256SUMS file may hold. sysext-bakery's largest lists a few hundred images
/// at about 100 bytes a line; anything near this is not a checksum list.
pub const MAX_SUMS_BYTES: usize = 4 * 1024 * 1024;

/// Redirects followed at most (GitHub release downloads take one).
const MAX_REDIRECTS: usize = 10;

/// How a fetch is bounded.
#[derive(Debug, Clone)]
pub struct FetchSettings {
    /// For the whole exchange: connect, redirects, headers and body.
    pub timeout: Duration,
    /// The largest body accepted.
    pub max_bytes: usize,
}

/// Why the file could not be fetched. Each variant has a stable [`FetchError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The server answered with a status other than 2xx.
    #[error("GET {url} answered {status}")]
    Status {
        /// The URL asked for.
        url: Url,
        /// The status, with its reason phrase.
        status: String,
    },
    /// The body is larger than the cap.
    #[error("GET {url}: the body is larger than {limit} bytes; is this a SHA256SUMS file?")]
    TooLarge {
        /// The URL asked for.
        url: Url,
        /// The cap.
        limit: usize,
    },
    /// The body is not UTF-8 text.
    #[error("GET {url}: the body is not UTF-8 text; is this a SHA256SUMS file?")]
    NotText {
        /// The URL asked for.
        url: Url,
    },
    /// No complete answer within the timeout.
    #[error("GET {url}: no complete answer within {}s (--timeout)", .after.as_secs_f64())]
    Timeout {
        /// The URL asked for.
        url: Url,
        /// The timeout.
        after: Duration,
    },
    /// Connecting, TLS, a refused redirect or a broken body.
    #[error("GET {url} failed: {}", chain(.source))]
    Transport {
        /// The URL asked for.
        url: Url,
        /// The client's error.
        source: reqwest::Error,
    },
}

impl FetchError {
    /// A short, stable, machine-readable kind (printed with the message).
    pub fn kind(&self) -> &'static str {
        match self {
            FetchError::Status { .. } => "http_status",
            FetchError::TooLarge { .. } => "too_large",
            FetchError::NotText { .. } => "not_text",
            FetchError::Timeout { .. } => "timeout",
            FetchError::Transport { .. } => "transport",
        }
    }
}

/// The error and its causes on one line: reqwest's own message rarely says why.
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

/// Why a redirect to `next` must not be followed, after `previous` (the URLs asked for so
/// far): too many hops, or a step down from https to anything else.
fn redirect_refusal(previous: &[Url], next: &Url) -> Option<String> {
    if previous.len() > MAX_REDIRECTS {
        return Some(format!("more than {MAX_REDIRECTS} redirects"));
    }
    let downgrade = next.scheme() != "https" && previous.iter().any(|u| u.scheme() == "https");
    downgrade.then(|| format!("refused the redirect from https to {next}"))
}

/// Builds an HTTP client from `builder` with the process-wide rustls provider (ring, as
/// kube-rs uses). A machine without system trust roots still gets a client, for http; https
/// then fails with a certificate error naming the URL.
pub(crate) fn build_client(
    builder: impl Fn() -> reqwest::ClientBuilder,
) -> Result<reqwest::Client, reqwest::Error> {
    // Err means a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    builder()
        .build()
        .or_else(|_| builder().tls_certs_only(Vec::new()).build())
}

/// The client of the `release from-…` commands: the whole exchange within `timeout`,
/// redirects followed except from https down to http.
pub(crate) fn import_client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    build_client(|| {
        reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::custom(
                |attempt| match redirect_refusal(attempt.previous(), attempt.url()) {
                    Some(why) => attempt.error(why),
                    None => attempt.follow(),
                },
            ))
            .user_agent(concat!("inplace-controller/", env!("CARGO_PKG_VERSION")))
    })
}

/// Downloads `url` as text within `settings`.
pub async fn fetch_text(url: &Url, settings: &FetchSettings) -> Result<String, FetchError> {
    let failed = |source: reqwest::Error| {
        if source.is_timeout() {
            FetchError::Timeout {
                url: url.clone(),
                after: settings.timeout,
            }
        } else {
            FetchError::Transport {
                url: url.clone(),
                source,
            }
        }
    };
    let client = import_client(settings.timeout).map_err(failed)?;
    let mut response = client.get(url.clone()).send().await.map_err(failed)?;
    if !response.status().is_success() {
        return Err(FetchError::Status {
            url: url.clone(),
            status: response.status().to_string(),
        });
    }
    let too_large = || FetchError::TooLarge {
        url: url.clone(),
        limit: settings.max_bytes,
    };
    if response
        .content_length()
        .is_some_and(|length| length > settings.max_bytes as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if body.len() + chunk.len() > settings.max_bytes {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| FetchError::NotText { url: url.clone() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn urls(texts: &[&str]) -> Vec<Url> {
        texts.iter().map(|t| Url::parse(t).unwrap()).collect()
    }

    #[test]
    fn redirects_are_followed_unless_they_leave_https_or_go_on_too_long() {
        let https = urls(&["https://github.example/r/SHA256SUMS"]);
        let next = Url::parse("https://objects.example/signed?x=1").unwrap();
        assert_eq!(redirect_refusal(&https, &next), None);
        let http = urls(&["http://mirror.example/SHA256SUMS"]);
        assert_eq!(redirect_refusal(&http, &next), None);
        let plain = Url::parse("http://mirror.example/SHA256SUMS").unwrap();
        assert_eq!(redirect_refusal(&http, &plain), None);

        assert_eq!(
            redirect_refusal(&https, &plain).as_deref(),
            Some("refused the redirect from https to http://mirror.example/SHA256SUMS")
        );
        let long: Vec<Url> = (0..=MAX_REDIRECTS)
            .map(|i| Url::parse(&format!("https://example/{i}")).unwrap())
            .collect();
        assert_eq!(
            redirect_refusal(&long, &next).as_deref(),
            Some("more than 10 redirects")
        );
    }
}
