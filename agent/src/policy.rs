//! The node-local policy applied to a plan: pure, before any I/O. Every problem is reported
//! with the field path, like the API's own validation, and reason `PolicyDenied` — except
//! a missing signature on a node that requires them, which is `SignatureInvalid`.

use std::net::IpAddr;
use std::path::Path;

use inplace_proto::validate::{FieldError, Problems};
use inplace_proto::{ArtifactType, Reason, UpdateContent};

use crate::settings::Policy;

/// The agent's own system extension (`/etc/extensions/inplace-agent.raw`, as
/// `packaging/node/build-sysext.sh` names it). No plan may replace it: the swap would be
/// committed while the old process runs, and a broken agent found only at its next start,
/// with nothing left on the node to roll it back (docs/usage/flatcar.md, "Upgrading the agent").
pub const OWN_EXTENSION: &str = "inplace-agent";
/// The agent's own unit: restarting it mid-activation would kill the activation itself.
pub const OWN_UNIT: &str = "inplace-agent.service";

/// Checks `content` (at `spec`) against `policy`; all problems at once.
pub fn check(content: &UpdateContent, policy: &Policy) -> Result<(), Problems> {
    let mut problems = Vec::new();
    let mut unsigned = Vec::new();
    let mut deny = |path: String, message: String| {
        problems.push(FieldError {
            path,
            reason: Reason::PolicyDenied,
            message,
        });
    };

    for (i, artifact) in content.artifacts.iter().enumerate() {
        let at = format!("spec.artifacts[{i}]");
        if let Some(message) = crate::registry::artifact_url_problem(&artifact.url, policy) {
            deny(format!("{at}.url"), message);
        }
        match &artifact.signature_url {
            Some(signature_url) => {
                if let Some(message) = url_problem(signature_url, policy) {
                    deny(format!("{at}.signatureUrl"), message);
                }
            }
            None if policy.require_signatures => unsigned.push(FieldError {
                path: format!("{at}.signatureUrl"),
                reason: Reason::SignatureInvalid,
                message: format!(
                    "artifact {} has no signatureUrl and this node requires signatures",
                    artifact.name
                ),
            }),
            None => {}
        }
        if let Some(size) = artifact.size
            && size > policy.max_artifact_size
        {
            deny(
                format!("{at}.size"),
                format!(
                    "{size} bytes is more than this node's limit of {} bytes",
                    policy.max_artifact_size
                ),
            );
        }
        if let Some(size) = artifact.max_extracted_size
            && size > policy.max_artifact_size
        {
            deny(
                format!("{at}.maxExtractedSize"),
                format!(
                    "{size} bytes is more than this node's limit of {} bytes (max_artifact_size)",
                    policy.max_artifact_size
                ),
            );
        }
        match artifact.kind {
            ArtifactType::Binary => {
                if let Some(path) = &artifact.path
                    && let Some(message) = target_problem(path, policy)
                {
                    deny(format!("{at}.path"), message);
                }
            }
            ArtifactType::Config => {
                if let Some(path) = &artifact.path
                    && let Some(message) = config_problem(path, policy)
                {
                    deny(
                        format!("{at}.path"),
                        format!("Config artifact {}: {message}", artifact.name),
                    );
                }
            }
            ArtifactType::Archive => {
                for (j, member) in artifact.members.iter().enumerate() {
                    if let Some(message) = target_problem(&member.to, policy) {
                        deny(format!("{at}.members[{j}].to"), message);
                    }
                }
            }
            ArtifactType::Sysext => {
                if artifact.name == OWN_EXTENSION {
                    deny(
                        format!("{at}.name"),
                        format!(
                            "sysext {OWN_EXTENSION} is the agent's own extension; a plan may not replace the agent (upgrade it as docs/usage/flatcar.md says)"
                        ),
                    );
                }
            }
        }
    }

    let units = content
        .activation
        .restart_units
        .iter()
        .enumerate()
        .map(|(i, u)| (format!("spec.activation.restartUnits[{i}]"), u))
        .chain(
            content
                .health_checks
                .units
                .iter()
                .enumerate()
                .map(|(i, u)| (format!("spec.healthChecks.units[{i}]"), u)),
        );
    for (path, unit) in units {
        if !policy.allowed_units.iter().any(|allowed| allowed == unit) {
            deny(
                path,
                format!(
                    "unit {unit} is not in this node's allowed units ({})",
                    policy.allowed_units.join(", ")
                ),
            );
        }
    }

    if !policy.allow_remote_health_checks {
        for (i, check) in content.health_checks.http.iter().enumerate() {
            let loopback = url::Url::parse(&check.url)
                .ok()
                .and_then(|u| u.host().map(|h| is_loopback(&h)))
                .unwrap_or(false);
            if !loopback {
                deny(
                    format!("spec.healthChecks.http[{i}].url"),
                    format!(
                        "{} is not on loopback and this node does not allow remote health checks",
                        check.url
                    ),
                );
            }
        }
    }

    // After the PolicyDenied ones: a plan that breaks the policy is reported as such first.
    problems.extend(unsigned);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Problems(problems))
    }
}

fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(ip) => IpAddr::V4(*ip).is_loopback(),
        url::Host::Ipv6(ip) => IpAddr::V6(*ip).is_loopback(),
    }
}

/// Why an artifact URL (or a redirect target) is not allowed here, if it is not.
pub fn url_problem(text: &str, policy: &Policy) -> Option<String> {
    let url = match url::Url::parse(text) {
        Ok(url) => url,
        Err(e) => return Some(format!("{text:?} is not a URL: {e}")),
    };
    match url.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        "http" => return Some(format!("{text} is plain http and this node requires https")),
        other => return Some(format!("scheme {other}:// is not allowed")),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Some("credentials in URLs are not allowed".into());
    }
    // The parsed URL is normalized (`https://HOST/a/../x` is `https://HOST/x`), so a `..`
    // cannot step out of a prefix; encoded ones are refused by `admits`.
    if !policy.allowed_url_prefixes.iter().any(|p| p.admits(&url)) {
        return Some(format!(
            "{} is not under an allowed URL prefix of this node",
            url.as_str()
        ));
    }
    None
}

fn target_problem(path: &str, policy: &Policy) -> Option<String> {
    // Shape (absolute, normalized) is the API validation's job; refuse here too so the
    // policy never relies on it having run.
    if inplace_proto::validate::check_node_path(path).is_err() {
        return Some(format!("{path:?} is not an absolute, normalized path"));
    }
    let path = Path::new(path);
    if policy
        .allowed_target_dirs
        .iter()
        .any(|dir| path.starts_with(dir) && path != dir)
    {
        None
    } else {
        Some(format!(
            "{} is outside this node's allowed target directories ({})",
            path.display(),
            policy
                .allowed_target_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// Why a Config artifact may not land at `path`: outside (or exactly at) every configuration
/// root, or in the agent's own configuration, which a plan must never rewrite (a broken
/// agent.toml would leave nothing on the node to roll it back).
fn config_problem(path: &str, policy: &Policy) -> Option<String> {
    if inplace_proto::validate::check_node_path(path).is_err() {
        return Some(format!("{path:?} is not an absolute, normalized path"));
    }
    let path = Path::new(path);
    if path.starts_with("/etc/inplace") {
        return Some(format!(
            "{} is the agent's own configuration; a plan may not change it",
            path.display()
        ));
    }
    if policy
        .allowed_config_roots
        .iter()
        .any(|dir| path.starts_with(dir) && path != dir)
    {
        return None;
    }
    let roots = policy
        .allowed_config_roots
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>();
    Some(format!(
        "{} is outside this node's allowed configuration roots ({})",
        path.display(),
        if roots.is_empty() {
            "none: set policy.allowed_config_roots".to_owned()
        } else {
            roots.join(", ")
        }
    ))
}

#[cfg(test)]
mod tests;
