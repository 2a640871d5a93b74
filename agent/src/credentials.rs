//! Node-local credentials for registries and download servers. The agent's config names only
//! files: a Docker `config.json` (looked up by registry) and bearer token files per URL
//! prefix, read with the one reader `release from-oci` uses too
//! ([`inplace_proto::oci::credentials`]). They are read when a fetch starts (a rotated
//! secret needs no restart) and never enter a custom resource, a status, a log line or an
//! error.

use std::path::PathBuf;

pub use inplace_proto::oci::credentials::Secret;
use inplace_proto::oci::credentials::{read_token, registry_secret};

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

impl CredentialSettings {
    /// The credential for `registry` (`host[:port]`) in the Docker config, if any. An
    /// unreadable file or entry is an error naming the file and the registry.
    pub fn for_registry(&self, registry: &str) -> Result<Option<Secret>, String> {
        match &self.docker_config {
            Some(path) => registry_secret(path, registry),
            None => Ok(None),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docker_config_is_the_one_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"{"auths":{"tok.example":{"registrytoken":"tok"}}}"#,
        )
        .unwrap();
        let s = CredentialSettings {
            docker_config: Some(path),
            token_files: vec![],
        };
        assert_eq!(
            s.for_registry("tok.example").unwrap(),
            Some(Secret::Bearer("tok".into()))
        );
        assert_eq!(
            CredentialSettings::default()
                .for_registry("tok.example")
                .unwrap(),
            None
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
