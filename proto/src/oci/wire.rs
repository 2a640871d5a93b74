//! What the OCI distribution API sends, read the same way by the agent (fetching an
//! artifact) and by `inplace-controller release from-oci` (writing a release from a
//! manifest): the manifest and index JSON, and the `Bearer` token flow's challenge and
//! answer. Pure: parsing only.

use std::collections::BTreeMap;

/// The manifest types asked for (`Accept`): OCI and Docker image manifests, and their
/// indexes (several platforms' manifests).
pub const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";

/// A manifest larger than this is not one file's (the distribution spec's own limit).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// An image manifest (`layers`) or an index (`manifests`), whichever the registry sent.
#[derive(serde::Deserialize, Debug, Default)]
pub struct Manifest {
    /// The files of an image manifest.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    /// Present in an index (several platforms' manifests), absent in an image manifest.
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// A layer of a manifest, or a manifest of an index.
#[derive(serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// `sha256:<hex>`.
    pub digest: String,
    /// In bytes.
    pub size: u64,
    /// `org.opencontainers.image.title` names a layer's file (as `oras push` sets it).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// An index entry's platform.
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// The platform an index entry is for.
#[derive(serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `amd64`, `arm64`, …
    pub architecture: String,
    /// `linux`, …
    pub os: String,
    /// `v8` for some arm64 images, `v7` for 32-bit arm, …
    #[serde(default)]
    pub variant: Option<String>,
}

/// The annotation that names a layer's file.
pub const TITLE: &str = "org.opencontainers.image.title";

impl Descriptor {
    /// The file name a layer carries, if any.
    pub fn title(&self) -> Option<&str> {
        self.annotations.get(TITLE).map(String::as_str)
    }

    /// The digest's hex, without `sha256:` (the whole digest if it is not sha256).
    pub fn sha256(&self) -> &str {
        self.digest.strip_prefix("sha256:").unwrap_or(&self.digest)
    }
}

/// The parameters of a `Bearer` challenge (`Bearer realm="…",service="…",scope="…"`), keys
/// in lowercase; `None` for another scheme.
pub fn bearer_params(value: &str) -> Option<Vec<(String, String)>> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = Vec::new();
    let mut rest = rest.trim_start();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().to_ascii_lowercase();
        let (value, after) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (&quoted[..end], &quoted[end + 1..])
            }
            None => after.split_once(',').unwrap_or((after, "")),
        };
        params.push((key, value.to_owned()));
        rest = after.trim_start().trim_start_matches(',').trim_start();
    }
    Some(params)
}

/// The token of a token service's JSON answer (`token`, or OAuth2's `access_token`).
pub fn token_of(body: &[u8]) -> Option<String> {
    let answer: serde_json::Value = serde_json::from_slice(body).ok()?;
    ["token", "access_token"]
        .iter()
        .find_map(|k| answer.get(k)?.as_str().filter(|t| !t.is_empty()))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn bearer_challenges_are_read_with_quoted_commas() {
        let params = bearer_params(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(
            params,
            [
                ("realm".into(), "https://auth.example/token".into()),
                ("service".into(), "registry.example".into()),
                ("scope".into(), "repository:a/b:pull,push".into()),
            ]
        );
        assert!(bearer_params(r#"Basic realm="x""#).is_none());
    }

    #[test]
    fn tokens_come_from_either_field() {
        assert_eq!(token_of(br#"{"token":"t1"}"#).as_deref(), Some("t1"));
        assert_eq!(
            token_of(br#"{"access_token":"t2","expires_in":60}"#).as_deref(),
            Some("t2")
        );
        assert_eq!(token_of(br#"{"token":""}"#), None);
        assert_eq!(token_of(b"not json"), None);
    }

    #[test]
    fn layers_carry_their_titles_and_indexes_their_platforms() {
        let index: Manifest = serde_json::from_str(&format!(
            r#"{{"manifests":[{{"digest":"sha256:{}","size":9,"platform":{{"architecture":"arm64","os":"linux"}}}}]}}"#,
            "a".repeat(64)
        ))
        .unwrap();
        let entry = &index.manifests[0];
        assert_eq!(entry.platform.as_ref().unwrap().architecture, "arm64");
        assert_eq!(entry.sha256(), "a".repeat(64));
        let manifest: Manifest = serde_json::from_str(&format!(
            r#"{{"layers":[{{"digest":"sha256:{}","size":3,"annotations":{{"{TITLE}":"k.raw"}}}}]}}"#,
            "b".repeat(64)
        ))
        .unwrap();
        assert_eq!(manifest.layers[0].title(), Some("k.raw"));
    }
}
