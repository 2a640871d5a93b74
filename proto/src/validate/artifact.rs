//! One artifact: its name, where its file comes from and what it must be (an http(s) URL or
//! a digest-pinned registry reference, `sha256`, `size`, `signatureUrl`), and the fields each
//! type needs (`path`, `members`, `maxExtractedSize`), with target paths no two artifacts
//! share.

use std::collections::HashSet;

use super::names::check_member_name;
use super::urls::MAX_URL_LEN;
use super::{
    Collector, architecture, check_artifact_name, check_node_path, check_signature_url,
    check_url_scheme_and_credentials, parse_url, url_basename, url_file_name,
};
use crate::content::{Artifact, ArtifactType};

pub(super) fn check_artifact(
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
    if !artifact.is_extracted() && artifact.max_extracted_size.is_some() {
        out.invalid(
            format!("{path}.maxExtractedSize"),
            "maxExtractedSize is only for Archive artifacts and Config directories",
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
    check_file_attributes(artifact, path, out);
}

/// A Config file's `mode` and `owner`; other types have neither (their files are the
/// agent's: executables 0755, images 0644, root's).
fn check_file_attributes(artifact: &Artifact, path: &str, out: &mut Collector) {
    let config = artifact.kind == ArtifactType::Config;
    for (field, given) in [
        ("directory", artifact.directory),
        ("mode", artifact.mode.is_some()),
        ("owner", artifact.owner.is_some()),
    ] {
        if given && !config {
            out.invalid(
                format!("{path}.{field}"),
                format!("{field} is only for Config artifacts"),
            );
        }
    }
    if !config {
        return;
    }
    if artifact.directory && artifact.mode.is_some() {
        out.invalid(
            format!("{path}.mode"),
            "a directory's files have their archive's modes: mode is for a single file",
        );
    } else if let Err(message) = artifact.config_mode() {
        out.invalid(format!("{path}.mode"), message);
    }
    if let Err(message) = artifact.config_owner() {
        out.invalid(format!("{path}.owner"), message);
    }
}

/// Where an artifact's file comes from and what it must be: `url`, `sha256`, `size`,
/// `signatureUrl` (also each of its builds for other architectures, at their own `path`).
pub(super) fn check_source(artifact: &Artifact, path: &str, out: &mut Collector) {
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
