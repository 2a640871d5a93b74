//! `release from-oci`: an extension image kept in an OCI registry, resolved to what a
//! release pins. The name may carry a tag; the manifest it names now is fetched, checked
//! against its digest, and the layer that is the file chosen, so the release names
//! `oci://REGISTRY/REPOSITORY[:TAG]@sha256:<manifest digest>` with the layer's sha256 and
//! size: the bytes every node will install, whatever the tag points at later. An index
//! (several platforms) gives one such build per linux architecture, each pinned to its
//! own manifest, so that every node of a mixed fleet takes its own (the agent never reads
//! an index). The registry is read with the person's credential for it, if any
//! (`registry`: a Docker `config.json` or a bearer token file), and its token flow.

use std::time::Duration;

use inplace_proto::Architecture;
use inplace_proto::oci::Named;
use inplace_proto::oci::wire::{Descriptor, Manifest, Platform};

pub use self::registry::Credentials;
use self::registry::Registry;
use super::fetch::chain;

/// How the registry is reached.
#[derive(Debug, Clone)]
pub struct OciSettings {
    /// For each exchange: connect, redirects, headers and body.
    pub timeout: Duration,
    /// Speak http to the registry (one inside the cluster's own network), not https. A
    /// registry on `localhost` or `127.0.0.0/8` is always reached over http.
    pub plain_http: bool,
    /// Where the credential for the registry is.
    pub credentials: Credentials,
}

/// The image as the release will name it: one build, or one per platform of an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The artifact's own build: the image manifest's, or the index's first platform's.
    pub build: Build,
    /// For an index, the architecture of `build`.
    pub architecture: Option<Architecture>,
    /// The builds of the index's other platforms, in its order.
    pub others: Vec<(Architecture, Build)>,
    /// The index entries passed over, each with why (for a note on stderr).
    pub skipped: Vec<String>,
}

/// One image manifest, pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
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
    /// The registry (or its token service) answered 401 and nothing more can be tried:
    /// no credential for it, or one it refused. Names the registry and the file, never
    /// the credential.
    #[error("registry {registry}: GET {url} answered 401 Unauthorized: {message}")]
    Unauthorized {
        /// `host[:port]`.
        registry: String,
        /// The URL asked for.
        url: String,
        /// Why, and where the credential came from or was looked for.
        message: String,
    },
    /// The credential for the registry could not be read (its file is missing, broken or
    /// has no usable entry for it).
    #[error("the credentials for registry {registry}: {message}")]
    Credentials {
        /// `host[:port]`.
        registry: String,
        /// What is wrong with the file.
        message: String,
    },
    /// An index without a linux manifest of the wanted architecture (`--arch`), or of any
    /// architecture a release can name.
    #[error("{reference} is an index without a linux manifest of {}; it has {}", .wanted, .platforms.join(", "))]
    NoPlatform {
        /// The reference as given.
        reference: String,
        /// What was looked for, in words.
        wanted: String,
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
            OciError::Unauthorized { .. } => "unauthorized",
            OciError::Credentials { .. } => "credentials",
            OciError::NoPlatform { .. } => "no_platform",
            OciError::NoLayer { .. } => "no_layer",
        }
    }
}

/// The architecture `--arch` names: the API's (and OCI's) names, or sysext-bakery's and
/// the kernel's spellings of them (`x86-64`, `x86_64`, `aarch64`).
pub fn architecture_named(name: &str) -> Option<Architecture> {
    match name {
        "x86-64" | "x86_64" => Some(Architecture::Amd64),
        "aarch64" => Some(Architecture::Arm64),
        other => Architecture::parse(other),
    }
}

/// Resolves `named` to its image manifest, or through an index to the linux manifest of
/// each architecture (only `only`'s when given), and in each the layer titled `file` (or
/// its only layer).
pub async fn resolve(
    named: &Named,
    only: Option<Architecture>,
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
    let registry = Registry::new(settings, named, &base)?;
    let first = format!("{base}{}", named.manifest_reference());
    let (manifest, digest) = registry.manifest(&first, named.digest.as_deref()).await?;
    if manifest.manifests.is_empty() {
        return Ok(Resolved {
            build: build(named, &first, &manifest, &digest, file)?,
            architecture: None,
            others: Vec::new(),
            skipped: Vec::new(),
        });
    }
    let platforms = linux_platforms(&manifest, only);
    let mut builds = Vec::with_capacity(platforms.usable.len());
    for (architecture, entry) in platforms.usable {
        let url = format!("{base}{}", entry.digest);
        let (manifest, digest) = registry.manifest(&url, Some(entry.sha256())).await?;
        if !manifest.manifests.is_empty() {
            return Err(OciError::BadAnswer {
                url,
                message: "the platform's entry is an index again, not an image manifest".into(),
            });
        }
        builds.push((architecture, build(named, &url, &manifest, &digest, file)?));
    }
    let mut builds = builds.into_iter();
    let Some((architecture, build)) = builds.next() else {
        return Err(OciError::NoPlatform {
            reference: named.to_string(),
            wanted: only.map_or_else(
                || {
                    format!(
                        "any architecture a release names ({})",
                        architecture_names()
                    )
                },
                |a| a.to_string(),
            ),
            platforms: platform_names(&manifest),
        });
    };
    Ok(Resolved {
        build,
        architecture: Some(architecture),
        others: builds.collect(),
        skipped: platforms.skipped,
    })
}

/// The build an image manifest (fetched from `url`, hashing to `digest`) gives.
fn build(
    named: &Named,
    url: &str,
    manifest: &Manifest,
    digest: &str,
    file: Option<&str>,
) -> Result<Build, OciError> {
    let layer = layer(manifest, file).map_err(|message| OciError::NoLayer {
        url: url.to_owned(),
        message,
    })?;
    Ok(Build {
        url: named.pinned(digest),
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

/// What an index offers nodes: its linux manifests by architecture, in the index's order.
#[derive(Debug, PartialEq, Eq)]
pub struct Platforms<'m> {
    /// One entry per architecture a release can name (the first of each).
    pub usable: Vec<(Architecture, &'m Descriptor)>,
    /// The other entries, each with why it is passed over; entries of other architectures
    /// than `only`'s are not listed (they were not asked for).
    pub skipped: Vec<String>,
}

/// The index's linux entries of the architectures a release names (only `only`'s when
/// given). A node installs the build of its own `kubernetes.io/arch`, so another OS, an
/// architecture Kubernetes nodes do not run (`arm`, `386`), a second entry of the same
/// architecture (another variant) and an entry without a platform (an attestation) cannot
/// be offered.
pub fn linux_platforms(index: &Manifest, only: Option<Architecture>) -> Platforms<'_> {
    let mut platforms = Platforms {
        usable: Vec::new(),
        skipped: Vec::new(),
    };
    for entry in &index.manifests {
        let Some(platform) = &entry.platform else {
            platforms
                .skipped
                .push(format!("{}: an entry without a platform", entry.digest));
            continue;
        };
        let architecture = Architecture::parse(&platform.architecture);
        if only.is_some() && architecture != only {
            continue;
        }
        let why = match architecture {
            _ if platform.os != "linux" => "not linux".to_owned(),
            None => format!(
                "not an architecture a release names ({})",
                architecture_names()
            ),
            Some(a) if platforms.usable.iter().any(|(taken, _)| *taken == a) => {
                format!("a second {a} entry; the first is taken")
            }
            Some(a) => {
                platforms.usable.push((a, entry));
                continue;
            }
        };
        platforms.skipped.push(format!(
            "{} ({}): {why}",
            platform_name(platform),
            entry.digest
        ));
    }
    platforms
}

/// `os/architecture[/variant]`.
fn platform_name(platform: &Platform) -> String {
    match &platform.variant {
        Some(variant) => format!("{}/{}/{variant}", platform.os, platform.architecture),
        None => format!("{}/{}", platform.os, platform.architecture),
    }
}

/// Every platform an index has, for an error.
fn platform_names(index: &Manifest) -> Vec<String> {
    index
        .manifests
        .iter()
        .map(|m| match &m.platform {
            Some(p) => platform_name(p),
            None => "an entry without a platform".to_owned(),
        })
        .collect()
}

fn architecture_names() -> String {
    Architecture::ALL
        .iter()
        .map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(", ")
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

mod registry;
#[cfg(test)]
mod tests;
