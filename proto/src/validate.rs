//! Everything the CRD schema cannot express, checked the same way by the controller (for a
//! release) and by the agent (for a plan, before any I/O).
//!
//! Every check reports *all* problems, each with the field path it concerns. Checks about
//! where on a node something may land or come from (absolute paths, URL schemes, unit
//! names) report `PolicyDenied`: no node policy could allow them. The node's own policy
//! adds its rules on top, in the agent.

use std::collections::HashSet;
use std::fmt;

use url::Url;

use crate::content::{Artifact, ArtifactType, UpdateContent};
use crate::reason::Reason;

mod agent_image;
mod architecture;
mod objects;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field, as a path from the object root (`spec.artifacts[1].sha256`).
    pub path: String,
    /// `InvalidPlan` or `PolicyDenied` (for plans; releases map both to `InvalidRelease`).
    pub reason: Reason,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// All problems found in one object. Never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Problems(pub Vec<FieldError>);

impl Problems {
    /// The reason for a condition that reports these problems: `InvalidPlan` wins over
    /// `PolicyDenied`, because a malformed plan should be fixed before anything else.
    pub fn reason(&self) -> Reason {
        if self.0.iter().any(|p| p.reason == Reason::InvalidPlan) {
            Reason::InvalidPlan
        } else {
            self.0.first().map_or(Reason::InvalidPlan, |p| p.reason)
        }
    }

    /// Whether some problem concerns this exact field path.
    pub fn has(&self, path: &str) -> bool {
        self.0.iter().any(|p| p.path == path)
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Collects problems while walking an object.
#[derive(Default)]
pub(crate) struct Collector(Vec<FieldError>);

impl Collector {
    pub(crate) fn invalid(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(path, Reason::InvalidPlan, message);
    }

    pub(crate) fn denied(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(path, Reason::PolicyDenied, message);
    }

    fn push(&mut self, path: impl Into<String>, reason: Reason, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            reason,
            message: message.into(),
        });
    }

    pub(crate) fn finish(self) -> Result<(), Problems> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Problems(self.0))
        }
    }
}

/// Longest URL accepted anywhere.
const MAX_URL_LEN: usize = 2048;
/// Longest path accepted anywhere (Linux `PATH_MAX`).
const MAX_PATH_LEN: usize = 4096;
/// Longest unit name systemd accepts.
const MAX_UNIT_LEN: usize = 255;

/// Checks an artifact list, activation and health checks. `at` is the path of the object
/// that holds them (`spec`).
pub(crate) fn check_content(content: &UpdateContent, at: &str, out: &mut Collector) {
    if let Some(version) = &content.kubernetes_version
        && !is_kubernetes_version(version)
    {
        out.invalid(
            format!("{at}.kubernetesVersion"),
            format!("{version:?} is not a Kubernetes version like v1.31.2"),
        );
    }

    match &content.agent {
        Some(agent) => agent_image::check_agent_update(content, agent, at, out),
        None if content.artifacts.is_empty() => out.invalid(
            format!("{at}.artifacts"),
            "at least one artifact is required",
        ),
        None => {}
    }
    if content.artifacts.len() > 32 {
        out.invalid(
            format!("{at}.artifacts"),
            "at most 32 artifacts are allowed",
        );
    }
    let mut names = HashSet::new();
    let mut targets = HashSet::new();
    for (i, artifact) in content.artifacts.iter().enumerate() {
        let path = format!("{at}.artifacts[{i}]");
        if !names.insert(artifact.name.as_str()) {
            out.invalid(
                format!("{path}.name"),
                format!("duplicate artifact name {:?}", artifact.name),
            );
        }
        check_artifact(artifact, &path, &mut targets, out);
    }

    for (i, unit) in content.activation.restart_units.iter().enumerate() {
        check_unit(unit, &format!("{at}.activation.restartUnits[{i}]"), out);
    }

    let checks = &content.health_checks;
    for (i, unit) in checks.units.iter().enumerate() {
        check_unit(unit, &format!("{at}.healthChecks.units[{i}]"), out);
    }
    for (i, check) in checks.http.iter().enumerate() {
        let path = format!("{at}.healthChecks.http[{i}].url");
        match parse_url(&check.url) {
            Ok(url) if url.host_str().is_none() => out.invalid(path, "the URL has no host"),
            Ok(url) => check_url_scheme_and_credentials(&url, &path, out),
            Err(message) => out.invalid(path, message),
        }
    }
    if checks.timeout.get().is_zero() {
        out.invalid(format!("{at}.healthChecks.timeout"), "must be positive");
    }
    if checks.window.get() > checks.timeout.get() {
        out.invalid(
            format!("{at}.healthChecks.window"),
            format!(
                "window {} is longer than timeout {}: the checks could never pass in time",
                checks.window, checks.timeout
            ),
        );
    }
    if checks.node_kubelet_version && content.kubernetes_version.is_none() {
        out.invalid(
            format!("{at}.healthChecks.nodeKubeletVersion"),
            "needs kubernetesVersion to know which version to expect",
        );
    }
}

fn check_artifact(
    artifact: &Artifact,
    path: &str,
    targets: &mut HashSet<String>,
    out: &mut Collector,
) {
    if let Err(message) = check_artifact_name(&artifact.name) {
        out.invalid(format!("{path}.name"), message);
    }
    check_source(artifact, path, out);
    architecture::check_builds(artifact, path, out);

    let mut target = |field: String, value: &str, out: &mut Collector| {
        if let Err(message) = check_node_path(value) {
            out.denied(field, message);
        } else if !targets.insert(value.to_owned()) {
            out.invalid(
                field,
                format!("{value} is the target of another artifact too"),
            );
        }
    };
    match artifact.kind {
        ArtifactType::Binary | ArtifactType::Config => match &artifact.path {
            Some(p) => target(format!("{path}.path"), p, out),
            None => out.invalid(
                format!("{path}.path"),
                format!("a {} artifact needs path", artifact.kind.as_str()),
            ),
        },
        ArtifactType::Archive => {
            if artifact.members.is_empty() {
                out.invalid(
                    format!("{path}.members"),
                    "an Archive artifact needs members",
                );
            }
            let mut froms = HashSet::new();
            for (j, member) in artifact.members.iter().enumerate() {
                let member_path = format!("{path}.members[{j}]");
                if let Err(message) = check_member_name(&member.from) {
                    out.invalid(format!("{member_path}.from"), message);
                } else if !froms.insert(member.from.as_str()) {
                    out.invalid(
                        format!("{member_path}.from"),
                        format!("member {} is named twice", member.from),
                    );
                }
                target(format!("{member_path}.to"), &member.to, out);
            }
        }
        ArtifactType::Sysext => {}
    }
    if !matches!(artifact.kind, ArtifactType::Binary | ArtifactType::Config)
        && artifact.path.is_some()
    {
        out.invalid(
            format!("{path}.path"),
            "path is only for Binary and Config artifacts",
        );
    }
    if artifact.kind != ArtifactType::Archive && artifact.max_extracted_size.is_some() {
        out.invalid(
            format!("{path}.maxExtractedSize"),
            "maxExtractedSize is only for Archive artifacts",
        );
    }
    if artifact.max_extracted_size == Some(0) {
        out.invalid(
            format!("{path}.maxExtractedSize"),
            "must be positive when given",
        );
    }
    if artifact.kind != ArtifactType::Archive && !artifact.members.is_empty() {
        out.invalid(
            format!("{path}.members"),
            "members are only for Archive artifacts",
        );
    }
}

/// Where an artifact's file comes from and what it must be: `url`, `sha256`, `size`,
/// `signatureUrl` (also each of its builds for other architectures, at their own `path`).
fn check_source(artifact: &Artifact, path: &str, out: &mut Collector) {
    if let Err(message) = check_sha256(&artifact.sha256) {
        out.invalid(format!("{path}.sha256"), message);
    }
    if artifact.size == Some(0) {
        out.invalid(format!("{path}.size"), "must be positive when given");
    }
    if crate::oci::is_oci(&artifact.url) {
        check_registry_artifact(artifact, path, out);
    } else {
        check_url_artifact(artifact, path, out);
    }
    check_signature_url(artifact.signature_url.as_deref(), path, out);
}

/// An artifact name must be usable as a plain file name and as a sysext name.
pub fn check_artifact_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 63 {
        return Err(format!("{} characters is longer than 63", name.len()));
    }
    if name == "." || name == ".." || name.contains('/') {
        return Err(format!("{name:?} is not a plain file name"));
    }
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if !name.chars().all(valid_char) || !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "{name:?} may hold only letters, digits, '.', '_' and '-', starting with a letter or digit"
        ));
    }
    Ok(())
}

/// A sha256 must be 64 lowercase hex digits.
pub fn check_sha256(digest: &str) -> Result<(), String> {
    if digest.is_empty() {
        return Err("is required".into());
    }
    if digest.len() != 64 {
        return Err(format!(
            "has {} characters; a sha256 has 64 hex digits",
            digest.len()
        ));
    }
    if digest.chars().any(|c| c.is_ascii_uppercase()) {
        return Err("must be lowercase hex".into());
    }
    if !digest.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err("must be hex digits only".into());
    }
    Ok(())
}

/// An artifact fetched by URL: http(s), no credentials, a file name where one is needed.
fn check_url_artifact(artifact: &Artifact, path: &str, out: &mut Collector) {
    match parse_url(&artifact.url) {
        Ok(url) => {
            check_url_scheme_and_credentials(&url, &format!("{path}.url"), out);
            if artifact.kind == ArtifactType::Sysext && url_file_name(&url).is_none() {
                out.invalid(
                    format!("{path}.url"),
                    "the URL must end in a file name: the image is stored under it",
                );
            } else if artifact.signature_url.is_some() && url_basename(&url).is_none() {
                out.invalid(
                    format!("{path}.url"),
                    "a signed artifact's URL must end in a file name: the signature's trusted comment names it",
                );
            }
        }
        Err(message) => out.invalid(format!("{path}.url"), message),
    }
}

/// An artifact in a registry: a digest-pinned reference; not signed with minisign (the
/// signature's trusted comment names a file, and the manifest digest already pins the bytes).
fn check_registry_artifact(artifact: &Artifact, path: &str, out: &mut Collector) {
    if artifact.url.len() > MAX_URL_LEN {
        out.invalid(
            format!("{path}.url"),
            format!(
                "{} characters is longer than {MAX_URL_LEN}",
                artifact.url.len()
            ),
        );
    } else if let Err(message) = crate::oci::Reference::parse(&artifact.url) {
        out.invalid(format!("{path}.url"), message);
    }
    if artifact.signature_url.is_some() {
        out.invalid(
            format!("{path}.signatureUrl"),
            "an oci:// artifact is pinned by its manifest digest; minisign signatures are for http(s) artifacts",
        );
    }
}

pub(crate) fn parse_url(text: &str) -> Result<Url, String> {
    if text.len() > MAX_URL_LEN {
        return Err(format!(
            "{} characters is longer than {MAX_URL_LEN}",
            text.len()
        ));
    }
    Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))
}

/// A `signatureUrl` (of the object at `path`), when given: a URL, http(s), no credentials.
pub(crate) fn check_signature_url(signature_url: Option<&str>, path: &str, out: &mut Collector) {
    if let Some(signature_url) = signature_url {
        let at = format!("{path}.signatureUrl");
        match parse_url(signature_url) {
            Ok(url) => check_url_scheme_and_credentials(&url, &at, out),
            Err(message) => out.invalid(at, message),
        }
    }
}

pub(crate) fn check_url_scheme_and_credentials(url: &Url, path: &str, out: &mut Collector) {
    if !matches!(url.scheme(), "https" | "http") {
        out.denied(
            path,
            format!("scheme {}:// is not allowed; use https", url.scheme()),
        );
    }
    if !url.username().is_empty() || url.password().is_some() {
        out.denied(path, "credentials in URLs are not allowed");
    }
}

/// The last path segment of a URL, when it is a usable file name.
pub fn url_file_name(url: &Url) -> Option<&str> {
    let name = url.path_segments()?.next_back()?;
    (check_artifact_name(name).is_ok()).then_some(name)
}

/// The last path segment of a URL as written (percent-encoded), when there is one: the
/// `file:` a signature's trusted comment must name.
pub fn url_basename(url: &Url) -> Option<&str> {
    url.path_segments()?
        .next_back()
        .filter(|name| !name.is_empty())
}

/// A target path on the node: absolute, normalized, no `..`, not the root.
pub fn check_node_path(path: &str) -> Result<(), String> {
    if path.len() > MAX_PATH_LEN {
        return Err(format!(
            "{} characters is longer than {MAX_PATH_LEN}",
            path.len()
        ));
    }
    if !path.starts_with('/') {
        return Err(format!("{path:?} is not an absolute path"));
    }
    if path.ends_with('/') {
        return Err(format!("{path:?} names a directory, not a file"));
    }
    if path.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    if path
        .split('/')
        .skip(1)
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!(
            "{path:?} is not a normalized path (empty, . or .. components)"
        ));
    }
    Ok(())
}

/// An archive member name: relative, normalized, no `..`.
fn check_member_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_PATH_LEN {
        return Err(format!(
            "{} characters is longer than {MAX_PATH_LEN}",
            name.len()
        ));
    }
    if name.starts_with('/') {
        return Err(format!("{name:?} must be relative to the archive root"));
    }
    let name = name.strip_prefix("./").unwrap_or(name);
    if name
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!("{name:?} is not a normalized member path"));
    }
    Ok(())
}

/// A unit the agent may restart or watch: a plain `.service` name.
fn check_unit(unit: &str, path: &str, out: &mut Collector) {
    if let Err(message) = check_unit_name(unit) {
        out.denied(path, message);
    }
}

/// A unit name the agent may act on: `<name>.service`, systemd's unit-name characters, no `/`.
pub fn check_unit_name(unit: &str) -> Result<(), String> {
    if unit.len() > MAX_UNIT_LEN {
        return Err(format!(
            "{} characters is longer than {MAX_UNIT_LEN}",
            unit.len()
        ));
    }
    if unit.contains('/') {
        return Err(format!("{unit:?} is a path, not a unit name"));
    }
    let Some(stem) = unit.strip_suffix(".service") else {
        return Err(format!("{unit:?} is not a .service unit"));
    };
    let valid_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '.' | '-' | '@' | '\\');
    if stem.is_empty() || !stem.chars().all(valid_char) {
        return Err(format!("{unit:?} is not a valid unit name"));
    }
    Ok(())
}

/// `v<major>.<minor>.<patch>` with an optional pre-release or build suffix.
fn is_kubernetes_version(version: &str) -> bool {
    crate::version::KubernetesVersion::parse(version).is_some()
}

/// A Kubernetes object name (DNS subdomain: RFC 1123, at most 253 characters).
pub fn check_object_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err(format!("{name:?} must have 1 to 253 characters"));
    }
    let valid = name.split('.').all(|label| {
        !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid object name (RFC 1123 subdomain)"
        ))
    }
}
