//! Artifacts in OCI registries (`oci://REGISTRY/REPOSITORY@sha256:…`) over the distribution
//! API: the manifest the reference pins (checked against its digest), the layer in it whose
//! digest is the plan's sha256, and that layer's blob, which the ordinary streaming download
//! fetches with its size, resume and hash checks. A registry that answers 401 with a
//! `Bearer` challenge gets the token flow (token service → token → the request again), with
//! the token service held to the node policy like every URL the node fetches.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use inplace_proto::Artifact;
use inplace_proto::oci::Reference;
use inplace_proto::oci::wire::{
    Descriptor, MANIFEST_TYPES, MAX_MANIFEST_BYTES, Manifest, bearer_params, token_of,
};
use reqwest::header::{self, HeaderMap};
use sha2::Digest;

use super::{FetchError, HttpFetcher};
use crate::credentials::Secret;

/// A token answer larger than this is not a token.
const MAX_TOKEN_BYTES: usize = 64 << 10;

/// How requests to one registry (or one download server) are authorised: the node's
/// credential for it, the bearer token its token service gave, and whether it asked for
/// Basic. The secret is sent only to the server it is configured for and its token service.
pub(super) struct Auth {
    /// `host[:port]`, as errors name it.
    pub(super) server: String,
    secret: Option<Secret>,
    token: Mutex<Option<String>>,
    /// The server answered 401 with a `Basic` challenge: the user and password go with
    /// every request from then on.
    basic: AtomicBool,
}

/// A registry blob: content-addressed, so its digest is the validator that makes a resume
/// safe (the bytes behind the URL cannot change).
pub(super) struct Blob {
    /// `sha256:<hex>`.
    pub(super) digest: String,
}

impl Auth {
    /// For `server`, with the node's credential for it (if any).
    pub(super) fn new(server: String, secret: Option<Secret>) -> Auth {
        Auth {
            server,
            secret,
            token: Mutex::new(None),
            basic: AtomicBool::new(false),
        }
    }

    /// `request` with the token from the token service, else the configured bearer token,
    /// else Basic once the server asked for it.
    pub(super) fn apply(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if let Some(token) = self.token.lock().ok().and_then(|t| t.clone()) {
            return request.bearer_auth(token);
        }
        match &self.secret {
            Some(Secret::Bearer(token)) => request.bearer_auth(token),
            Some(Secret::Basic { user, password }) if self.basic.load(Ordering::Relaxed) => {
                request.basic_auth(user, Some(password))
            }
            _ => request,
        }
    }

    /// Why a 401 stands, naming the server and never the secret.
    pub(super) fn refused(&self, url: &str) -> String {
        let why = match &self.secret {
            None => "the node has no credentials for it",
            Some(_) => "it refused the node's credentials for it",
        };
        format!("{} answered HTTP 401 to {url}: {why}", self.server)
    }

    /// After a 401: a new token from the service its `Bearer` challenge names, or Basic
    /// when it asks for that and the node has a user and password for it. False when there
    /// is nothing new to try (the 401 stands).
    pub(super) async fn renew(
        &self,
        fetcher: &HttpFetcher,
        headers: &HeaderMap,
        what: &str,
    ) -> Result<bool, FetchError> {
        let challenges: Vec<&str> = headers
            .get_all(header::WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if let Some(challenge) = challenges.iter().find_map(|c| bearer_params(c)) {
            return self.fetch_token(fetcher, &challenge, what).await;
        }
        let asks_basic = challenges
            .iter()
            .any(|c| c.trim_start().to_ascii_lowercase().starts_with("basic"));
        let has_basic = matches!(self.secret, Some(Secret::Basic { .. }));
        Ok(asks_basic && has_basic && !self.basic.swap(true, Ordering::Relaxed))
    }

    /// The token service's token for `challenge`: asked with the node's user and password
    /// (Basic), its refresh token (an OAuth2 POST), or anonymously.
    async fn fetch_token(
        &self,
        fetcher: &HttpFetcher,
        challenge: &[(String, String)],
        what: &str,
    ) -> Result<bool, FetchError> {
        let realm = challenge
            .iter()
            .find(|(k, _)| k == "realm")
            .map(|(_, v)| v.as_str())
            .unwrap_or_default();
        let registry_error = |detail: String| FetchError::Registry {
            artifact: what.to_owned(),
            detail,
        };
        let mut url = url::Url::parse(realm).map_err(|e| {
            registry_error(format!(
                "the token service {realm:?} of {} is not a URL: {e}",
                self.server
            ))
        })?;
        if let Some(problem) = crate::policy::url_problem(url.as_str(), &fetcher.policy) {
            return Err(FetchError::RedirectRefused {
                artifact: what.to_owned(),
                detail: format!("the token service of {}: {problem}", self.server),
            });
        }
        let params = challenge.iter().filter(|(k, _)| k != "realm");
        let body = match &self.secret {
            Some(Secret::Identity(refresh)) => {
                let mut form: Vec<(&str, &str)> = vec![
                    ("grant_type", "refresh_token"),
                    ("refresh_token", refresh),
                    ("client_id", "inplace-agent"),
                ];
                form.extend(params.map(|(k, v)| (k.as_str(), v.as_str())));
                fetcher
                    .post_token(what, &url, &form, MAX_TOKEN_BYTES)
                    .await?
            }
            secret => {
                for (key, value) in params {
                    url.query_pairs_mut().append_pair(key, value);
                }
                let basic = secret.clone().filter(|s| matches!(s, Secret::Basic { .. }));
                let service = url.host_str().unwrap_or_default().to_owned();
                let auth = Auth::new(format!("the token service {service}"), basic);
                auth.basic.store(true, Ordering::Relaxed);
                // Boxed: a token request is a small fetch, and a small fetch may need a token.
                Box::pin(fetcher.fetch_small_as(
                    what,
                    url.as_str(),
                    MAX_TOKEN_BYTES,
                    Some(("application/json", &auth)),
                ))
                .await?
            }
        };
        let token = token_of(&body).ok_or_else(|| {
            registry_error(format!(
                "the token service {realm} of {} answered without a token",
                self.server
            ))
        })?;
        if let Ok(mut slot) = self.token.lock() {
            *slot = Some(token);
        }
        Ok(true)
    }
}

impl HttpFetcher {
    /// Resolves `artifact`'s registry reference to its blob at `endpoint` (the repository's
    /// distribution API at the registry or one of its mirrors, `server`): the URL, the
    /// artifact with the layer's size, and the blob's digest and token.
    pub(super) async fn resolve_blob(
        &self,
        artifact: &Artifact,
        reference: &Reference,
        endpoint: &url::Url,
        server: &str,
    ) -> Result<(String, Artifact, Blob, Auth), FetchError> {
        let name = &artifact.name;
        let at = if server == reference.registry {
            format!("registry {}", reference.display_name())
        } else {
            format!("mirror {server} of {}", reference.display_name())
        };
        let registry_error = |detail: String| FetchError::Registry {
            artifact: name.clone(),
            detail: format!("{at}: {detail}"),
        };
        let manifest_url = format!("{endpoint}manifests/sha256:{}", reference.digest);
        let blob = Blob {
            digest: format!("sha256:{}", artifact.sha256),
        };
        let secret = self
            .credentials
            .for_registry(server)
            .map_err(&registry_error)?;
        let auth = Auth::new(server.to_owned(), secret);
        let bytes = self
            .fetch_small_as(
                name,
                &manifest_url,
                MAX_MANIFEST_BYTES,
                Some((MANIFEST_TYPES, &auth)),
            )
            .await?;
        let actual = hex::encode(sha2::Sha256::digest(&bytes));
        if actual != reference.digest {
            return Err(registry_error(format!(
                "the manifest's sha256 is {actual}, not the reference's digest"
            )));
        }
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| registry_error(format!("the manifest is not an image manifest: {e}")))?;
        if !manifest.manifests.is_empty() {
            return Err(registry_error(format!(
                "the digest names an index of {} manifests (several platforms); name one platform's manifest",
                manifest.manifests.len()
            )));
        }
        let layer = layer_for(&manifest, artifact)?;
        if let Some(size) = artifact.size
            && size != layer.size
        {
            return Err(FetchError::SizeMismatch {
                artifact: name.clone(),
                detail: format!(
                    "the manifest says {} bytes, the plan says {size}",
                    layer.size
                ),
            });
        }
        let url = format!("{endpoint}blobs/{}", blob.digest);
        let sized = Artifact {
            size: Some(layer.size),
            ..artifact.clone()
        };
        Ok((url, sized, blob, auth))
    }
}

impl HttpFetcher {
    /// An OAuth2 refresh-token grant to a token service (how an `identitytoken` is used),
    /// its answer capped at `limit` bytes. Not retried: the blob's fetch retries as a whole.
    async fn post_token(
        &self,
        what: &str,
        url: &url::Url,
        form: &[(&str, &str)],
        limit: usize,
    ) -> Result<Vec<u8>, FetchError> {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let request = self
            .client
            .post(url.clone())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body);
        let response = match self.send::<()>(request, what, url.as_str()).await {
            Ok(response) => response,
            Err(super::Attempt::Fail(e) | super::Attempt::Retry { error: e, .. }) => return Err(e),
            Err(super::Attempt::Done(())) => match unreachable_answer(what)? {},
        };
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Err(FetchError::Registry {
                artifact: what.to_owned(),
                detail: format!(
                    "the token service {} refused the node's identity token (HTTP 401)",
                    url.host_str().unwrap_or_default()
                ),
            });
        }
        if status != reqwest::StatusCode::OK {
            return Err(FetchError::Http {
                artifact: what.to_owned(),
                url: url.to_string(),
                status: status.as_u16(),
            });
        }
        let mut bytes = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
            let chunk = chunk.map_err(|e| FetchError::Transport {
                artifact: what.to_owned(),
                detail: super::error_chain(&e),
            })?;
            if bytes.len() + chunk.len() > limit {
                return Err(FetchError::SizeMismatch {
                    artifact: what.to_owned(),
                    detail: format!("{url} is larger than the limit of {limit} bytes"),
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }
}

/// `send` ends with a response or an error, never a finished attempt.
fn unreachable_answer(what: &str) -> Result<std::convert::Infallible, FetchError> {
    Err(FetchError::Transport {
        artifact: what.to_owned(),
        detail: "no answer from the token service".into(),
    })
}

/// The layer the plan's sha256 names; a manifest without it is the wrong artifact.
fn layer_for<'m>(
    manifest: &'m Manifest,
    artifact: &Artifact,
) -> Result<&'m Descriptor, FetchError> {
    let wanted = format!("sha256:{}", artifact.sha256);
    if let Some(layer) = manifest.layers.iter().find(|l| l.digest == wanted) {
        return Ok(layer);
    }
    let actual = match manifest.layers.as_slice() {
        [only] => only
            .digest
            .strip_prefix("sha256:")
            .unwrap_or(&only.digest)
            .to_owned(),
        layers => format!("none of the manifest's {} layers", layers.len()),
    };
    Err(FetchError::HashMismatch {
        artifact: artifact.name.clone(),
        expected: artifact.sha256.clone(),
        actual,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_is_chosen_by_the_plans_sha256() {
        let manifest: Manifest = serde_json::from_str(&format!(
            r#"{{"schemaVersion":2,"layers":[{{"digest":"sha256:{}","size":3}},{{"digest":"sha256:{}","size":5}}]}}"#,
            "a".repeat(64),
            "b".repeat(64)
        ))
        .unwrap();
        let mut artifact: Artifact = serde_json::from_value(serde_json::json!({
            "name": "k", "type": "Sysext", "url": "oci://r.example/k@sha256:x", "sha256": "b".repeat(64),
        }))
        .unwrap();
        assert_eq!(layer_for(&manifest, &artifact).unwrap().size, 5);
        artifact.sha256 = "c".repeat(64);
        let e = layer_for(&manifest, &artifact).unwrap_err();
        assert!(
            e.to_string().contains("none of the manifest's 2 layers"),
            "{e}"
        );
    }
}
