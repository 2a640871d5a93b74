//! Node-local credentials for registries and download servers. The agent's config names only
//! files: a Docker `config.json` (as containerd and crane read it: `auths` by registry, each
//! with `auth` = base64 `user:password`, or an `identitytoken` / `registrytoken`) and bearer
//! token files per URL prefix. They are read when a fetch starts (a rotated secret needs no
//! restart) and never enter a custom resource, a status, a log line or an error: a
//! [`Secret`]'s `Debug` prints its kind only, and errors name the file and the registry.

use std::path::{Path, PathBuf};

use base64::Engine;

use crate::url_prefix::UrlPrefix;

/// Where the credentials are (the `[credentials]` section).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialSettings {
    /// A Docker `config.json`; its `auths` are looked up by registry host.
    pub docker_config: Option<PathBuf>,
    /// Bearer tokens for http(s) URLs under a prefix; the longest matching prefix wins.
    pub token_files: Vec<TokenFile>,
}

/// A bearer token file for the URLs under a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFile {
    /// The URLs the token is sent to.
    pub url_prefix: UrlPrefix,
    /// The file holding the token (surrounding whitespace ignored).
    pub path: PathBuf,
}

/// A credential as sent: never printed.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    /// User and password: HTTP Basic to a registry that asks for it, and to its token service.
    Basic {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// A token sent as is (`Authorization: Bearer`): a token file's, or a `registrytoken`.
    Bearer(String),
    /// An OAuth2 refresh token for the registry's token service (`identitytoken`).
    Identity(String),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Secret::Basic { .. } => "Secret::Basic(..)",
            Secret::Bearer(_) => "Secret::Bearer(..)",
            Secret::Identity(_) => "Secret::Identity(..)",
        })
    }
}

#[derive(serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, DockerAuth>,
}

#[derive(serde::Deserialize)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
    registrytoken: Option<String>,
}

impl CredentialSettings {
    /// The credential for `registry` (`host[:port]`) in the Docker config, if any. An
    /// unreadable file or entry is an error naming the file and the registry.
    pub fn for_registry(&self, registry: &str) -> Result<Option<Secret>, String> {
        let Some(path) = &self.docker_config else {
            return Ok(None);
        };
        let text = std::fs::read(path)
            .map_err(|e| format!("cannot read the credentials file {}: {e}", path.display()))?;
        let config: DockerConfig = serde_json::from_slice(&text).map_err(|e| {
            format!(
                "the credentials file {} is not a Docker config.json: {}",
                path.display(),
                // serde's message may quote the file's text; only its place is kept.
                format_args!("line {} column {}", e.line(), e.column())
            )
        })?;
        let Some(entry) = config
            .auths
            .iter()
            .find(|(key, _)| auth_key_host(key) == registry)
            .map(|(_, entry)| entry)
        else {
            return Ok(None);
        };
        secret_of(entry)
            .map(Some)
            .ok_or_else(|| entry_problem(path, registry))
    }

    /// The bearer token for `url` from the token file of the longest prefix admitting it.
    pub fn for_url(&self, url: &str) -> Result<Option<Secret>, String> {
        let Ok(parsed) = url::Url::parse(url) else {
            return Ok(None);
        };
        let Some(file) = self
            .token_files
            .iter()
            .filter(|t| t.url_prefix.admits(&parsed))
            .max_by_key(|t| t.url_prefix.to_string().len())
        else {
            return Ok(None);
        };
        read_token(&file.path).map(|t| Some(Secret::Bearer(t)))
    }
}

fn entry_problem(path: &Path, registry: &str) -> String {
    format!(
        "the credentials file {} has an entry for {registry} with no usable auth, identitytoken or registrytoken",
        path.display()
    )
}

fn read_token(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("the token file {} is empty", path.display()));
    }
    Ok(token.to_owned())
}

/// The host a Docker config key names: keys are written `host`, `https://host` or
/// `https://host/v1/` by different tools.
fn auth_key_host(key: &str) -> &str {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    rest.split('/').next().unwrap_or(rest)
}

fn secret_of(entry: &DockerAuth) -> Option<Secret> {
    if let Some(token) = entry.registrytoken.as_ref().filter(|t| !t.is_empty()) {
        return Some(Secret::Bearer(token.clone()));
    }
    if let Some(token) = entry.identitytoken.as_ref().filter(|t| !t.is_empty()) {
        return Some(Secret::Identity(token.clone()));
    }
    if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        return Some(Secret::Basic {
            user: user.clone(),
            password: password.clone(),
        });
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(entry.auth.as_ref()?.trim())
        .ok()?;
    let (user, password) = std::str::from_utf8(&decoded).ok()?.split_once(':')?;
    Some(Secret::Basic {
        user: user.to_owned(),
        password: password.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, config: &str) -> CredentialSettings {
        let path = dir.join("config.json");
        std::fs::write(&path, config).unwrap();
        CredentialSettings {
            docker_config: Some(path),
            token_files: vec![],
        }
    }

    #[test]
    fn docker_config_entries_are_found_by_host_in_every_key_form() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(
            dir.path(),
            r#"{"auths":{"https://r.example:5000/v1/":{"auth":"dTpwQHNzOndvcmQ="},
                "id.example":{"identitytoken":"refresh"},
                "tok.example":{"registrytoken":"tok"}}}"#,
        );
        assert_eq!(
            s.for_registry("r.example:5000").unwrap(),
            Some(Secret::Basic {
                user: "u".into(),
                password: "p@ss:word".into()
            })
        );
        assert_eq!(
            s.for_registry("id.example").unwrap(),
            Some(Secret::Identity("refresh".into()))
        );
        assert_eq!(
            s.for_registry("tok.example").unwrap(),
            Some(Secret::Bearer("tok".into()))
        );
        assert_eq!(s.for_registry("other.example").unwrap(), None);
    }

    #[test]
    fn a_broken_file_is_named_without_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let s = settings(dir.path(), r#"{"auths":{"r.example":{"auth":"c2VjcmV0"}}}"#);
        let e = s.for_registry("r.example").unwrap_err();
        assert!(e.contains("r.example") && e.contains("config.json"), "{e}");
        let s = settings(dir.path(), r#"{"auths": secret-text"#);
        let e = s.for_registry("r.example").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(
            format!("{:?}", Secret::Bearer("secret".into())),
            "Secret::Bearer(..)"
        );
    }

    #[test]
    fn the_longest_token_prefix_wins() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "token-a\n").unwrap();
        std::fs::write(&b, "token-b").unwrap();
        let s = CredentialSettings {
            docker_config: None,
            token_files: vec![
                TokenFile {
                    url_prefix: "https://f.example/".parse().unwrap(),
                    path: a,
                },
                TokenFile {
                    url_prefix: "https://f.example/private/".parse().unwrap(),
                    path: b,
                },
            ],
        };
        let token = |url| s.for_url(url).unwrap();
        assert_eq!(
            token("https://f.example/private/x"),
            Some(Secret::Bearer("token-b".into()))
        );
        assert_eq!(
            token("https://f.example/x"),
            Some(Secret::Bearer("token-a".into()))
        );
        assert_eq!(token("https://g.example/x"), None);
    }
}
