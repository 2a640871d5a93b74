//! The registry's side of `release from-oci`: manifests fetched anonymously over the
//! distribution API, each checked against the digest it was asked by, and a `Bearer`
//! challenge answered once with a token from the service it names.

use std::time::Duration;

use inplace_proto::oci::wire::{
    MANIFEST_TYPES, MAX_MANIFEST_BYTES, Manifest, bearer_params, token_of,
};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use sha2::{Digest, Sha256};
use url::Url;

use super::{OciError, OciSettings};
use crate::release::fetch::import_client;

/// A token answer larger than this is not a token.
const MAX_TOKEN_BYTES: usize = 64 << 10;

/// One registry's repository, read anonymously; a `Bearer` challenge is answered once with
/// a token from the service it names.
pub(super) struct Registry {
    client: reqwest::Client,
    timeout: Duration,
    /// The scope asked for when the challenge names none.
    scope: String,
}

impl Registry {
    pub(super) fn new(
        settings: &OciSettings,
        repository: &str,
        base: &str,
    ) -> Result<Registry, OciError> {
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
    pub(super) async fn manifest(
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
