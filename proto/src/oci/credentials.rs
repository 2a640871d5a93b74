//! Credentials for registries, read from the files people and tools already keep: a Docker
//! `config.json` (as containerd, crane and `docker login` write it: `auths` by registry,
//! each with `auth` = base64 `user:password`, or `username`/`password`, an `identitytoken`
//! or a `registrytoken`) and bearer token files. The one reader for the agent (its node's
//! files) and `inplace-controller release from-oci` (the person's login). A [`Secret`]'s
//! `Debug` prints its kind only, and errors name the file and the registry, never the
//! file's text: a secret must not reach a log line, a status or a custom resource.

use std::path::Path;

use base64::Engine;

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

/// The credential for `registry` (`host[:port]`) in the Docker `config.json` at `path`, if
/// it has one. An unreadable file or entry is an error naming the file and the registry.
pub fn registry_secret(path: &Path, registry: &str) -> Result<Option<Secret>, String> {
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
    secret_of(entry).map(Some).ok_or_else(|| {
        format!(
            "the credentials file {} has an entry for {registry} with no usable auth, identitytoken or registrytoken",
            path.display()
        )
    })
}

/// The bearer token in the file at `path` (surrounding whitespace ignored); an empty or
/// unreadable file is an error naming it.
pub fn read_token(path: &Path) -> Result<String, String> {
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
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn config(dir: &Path, text: &str) -> std::path::PathBuf {
        let path = dir.join("config.json");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn docker_config_entries_are_found_by_host_in_every_key_form() {
        let dir = tempfile::tempdir().unwrap();
        let path = config(
            dir.path(),
            r#"{"auths":{"https://r.example:5000/v1/":{"auth":"dTpwQHNzOndvcmQ="},
                "id.example":{"identitytoken":"refresh"},
                "tok.example":{"registrytoken":"tok"},
                "up.example":{"username":"u2","password":"p2"}}}"#,
        );
        let secret = |registry| registry_secret(&path, registry).unwrap();
        assert_eq!(
            secret("r.example:5000"),
            Some(Secret::Basic {
                user: "u".into(),
                password: "p@ss:word".into()
            })
        );
        assert_eq!(
            secret("id.example"),
            Some(Secret::Identity("refresh".into()))
        );
        assert_eq!(secret("tok.example"), Some(Secret::Bearer("tok".into())));
        assert_eq!(
            secret("up.example"),
            Some(Secret::Basic {
                user: "u2".into(),
                password: "p2".into()
            })
        );
        assert_eq!(secret("other.example"), None);
    }

    #[test]
    fn a_broken_file_is_named_without_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = config(dir.path(), r#"{"auths":{"r.example":{"auth":"c2VjcmV0"}}}"#);
        let e = registry_secret(&path, "r.example").unwrap_err();
        assert!(e.contains("r.example") && e.contains("config.json"), "{e}");
        let path = config(dir.path(), r#"{"auths": secret-text"#);
        let e = registry_secret(&path, "r.example").unwrap_err();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(
            format!("{:?}", Secret::Bearer("secret".into())),
            "Secret::Bearer(..)"
        );
    }

    #[test]
    fn a_token_file_is_trimmed_and_an_empty_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "  tok-1\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), "tok-1");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_token(&path).unwrap_err().contains("is empty"));
        let missing = read_token(&dir.path().join("none")).unwrap_err();
        assert!(missing.contains("cannot read the token file"), "{missing}");
    }
}
