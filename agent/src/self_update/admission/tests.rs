use std::time::Duration;

use inplace_proto::validate::Problems;

use super::*;

fn policy() -> Policy {
    crate::settings::from_toml(
        "[policy]\nallowed_url_prefixes = [\"https://dl.example/\"]\nmax_artifact_size = 1000\n",
        || Some("node".into()),
    )
    .expect("settings")
    .policy
}

fn admission(allow: bool, installation: Installation) -> Admission {
    Admission {
        settings: SelfUpdateSettings {
            allow,
            allow_downgrade: false,
            trusted_keys_dir: "/etc/inplace/keys".into(),
            confirm_timeout: Duration::from_secs(120),
        },
        installation,
        running_version: "0.3.0".into(),
        guard_missing: None,
    }
}

fn agent_update() -> UpdateContent {
    serde_json::from_value(serde_json::json!({"agent": {
        "version": "0.4.0",
        "url": "https://dl.example/inplace-agent-0.4.0.raw",
        "sha256": "a".repeat(64),
        "size": 100,
        "signatureUrl": "https://dl.example/inplace-agent-0.4.0.raw.minisig",
    }}))
    .expect("content")
}

/// The problems as the plan's condition reports them: the reason, and the fields named.
fn refused(content: &UpdateContent, admission: &Admission) -> (Reason, Problems) {
    let problems = Problems(check(content, &policy(), admission));
    assert!(!problems.0.is_empty(), "not refused");
    (problems.reason(), problems)
}

#[test]
fn content_without_an_agent_is_none_of_its_business() {
    let content: UpdateContent = serde_json::from_value(serde_json::json!({"artifacts": [
        {"name": "k", "type": "Sysext", "url": "https://dl.example/k.raw", "sha256": "0".repeat(64)}
    ]}))
    .expect("content");
    assert!(
        check(
            &content,
            &policy(),
            &admission(false, Installation::Package)
        )
        .is_empty()
    );
}

#[test]
fn a_node_that_does_not_allow_it_denies_at_spec_agent() {
    let (reason, problems) = refused(&agent_update(), &admission(false, Installation::Sysext));
    assert_eq!(reason, Reason::PolicyDenied);
    assert!(problems.has("spec.agent"), "{problems}");
    assert!(
        problems.to_string().contains("[self_update] allow"),
        "{problems}"
    );
}

#[test]
fn a_package_installed_agent_cannot_replace_itself() {
    let (reason, problems) = refused(&agent_update(), &admission(true, Installation::Package));
    assert_eq!(reason, Reason::SelfUpdateUnsupported);
    assert!(problems.has("spec.agent"), "{problems}");
    assert!(problems.to_string().contains("package"), "{problems}");
}

#[test]
fn without_an_active_guard_no_switch_is_admitted() {
    let mut node = admission(true, Installation::Sysext);
    node.guard_missing = Some("inplace-agent-guard.path is inactive".into());
    let (reason, problems) = refused(&agent_update(), &node);
    assert_eq!(reason, Reason::SelfUpdateUnsupported);
    assert!(problems.has("spec.agent"), "{problems}");
    for word in [
        "inplace-agent-guard.path is inactive",
        "nothing would restore",
    ] {
        assert!(problems.to_string().contains(word), "{word}: {problems}");
    }
}

#[test]
fn the_agent_image_is_always_signed() {
    // require_signatures is off in this policy: the agent image needs one anyway.
    assert!(!policy().require_signatures);
    let mut content = agent_update();
    content.agent.as_mut().expect("agent").signature_url = None;
    let (reason, problems) = refused(&content, &admission(true, Installation::Sysext));
    assert_eq!(reason, Reason::SignatureInvalid);
    assert!(problems.has("spec.agent.signatureUrl"), "{problems}");
}

#[test]
fn the_image_comes_from_where_the_policy_lets_artifacts_come_from() {
    let mut content = agent_update();
    let agent = content.agent.as_mut().expect("agent");
    agent.url = "https://other.example/inplace-agent.raw".into();
    agent.signature_url = Some("http://dl.example/inplace-agent.raw.minisig".into());
    agent.size = Some(1001);
    let (reason, problems) = refused(&content, &admission(true, Installation::Sysext));
    assert_eq!(reason, Reason::PolicyDenied);
    for path in [
        "spec.agent.url",
        "spec.agent.signatureUrl",
        "spec.agent.size",
    ] {
        assert!(problems.has(path), "{path} not in {problems}");
    }
}

#[test]
fn an_allowed_signed_update_within_policy_is_admitted() {
    let problems = check(
        &agent_update(),
        &policy(),
        &admission(true, Installation::Sysext),
    );
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn a_lower_version_than_the_running_build_is_a_downgrade_unless_the_node_allows_it() {
    let mut node = admission(true, Installation::Sysext);
    node.running_version = "0.10.0".into();
    let (reason, problems) = refused(&agent_update(), &node);
    assert_eq!(reason, Reason::DowngradeDenied);
    assert!(problems.has("spec.agent.version"), "{problems}");
    for word in ["0.4.0 is lower than 0.10.0", "allow_downgrade"] {
        assert!(problems.to_string().contains(word), "{word}: {problems}");
    }
    // A version that cannot be ordered is no proof of an upgrade.
    node.running_version = "custom-build".into();
    let (reason, problems) = refused(&agent_update(), &node);
    assert_eq!(reason, Reason::DowngradeDenied);
    assert!(
        problems.to_string().contains("cannot be ordered"),
        "{problems}"
    );
    node.settings.allow_downgrade = true;
    node.running_version = "0.10.0".into();
    assert!(check(&agent_update(), &policy(), &node).is_empty());
}

#[test]
fn the_running_version_replaces_nothing_and_is_never_refused() {
    // Not even where agent updates are off, or by a package-installed agent: the plan asks
    // for what runs (a node bootstrapped with the fleet's image, given the fleet's rollout).
    for installation in [Installation::Sysext, Installation::Package] {
        let mut node = admission(false, installation);
        node.running_version = "0.4.0".into();
        assert!(node.runs(&agent_update()));
        assert!(check(&agent_update(), &policy(), &node).is_empty());
    }
}

#[test]
fn the_installation_is_read_from_the_agents_own_extension_link() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(Installation::detect(dir.path()), Installation::Package);
    std::os::unix::fs::symlink(
        "/opt/extensions/inplace-agent/inplace-agent-0.3.0.raw",
        dir.path().join("inplace-agent.raw"),
    )
    .expect("link");
    // A dangling link is still the agent's own extension link (the image is elsewhere).
    assert_eq!(Installation::detect(dir.path()), Installation::Sysext);
}
