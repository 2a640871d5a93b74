//! One registry's repository as `release from-oci` reads it: manifests, with the person's
//! credential for that registry (found by [`Credentials`], read by the same reader as the
//! agent's) and the registry's answers to a 401: a `Bearer` challenge gets a token from the
//! service it names (asked with the user and password, or the refresh token, or
//! anonymously) and the request is sent once more with it; a `Basic` challenge gets the
//! user and password. A 401 that stands names the registry and where the credential came
//! from, never the credential.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use inplace_proto::oci::credentials::{Secret, read_token, registry_secret};
use inplace_proto::oci::wire::{
    MANIFEST_TYPES, MAX_MANIFEST_BYTES, Manifest, bearer_params, token_of,
};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};
use sha2::{Digest, Sha256};
use url::Url;

use super::OciError;
use crate::release::fetch::import_client;

/// A token answer larger than this is not a token.
const MAX_TOKEN_BYTES: usize = 64 << 10;

/// Where the credential for the registry is looked for.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// A bearer token file (`--registry-token-file`), sent as is; it wins over the config.
    pub token_file: Option<PathBuf>,
    /// A Docker `config.json` (`--registry-config`, or the login's default one), looked up
    /// by the registry's `host[:port]`.
    pub docker_config: Option<PathBuf>,
}

impl Credentials {
    /// The credential for `registry` and the file it came from, if any.
    fn for_registry(&self, registry: &str) -> Result<Option<(Secret, PathBuf)>, OciError> {
        let unreadable = |message: String| OciError::Credentials {
            registry: registry.to_owned(),
            message,
        };
        if let Some(path) = &self.token_file {
            let token = read_token(path).map_err(unreadable)?;
            return Ok(Some((Secret::Bearer(token), path.clone())));
        }
        let Some(path) = &self.docker_config else {
            return Ok(None);
        };
        let secret = registry_secret(path, registry).map_err(unreadable)?;
        Ok(secret.map(|secret| (secret, path.clone())))
    }
}

/// One registry's repository, with the person's credential for it.
pub(super) struct Registry {
    client: reqwest::Client,
    timeout: Duration,
    /// `host[:port]`, as errors name it.
    name: String,
    /// The scope asked for when a challenge names none.
    scope: String,
    secret: Option<(Secret, PathBuf)>,
    /// Where a missing credential would have been looked for, for the error.
    looked_in: Option<PathBuf>,
    /// The token service's token, once one was asked for; used for every later request.
    token: Mutex<Option<String>>,
    /// The registry asked for Basic: the user and password go with every request.
    basic: Mutex<bool>,
}

impl Registry {
    pub(super) fn new(
        settings: &super::OciSettings,
        named: &inplace_proto::oci::Named,
        base: &str,
    ) -> Result<Registry, OciError> {
        let client = import_client(settings.timeout).map_err(|source| OciError::Transport {
            url: base.to_owned(),
            source,
        })?;
        let credentials = &settings.credentials;
        Ok(Registry {
            client,
            timeout: settings.timeout,
            name: named.registry.clone(),
            scope: format!("repository:{}:pull", named.repository),
            secret: credentials.for_registry(&named.registry)?,
            looked_in: credentials.docker_config.clone(),
            token: Mutex::new(None),
            basic: Mutex::new(false),
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

    /// The body at `url`, within [`MAX_MANIFEST_BYTES`]; a 401 is answered once.
    async fn get(&self, url: &str, accept: &str) -> Result<Vec<u8>, OciError> {
        let send = || async {
            let request = self.authorised(self.client.get(url).header(ACCEPT, accept));
            request.send().await.map_err(|e| self.failed(url, e))
        };
        let mut response = send().await?;
        if response.status() == StatusCode::UNAUTHORIZED {
            if !self.renew(url, response.headers()).await? {
                return Err(self.refused(url));
            }
            response = send().await?;
            if response.status() == StatusCode::UNAUTHORIZED {
                return Err(self.refused(url));
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

    /// `request` with the token service's token, else a bearer credential, else Basic once
    /// the registry asked for it.
    fn authorised(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if let Some(token) = self.token.lock().ok().and_then(|t| t.clone()) {
            return request.bearer_auth(token);
        }
        let basic = self.basic.lock().is_ok_and(|b| *b);
        match &self.secret {
            Some((Secret::Bearer(token), _)) => request.bearer_auth(token),
            Some((Secret::Basic { user, password }, _)) if basic => {
                request.basic_auth(user, Some(password))
            }
            _ => request,
        }
    }

    /// After a 401: a token from the service a `Bearer` challenge names, or Basic when the
    /// registry asks for it and there is a user and password. False when there is nothing
    /// new to try.
    async fn renew(
        &self,
        url: &str,
        headers: &reqwest::header::HeaderMap,
    ) -> Result<bool, OciError> {
        let challenges: Vec<&str> = headers
            .get_all(WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if matches!(self.secret, Some((Secret::Bearer(_), _))) {
            // The bearer credential went with the request: it is the one refused.
            return Ok(false);
        }
        if let Some(challenge) = challenges.iter().find_map(|c| bearer_params(c)) {
            let token = self.token(url, &challenge).await?;
            if let Ok(mut slot) = self.token.lock() {
                *slot = Some(token);
            }
            return Ok(true);
        }
        let asks_basic = challenges
            .iter()
            .any(|c| c.trim_start().to_ascii_lowercase().starts_with("basic"));
        let has_basic = matches!(self.secret, Some((Secret::Basic { .. }, _)));
        let mut basic = self.basic.lock().map_err(|_| self.refused(url))?;
        let renewed = asks_basic && has_basic && !*basic;
        *basic = true;
        Ok(renewed)
    }

    /// A pull token from the service the challenge names: asked with the user and password
    /// (Basic), the refresh token (an OAuth2 POST), or anonymously.
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
        let mut form = vec![("scope", param("scope").unwrap_or(&self.scope))];
        if let Some(name) = param("service") {
            form.push(("service", name));
        }
        let request = match &self.secret {
            Some((Secret::Identity(refresh), _)) => {
                form.extend([
                    ("grant_type", "refresh_token"),
                    ("refresh_token", refresh.as_str()),
                    ("client_id", "inplace-controller"),
                ]);
                let body = url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(&form)
                    .finish();
                self.client
                    .post(service.clone())
                    .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
                    .body(body)
            }
            secret => {
                service.query_pairs_mut().extend_pairs(&form);
                let request = self.client.get(service.clone());
                match secret {
                    Some((Secret::Basic { user, password }, _)) => {
                        request.basic_auth(user, Some(password))
                    }
                    _ => request,
                }
            }
        };
        let service = service.to_string();
        let response = request.send().await.map_err(|e| self.failed(&service, e))?;
        if response.status() == StatusCode::UNAUTHORIZED {
            return Err(self.refused(&service));
        }
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

    /// Why a 401 from `url` (the registry or its token service) stands: the registry, and
    /// where its credential came from or was looked for.
    fn refused(&self, url: &str) -> OciError {
        let why = match (&self.secret, &self.looked_in) {
            (Some((_, from)), _) => {
                format!(
                    "the credentials for it from {} were refused",
                    from.display()
                )
            }
            (None, Some(looked_in)) => format!(
                "{} has no credentials for it; log in to it (`crane auth login {}`) or name another file with --registry-config",
                looked_in.display(),
                self.name
            ),
            (None, None) => format!(
                "there are no credentials for it: no Docker config.json was found; log in to it (`crane auth login {}`) or name one with --registry-config",
                self.name
            ),
        };
        OciError::Unauthorized {
            registry: self.name.clone(),
            url: url.to_owned(),
            message: why,
        }
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
