//! The rules of an agent update (`spec.agent`): the image's own fields, and that it travels
//! alone — no artifacts, no restarted units, no health checks — because the new agent is
//! judged by its own confirmation and the guard, never by checks another agent runs.

use url::Url;

use super::{
    Collector, check_sha256, check_signature_url, check_url_scheme_and_credentials, parse_url,
    url_file_name,
};
use crate::content::{AgentImage, UpdateContent};

/// Longest version label (as the CRD says).
const MAX_VERSION_LEN: usize = 64;

pub(super) fn check_agent_update(
    content: &UpdateContent,
    agent: &AgentImage,
    at: &str,
    out: &mut Collector,
) {
    let path = format!("{at}.agent");
    check_image(agent, &path, out);
    if !content.artifacts.is_empty() {
        out.invalid(
            format!("{at}.artifacts"),
            "a release with agent carries no other artifact: the agent switches alone",
        );
    }
    if !content.activation.restart_units.is_empty() {
        out.invalid(
            format!("{at}.activation.restartUnits"),
            "a release with agent restarts no unit: the agent restarts itself",
        );
    }
    if content.reboots() {
        out.invalid(
            format!("{at}.activation.mode"),
            "a release with agent is not activated by a reboot: the agent restarts itself",
        );
    }
    let checks = &content.health_checks;
    if !checks.units.is_empty()
        || !checks.http.is_empty()
        || checks.node_kubelet_version
        || checks.node_ready
    {
        out.invalid(
            format!("{at}.healthChecks"),
            "a release with agent has no health checks: the new agent confirms itself",
        );
    }
}

fn check_image(agent: &AgentImage, path: &str, out: &mut Collector) {
    let version = agent.version.trim();
    if version.is_empty() {
        out.invalid(format!("{path}.version"), "is required");
    } else if agent.version.len() > MAX_VERSION_LEN {
        out.invalid(
            format!("{path}.version"),
            format!(
                "{} characters is longer than {MAX_VERSION_LEN}",
                agent.version.len()
            ),
        );
    } else if version != agent.version || version.contains(char::is_whitespace) {
        // It is matched against a signature's `version:` token, which ends at a space.
        out.invalid(
            format!("{path}.version"),
            format!("{:?} must be one word", agent.version),
        );
    }
    if let Err(message) = check_sha256(&agent.sha256) {
        out.invalid(format!("{path}.sha256"), message);
    }
    if agent.size == Some(0) {
        out.invalid(format!("{path}.size"), "must be positive when given");
    }
    match parse_url(&agent.url) {
        Ok(url) => check_image_url(&url, &format!("{path}.url"), out),
        Err(message) => out.invalid(format!("{path}.url"), message),
    }
    check_signature_url(agent.signature_url.as_deref(), path, out);
}

fn check_image_url(url: &Url, path: &str, out: &mut Collector) {
    check_url_scheme_and_credentials(url, path, out);
    if url_file_name(url).is_none() {
        out.invalid(
            path,
            "the URL must end in a file name: the image is stored under it",
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::content::{AgentImage, UpdateContent};
    use crate::validate::{Collector, Problems};

    fn image() -> AgentImage {
        AgentImage {
            version: "0.4.0".into(),
            url: "https://dl.example/inplace-agent-0.4.0.raw".into(),
            sha256: "a".repeat(64),
            size: Some(4096),
            signature_url: Some("https://dl.example/inplace-agent-0.4.0.raw.minisig".into()),
        }
    }

    fn agent_update(agent: AgentImage) -> UpdateContent {
        serde_json::from_value(serde_json::json!({ "agent": agent })).expect("content")
    }

    /// A change that breaks one field of a good image.
    type Spoil = fn(&mut AgentImage);

    fn problems(content: &UpdateContent) -> Option<Problems> {
        let mut out = Collector::default();
        super::super::check_content(content, "spec", &mut out);
        out.finish().err()
    }

    #[test]
    fn an_agent_update_needs_no_artifact() {
        assert_eq!(problems(&agent_update(image())), None);
    }

    #[test]
    fn an_agent_update_travels_alone() {
        let mut content: UpdateContent = serde_json::from_value(serde_json::json!({
            "agent": image(),
            "artifacts": [{"name": "kubelet", "type": "Sysext",
                "url": "https://dl.example/kubelet.raw", "sha256": "b".repeat(64)}],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"units": ["kubelet.service"]},
        }))
        .expect("content");
        let found = problems(&content).expect("refused");
        for path in [
            "spec.artifacts",
            "spec.activation.restartUnits",
            "spec.healthChecks",
        ] {
            assert!(found.has(path), "{path} not named in {found}");
        }
        content.artifacts.clear();
        content.activation.restart_units.clear();
        content.health_checks.units.clear();
        assert_eq!(problems(&content), None);
        // The Node checks are health checks too: the new agent judges itself alone.
        content.health_checks.node_ready = true;
        let found = problems(&content).expect("nodeReady refused");
        assert!(found.has("spec.healthChecks"), "{found}");
    }

    #[test]
    fn an_agent_update_is_not_activated_by_a_reboot() {
        let mut content = agent_update(image());
        content.activation.mode = Some(crate::ActivationMode::Reboot);
        let found = problems(&content).expect("refused");
        assert!(found.has("spec.activation.mode"), "{found}");
        content.activation.mode = Some(crate::ActivationMode::Restart);
        assert_eq!(problems(&content), None);
    }

    #[test]
    fn each_bad_image_field_is_named() {
        let cases: [(&str, Spoil); 6] = [
            ("spec.agent.version", |a| a.version = String::new()),
            ("spec.agent.version", |a| a.version = "0.4 beta".into()),
            ("spec.agent.sha256", |a| a.sha256 = "A".repeat(64)),
            ("spec.agent.size", |a| a.size = Some(0)),
            ("spec.agent.url", |a| a.url = "https://dl.example/".into()),
            ("spec.agent.signatureUrl", |a| {
                a.signature_url = Some("ftp://dl.example/x.minisig".into())
            }),
        ];
        for (path, spoil) in cases {
            let mut agent = image();
            spoil(&mut agent);
            let found = problems(&agent_update(agent)).expect("refused");
            assert!(found.has(path), "{path} not named in {found}");
        }
    }
}
