//! Artifacts kept in an OCI registry: `oci://REGISTRY/REPOSITORY@sha256:DIGEST`, where the
//! digest is the image manifest's. A tag may stand before the digest (`…:v1@sha256:…`) as a
//! note for people, but never alone: a tag can be moved to other bytes, a digest cannot,
//! and every node of a rollout must fetch the same thing. The manifest names the artifact's
//! file as one of its layers (the way `oras push` and sysext publishers store a file); the
//! plan's `sha256` chooses that layer.

pub mod credentials;
pub mod wire;

/// The URL scheme of registry artifacts.
pub const SCHEME: &str = "oci://";

/// A parsed `oci://` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`, as the distribution API is reached.
    pub registry: String,
    /// The repository path, for example `sysext/kubernetes`.
    pub repository: String,
    /// The manifest digest: 64 lowercase hex digits of its sha256 (without `sha256:`).
    pub digest: String,
}

/// Whether `url` names a registry artifact (so [`Reference::parse`] applies).
pub fn is_oci(url: &str) -> bool {
    url.starts_with(SCHEME)
}

impl Reference {
    /// Parses `oci://REGISTRY/REPOSITORY[:TAG]@sha256:DIGEST`; the error says which part is
    /// wrong, and that a tag alone is not enough.
    pub fn parse(url: &str) -> Result<Reference, String> {
        if !url.starts_with(SCHEME) {
            return Err(format!("{url:?} does not start with {SCHEME}"));
        }
        let named = Named::parts(url)?;
        let Some(digest) = named.digest else {
            return Err(match named.tag {
                Some(tag) => format!(
                    "the tag {tag:?} alone does not pin the bytes (a tag can be moved); pin the manifest with @sha256:<digest>"
                ),
                None => "no digest: pin the manifest with @sha256:<digest>".to_owned(),
            });
        };
        Ok(Reference {
            registry: named.registry,
            repository: named.repository,
            digest,
        })
    }

    /// The reference as written without a tag: `REGISTRY/REPOSITORY@sha256:DIGEST`.
    pub fn display_name(&self) -> String {
        format!(
            "{}/{}@sha256:{}",
            self.registry, self.repository, self.digest
        )
    }
}

/// An image as a person names it to import it (`release from-oci`):
/// `[oci://]REGISTRY/REPOSITORY` with a tag, a digest or both. Unlike a [`Reference`], a tag
/// alone is fine here: it is resolved once, and the release pins the digest it named then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// `host[:port]`.
    pub registry: String,
    /// The repository path.
    pub repository: String,
    /// The tag, if one is written.
    pub tag: Option<String>,
    /// The manifest digest's 64 hex digits, if one is written.
    pub digest: Option<String>,
}

impl Named {
    /// Parses `[oci://]REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]` with a tag or a digest or
    /// both; the error says which part is wrong.
    pub fn parse(text: &str) -> Result<Named, String> {
        let named = Named::parts(text)?;
        if named.tag.is_none() && named.digest.is_none() {
            return Err(format!(
                "{text:?} names neither a tag (:v1.31.2) nor a digest (@sha256:…)"
            ));
        }
        Ok(named)
    }

    /// The parts of a name, each checked; tag and digest may both be missing.
    fn parts(text: &str) -> Result<Named, String> {
        let rest = text.strip_prefix(SCHEME).unwrap_or(text);
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| format!("{text:?} has no repository after the registry"))?;
        check_registry(registry)?;
        let (name, digest) = match path.split_once('@') {
            Some((name, digest)) => (name, Some(sha256_hex(digest)?)),
            None => (path, None),
        };
        let (repository, tag) = match tag_of(name) {
            Some(tag) => {
                check_tag(tag)?;
                (&name[..name.len() - tag.len() - 1], Some(tag.to_owned()))
            }
            None => (name, None),
        };
        check_repository(repository)?;
        Ok(Named {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            tag,
            digest,
        })
    }

    /// What the manifest is asked for by: the digest when written, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => format!("sha256:{digest}"),
            (None, Some(tag)) => tag.clone(),
            (None, None) => String::new(),
        }
    }

    /// The artifact URL pinned to the manifest `digest` (hex), the tag kept as a note.
    pub fn pinned(&self, digest: &str) -> String {
        let tag = self
            .tag
            .as_ref()
            .map(|t| format!(":{t}"))
            .unwrap_or_default();
        format!(
            "{SCHEME}{}/{}{tag}@sha256:{digest}",
            self.registry, self.repository
        )
    }
}

impl std::fmt::Display for Named {
    /// `REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`, as a person writes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@sha256:{digest}")?;
        }
        Ok(())
    }
}

/// The hex of a `sha256:<64 lowercase hex digits>` digest.
fn sha256_hex(digest: &str) -> Result<String, String> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("the digest {digest:?} is not a sha256 digest (sha256:…)"))?;
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(format!(
            "the digest {digest:?} is not sha256: and 64 lowercase hex digits"
        ));
    }
    Ok(hex.to_owned())
}

/// The tag of `name` (after a `:` in its last path component), if any.
fn tag_of(name: &str) -> Option<&str> {
    let last = name.rsplit('/').next()?;
    last.split_once(':').map(|(_, tag)| tag)
}

fn check_tag(tag: &str) -> Result<(), String> {
    let valid = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && !tag.starts_with(['.', '-']);
    if valid {
        Ok(())
    } else {
        Err(format!("{tag:?} is not a valid tag"))
    }
}

/// `host[:port]`: a DNS name or IPv4 address (lowercase letters, digits, `.`, `-`), and a
/// port when given.
pub fn check_registry(registry: &str) -> Result<(), String> {
    let (host, port) = match registry.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (registry, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    if host_ok && port_ok {
        Ok(())
    } else {
        Err(format!(
            "{registry:?} is not a registry host (lowercase host name or IPv4 address, optional :port)"
        ))
    }
}

/// Path components of lowercase letters and digits, joined by `.`, `_`, `__` or dashes, as
/// the distribution specification allows.
fn check_repository(repository: &str) -> Result<(), String> {
    let component_ok = |c: &str| {
        let bytes = c.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let separators_ok = c
            .split(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
            .filter(|run| !run.is_empty())
            .all(|run| matches!(run, "." | "_" | "__") || run.bytes().all(|b| b == b'-'));
        bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes.iter().all(|b| alnum(b) || b"._-".contains(b))
            && separators_ok
    };
    if !repository.is_empty() && repository.len() <= 255 && repository.split('/').all(component_ok)
    {
        Ok(())
    } else {
        Err(format!(
            "{repository:?} is not a repository name (lowercase components separated by /)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_pinned_reference_parses_into_its_parts() {
        let r = Reference::parse(&format!(
            "oci://127.0.0.1:5000/sysext/kube_let-x@sha256:{D}"
        ))
        .unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "sysext/kube_let-x");
        assert_eq!(r.digest, D);
        assert_eq!(
            r.display_name(),
            format!("127.0.0.1:5000/sysext/kube_let-x@sha256:{D}")
        );
    }

    #[test]
    fn a_tag_before_the_digest_is_a_note_only() {
        let r = Reference::parse(&format!("oci://registry.example/a/b:v1.2@sha256:{D}")).unwrap();
        assert_eq!(r.repository, "a/b");
        assert_eq!(r.digest, D);
    }

    #[test]
    fn an_image_to_import_may_name_a_tag_and_is_pinned_to_a_digest() {
        let named = Named::parse("registry.example/sysext/kubernetes:v1.31.2").unwrap();
        assert_eq!(named.tag.as_deref(), Some("v1.31.2"));
        assert_eq!(named.manifest_reference(), "v1.31.2");
        assert_eq!(
            named.pinned(D),
            format!("oci://registry.example/sysext/kubernetes:v1.31.2@sha256:{D}")
        );
        assert_eq!(
            named.to_string(),
            "registry.example/sysext/kubernetes:v1.31.2"
        );
        let named = Named::parse(&format!("oci://r.example:5000/a@sha256:{D}")).unwrap();
        assert_eq!(named.manifest_reference(), format!("sha256:{D}"));
        assert_eq!(named.to_string(), format!("r.example:5000/a@sha256:{D}"));
        assert_eq!(
            named.pinned(D),
            format!("oci://r.example:5000/a@sha256:{D}")
        );
        let e = Named::parse("r.example/a").unwrap_err();
        assert!(e.contains("neither a tag"), "{e}");
        let e = Named::parse("r.example/A:v1").unwrap_err();
        assert!(e.contains("repository name"), "{e}");
    }

    #[test]
    fn a_tag_alone_is_refused_saying_why() {
        let e = Reference::parse("oci://registry.example/a/b:v1.2").unwrap_err();
        assert!(e.contains("\"v1.2\" alone does not pin"), "{e}");
        assert!(e.contains("@sha256:"), "{e}");
        let e = Reference::parse("oci://registry.example/a/b").unwrap_err();
        assert!(e.starts_with("no digest"), "{e}");
    }

    #[test]
    fn malformed_parts_are_named() {
        for (url, part) in [
            (
                format!("oci://Registry.example/a@sha256:{D}"),
                "registry host",
            ),
            (format!("oci://r.example:0/a@sha256:{D}"), "registry host"),
            (
                format!("oci://user@r.example/a@sha256:{D}"),
                "registry host",
            ),
            (format!("oci://r.example/A@sha256:{D}"), "repository name"),
            (
                format!("oci://r.example/a//b@sha256:{D}"),
                "repository name",
            ),
            (
                format!("oci://r.example/a..b@sha256:{D}"),
                "repository name",
            ),
            (format!("oci://r.example/-a@sha256:{D}"), "repository name"),
            (
                format!("oci://r.example/a@sha512:{D}"),
                "not a sha256 digest",
            ),
            (
                "oci://r.example/a@sha256:abc".to_owned(),
                "64 lowercase hex",
            ),
            (
                format!("oci://r.example/a@sha256:{}", D.to_uppercase()),
                "64 lowercase hex",
            ),
            (
                format!("oci://r.example/a:-x@sha256:{D}"),
                "not a valid tag",
            ),
            (format!("oci://r.example@sha256:{D}"), "no repository"),
        ] {
            let e = Reference::parse(&url).unwrap_err();
            assert!(e.contains(part), "{url}: {e}");
        }
    }
}
