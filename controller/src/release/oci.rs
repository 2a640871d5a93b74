//! `release from-oci`: an extension image kept in an OCI registry, resolved to what a
//! release pins. The name may carry a tag; the manifest it names now (through an index, the
//! platform's) is fetched, checked against its digest, and the layer that is the file
//! chosen, so the release names `oci://REGISTRY/REPOSITORY[:TAG]@sha256:<manifest digest>`
//! with the layer's sha256 and size: the bytes every node will install, whatever the tag
//! points at later. Anonymous pulls, with the registry's `Bearer` token flow.

use std::time::Duration;

use inplace_proto::oci::Named;
use inplace_proto::oci::wire::{
    Descriptor, MANIFEST_TYPES, MAX_MANIFEST_BYTES, Manifest, bearer_params, token_of,
};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use sha2::{Digest, Sha256};
use url::Url;

use super::fetch::{chain, import_client};

/// A token answer larger than this is not a token.
const MAX_TOKEN_BYTES: usize = 64 << 10;

/// How the registry is reached.
#[derive(Debug, Clone)]
pub struct OciSettings {
    /// For each exchange: connect, redirects, headers and body.
    pub timeout: Duration,
    /// Speak http to the registry (one inside the cluster's own network), not https. A
    /// registry on `localhost` or `127.0.0.0/8` is always reached over http.
    pub plain_http: bool,
}

/// The image as the release will name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// `oci://…@sha256:<the image manifest's digest>`.
    pub url: String,
    /// The file's layer digest, 64 hex digits.
    pub sha256: String,
    /// The layer's size.
    pub size: u64,
}

/// Why the image could not be resolved. Each variant has a stable [`OciError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The registry (or its token service) answered with a status other than 2xx.
    #[error("GET {url} answered {status}")]
    Status {
        /// The URL asked for.
        url: String,
        /// The status, with its reason phrase.
        status: String,
    },
    /// No complete answer within the timeout.
    #[error("GET {url}: no complete answer within {}s (--timeout)", .after.as_secs_f64())]
    Timeout {
        /// The URL asked for.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// Connecting, TLS, a refused redirect or a broken body.
    #[error("GET {url} failed: {}", chain(.source))]
    Transport {
        /// The URL asked for.
        url: String,
        /// The client's error.
        source: reqwest::Error,
    },
    /// The registry's answer cannot be used: too large, not a manifest, another digest, no
    /// usable token.
    #[error("GET {url}: {message}")]
    BadAnswer {
        /// The URL asked for.
        url: String,
        /// What is wrong with the answer.
        message: String,
    },
    /// An index without a manifest for the wanted platform.
    #[error("{url} is an index without a linux/{arch} manifest; it has {}", .platforms.join(", "))]
    NoPlatform {
        /// The index's URL.
        url: String,
        /// The architecture looked for (OCI spelling).
        arch: String,
        /// The platforms it has.
        platforms: Vec<String>,
    },
    /// No layer, or no single layer, is the file.
    #[error("{url}: {message}")]
    NoLayer {
        /// The manifest's URL.
        url: String,
        /// Which layers there are.
        message: String,
    },
}

impl OciError {
    /// A short, stable, machine-readable kind (printed with the message).
    pub fn kind(&self) -> &'static str {
        match self {
            OciError::Status { .. } => "http_status",
            OciError::Timeout { .. } => "timeout",
            OciError::Transport { .. } => "transport",
            OciError::BadAnswer { .. } => "bad_answer",
            OciError::NoPlatform { .. } => "no_platform",
            OciError::NoLayer { .. } => "no_layer",
        }
    }
}

/// The OCI spelling (`amd64`, `arm64`) of an architecture as sysext-bakery spells it.
pub fn oci_arch(bakery: &str) -> &str {
    match bakery {
        "x86-64" => "amd64",
        other => other,
    }
}

/// Resolves `named` to the image manifest for linux/`arch` (OCI spelling) and its layer
/// titled `file` (or its only layer).
pub async fn resolve(
    named: &Named,
    arch: &str,
    file: Option<&str>,
    settings: &OciSettings,
) -> Result<Resolved, OciError> {
    let scheme = if settings.plain_http || is_loopback(&named.registry) {
        "http"
    } else {
        "https"
    };
    let base = format!(
        "{scheme}://{}/v2/{}/manifests/",
        named.registry, named.repository
    );
    let registry = Registry::new(settings, &named.repository, &base)?;
    let first = format!("{base}{}", named.manifest_reference());
    let (mut manifest, mut digest) = registry.manifest(&first, named.digest.as_deref()).await?;
    let mut url = first;
    if !manifest.manifests.is_empty() {
        let entry =
            platform_manifest(&manifest, arch).map_err(|platforms| OciError::NoPlatform {
                url: url.clone(),
                arch: arch.to_owned(),
                platforms,
            })?;
        url = format!("{base}{}", entry.digest);
        let expected = entry.sha256().to_owned();
        (manifest, digest) = registry.manifest(&url, Some(&expected)).await?;
        if !manifest.manifests.is_empty() {
            return Err(OciError::BadAnswer {
                url,
                message: "the platform's entry is an index again, not an image manifest".into(),
            });
        }
    }
    let layer = layer(&manifest, file).map_err(|message| OciError::NoLayer {
        url: url.clone(),
        message,
    })?;
    Ok(Resolved {
        url: named.pinned(&digest),
        sha256: layer.sha256().to_owned(),
        size: layer.size,
    })
}

/// Whether `registry` (`host[:port]`) is this machine's own, which is reached over http as
/// Docker, containerd and crane do (a registry a person runs locally has no certificate).
fn is_loopback(registry: &str) -> bool {
    let host = registry.rsplit_once(':').map_or(registry, |(host, _)| host);
    host == "localhost"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The index entry for linux/`arch`; else every platform the index has.
pub fn platform_manifest<'m>(
    index: &'m Manifest,
    arch: &str,
) -> Result<&'m Descriptor, Vec<String>> {
    index
        .manifests
        .iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch)
        })
        .ok_or_else(|| {
            index
                .manifests
                .iter()
                .map(|m| match &m.platform {
                    Some(p) => format!("{}/{}", p.os, p.architecture),
                    None => "an entry without a platform".to_owned(),
                })
                .collect()
        })
}

/// The layer that is the file: the one titled `file` (`org.opencontainers.image.title`,
/// as `oras push` names it), or without `--file` the only layer. The error lists the
/// layers by title.
pub fn layer<'m>(manifest: &'m Manifest, file: Option<&str>) -> Result<&'m Descriptor, String> {
    let titles = || {
        let titles: Vec<&str> = manifest
            .layers
            .iter()
            .map(|l| l.title().unwrap_or("(untitled)"))
            .collect();
        titles.join(", ")
    };
    match (file, manifest.layers.as_slice()) {
        (_, []) => Err("the manifest has no layers".into()),
        (None, [only]) => Ok(only),
        (None, layers) => Err(format!(
            "the manifest has {} layers ({}); name the file with --file",
            layers.len(),
            titles()
        )),
        (Some(file), layers) => {
            let mut titled = layers.iter().filter(|l| l.title() == Some(file));
            match (titled.next(), titled.next()) {
                (Some(layer), None) => Ok(layer),
                (Some(_), Some(_)) => Err(format!("several layers are titled {file:?}")),
                (None, _) => Err(format!(
                    "no layer is titled {file:?} (org.opencontainers.image.title); it has {}",
                    titles()
                )),
            }
        }
    }
}

/// One registry's repository, read anonymously; a `Bearer` challenge is answered once with
/// a token from the service it names.
struct Registry {
    client: reqwest::Client,
    timeout: Duration,
    /// The scope asked for when the challenge names none.
    scope: String,
}

impl Registry {
    fn new(settings: &OciSettings, repository: &str, base: &str) -> Result<Registry, OciError> {
        let client = import_client(settings.timeout).map_err(|source| OciError::Transport {
            url: base.to_owned(),
            source,
        })?;
        Ok(Registry {
            client,
            timeout: settings.timeout,
            scope: format!("repository:{repository}:pull"),
        })
    }

    /// The manifest at `url`, checked to hash to `expected` when given; with its digest.
    async fn manifest(
        &self,
        url: &str,
        expected: Option<&str>,
    ) -> Result<(Manifest, String), OciError> {
        let body = self.get(url, MANIFEST_TYPES).await?;
        let digest = hex::encode(Sha256::digest(&body));
        if let Some(expected) = expected.filter(|e| **e != digest) {
            return Err(OciError::BadAnswer {
                url: url.to_owned(),
                message: format!(
                    "the manifest's sha256 is {digest}, not the digest asked for ({expected})"
                ),
            });
        }
        let manifest = serde_json::from_slice(&body).map_err(|e| OciError::BadAnswer {
            url: url.to_owned(),
            message: format!("not a manifest: {e}"),
        })?;
        Ok((manifest, digest))
    }

    /// The body at `url`, within [`MAX_MANIFEST_BYTES`], with a token if the registry
    /// asks for one.
    async fn get(&self, url: &str, accept: &str) -> Result<Vec<u8>, OciError> {
        let request = || self.client.get(url).header(ACCEPT, accept);
        let mut response = request().send().await.map_err(|e| self.failed(url, e))?;
        if response.status() == StatusCode::UNAUTHORIZED {
            let challenge = response
                .headers()
                .get_all(WWW_AUTHENTICATE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find_map(bearer_params);
            if let Some(challenge) = challenge {
                let token = self.token(url, &challenge).await?;
                response = request()
                    .header(AUTHORIZATION, format!("Bearer {token}"))
                    .send()
                    .await
                    .map_err(|e| self.failed(url, e))?;
            }
        }
        if !response.status().is_success() {
            return Err(OciError::Status {
                url: url.to_owned(),
                status: response.status().to_string(),
            });
        }
        self.body(url, response, MAX_MANIFEST_BYTES).await
    }

    /// A pull token from the service the challenge names (anonymous).
    async fn token(&self, url: &str, challenge: &[(String, String)]) -> Result<String, OciError> {
        let param = |key: &str| {
            challenge
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let bad = |message: String| OciError::BadAnswer {
            url: url.to_owned(),
            message,
        };
        let realm =
            param("realm").ok_or_else(|| bad("a Bearer challenge without a realm".into()))?;
        let mut service = Url::parse(realm)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| bad(format!("the token service {realm:?} is not an http(s) URL")))?;
        {
            let mut query = service.query_pairs_mut();
            if let Some(name) = param("service") {
                query.append_pair("service", name);
            }
            query.append_pair("scope", param("scope").unwrap_or(&self.scope));
        }
        let service = service.to_string();
        let response = self
            .client
            .get(&service)
            .send()
            .await
            .map_err(|e| self.failed(&service, e))?;
        if !response.status().is_success() {
            return Err(OciError::Status {
                url: service,
                status: response.status().to_string(),
            });
        }
        let body = self.body(&service, response, MAX_TOKEN_BYTES).await?;
        token_of(&body).ok_or_else(|| OciError::BadAnswer {
            url: service,
            message: "the token service's answer holds no token".into(),
        })
    }

    async fn body(
        &self,
        url: &str,
        mut response: reqwest::Response,
        limit: usize,
    ) -> Result<Vec<u8>, OciError> {
        let too_large = || OciError::BadAnswer {
            url: url.to_owned(),
            message: format!("the answer is larger than {limit} bytes"),
        };
        if response.content_length().is_some_and(|l| l > limit as u64) {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.failed(url, e))? {
            if body.len() + chunk.len() > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    fn failed(&self, url: &str, source: reqwest::Error) -> OciError {
        if source.is_timeout() {
            OciError::Timeout {
                url: url.to_owned(),
                after: self.timeout,
            }
        } else {
            OciError::Transport {
                url: url.to_owned(),
                source,
            }
        }
    }
}

#[cfg(test)]
mod tests;
