//! The content a release and a plan share: the artifact list, activation, health checks and
//! `kubernetesVersion` (an agent update's own rules are in `agent_image.rs`, each artifact's
//! in `artifact.rs`).

use std::collections::HashSet;

use super::{
    Collector, agent_image, artifact::check_artifact, check_unit_name,
    check_url_scheme_and_credentials, parse_url,
};
use crate::content::UpdateContent;

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

/// A unit the agent may restart or watch: a plain `.service` name.
fn check_unit(unit: &str, path: &str, out: &mut Collector) {
    if let Err(message) = check_unit_name(unit) {
        out.denied(path, message);
    }
}

/// `v<major>.<minor>.<patch>` with an optional pre-release or build suffix.
fn is_kubernetes_version(version: &str) -> bool {
    crate::version::KubernetesVersion::parse(version).is_some()
}
