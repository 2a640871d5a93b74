use super::*;
use inplace_proto::{ArchiveMember, Artifact, HttpCheck};

fn policy() -> Policy {
    Policy {
        allowed_url_prefixes: vec!["https://dl.example/".parse().unwrap()],
        allow_http: false,
        allowed_target_dirs: vec!["/opt/bin".into()],
        allowed_config_roots: vec!["/etc/kubernetes".into()],
        allowed_units: vec!["kubelet.service".into()],
        max_artifact_size: 1000,
        reserved_disk_space: 0,
        allow_remote_health_checks: false,
        require_signatures: false,
        trusted_keys_dir: "/etc/inplace/keys".into(),
    }
}

fn artifact(kind: ArtifactType) -> Artifact {
    Artifact {
        size: Some(10),
        path: match kind {
            ArtifactType::Binary => Some("/opt/bin/a".into()),
            ArtifactType::Config => Some("/etc/kubernetes/kubelet.conf".into()),
            _ => None,
        },
        members: if kind == ArtifactType::Archive {
            vec![ArchiveMember {
                from: "bin/a".into(),
                to: "/opt/bin/b".into(),
            }]
        } else {
            vec![]
        },
        ..Artifact::new("a", kind, "https://dl.example/a.raw", "0".repeat(64))
    }
}

fn content(artifacts: Vec<Artifact>) -> UpdateContent {
    UpdateContent {
        kubernetes_version: None,
        artifacts,
        agent: None,
        activation: Default::default(),
        health_checks: Default::default(),
    }
}

fn denied_at(c: &UpdateContent, p: &Policy, path: &str) {
    let problems = check(c, p).expect_err(path);
    assert!(problems.has(path), "{path} not in {problems}");
    assert_eq!(problems.reason(), Reason::PolicyDenied);
}

#[test]
fn config_lands_only_below_a_configuration_root() {
    let p = policy();
    check(&content(vec![artifact(ArtifactType::Config)]), &p).unwrap();
    for outside in [
        "/etc/shadow",
        "/etc/kubernetes",
        "/opt/bin/kubelet.conf",
        "/etc/inplace/agent.toml",
    ] {
        let mut a = artifact(ArtifactType::Config);
        a.name = "kubelet-config".into();
        a.path = Some(outside.into());
        let problems = check(&content(vec![a]), &p).expect_err(outside);
        assert_eq!(problems.reason(), Reason::PolicyDenied, "{outside}");
        let text = problems.to_string();
        assert!(text.contains("spec.artifacts[0].path"), "{text}");
        assert!(text.contains("Config artifact kubelet-config"), "{text}");
        assert!(text.contains(outside), "{text}");
    }
    // A Binary's directories are not configuration roots, nor the reverse.
    let mut a = artifact(ArtifactType::Binary);
    a.path = Some("/etc/kubernetes/kubelet.conf".into());
    denied_at(&content(vec![a]), &p, "spec.artifacts[0].path");
    let mut none = policy();
    none.allowed_config_roots.clear();
    let problems =
        check(&content(vec![artifact(ArtifactType::Config)]), &none).expect_err("no roots");
    assert!(
        problems
            .to_string()
            .contains("set policy.allowed_config_roots"),
        "{problems}"
    );
}

#[test]
fn allowed_plan_passes() {
    let c = content(vec![
        artifact(ArtifactType::Sysext),
        artifact(ArtifactType::Binary),
        artifact(ArtifactType::Archive),
    ]);
    check(&c, &policy()).unwrap();
}

#[test]
fn urls() {
    for url in [
        "http://dl.example/a.raw",
        "https://other.example/a.raw",
        "file:///etc/passwd",
        "https://user:pw@dl.example/a.raw",
        "https://dl.example.evil/a.raw",
        "ftp://dl.example/a",
    ] {
        let mut a = artifact(ArtifactType::Sysext);
        a.url = url.into();
        denied_at(&content(vec![a]), &policy(), "spec.artifacts[0].url");
    }
    // `..` is normalized before the prefix comparison.
    let mut a = artifact(ArtifactType::Sysext);
    a.url = "https://dl.example/../secret/a.raw".into();
    check(&content(vec![a]), &policy()).unwrap();
    let mut p = policy();
    p.allowed_url_prefixes = vec!["https://dl.example/pub/".parse().unwrap()];
    let mut a = artifact(ArtifactType::Sysext);
    a.url = "https://dl.example/pub/../secret/a.raw".into();
    denied_at(&content(vec![a]), &p, "spec.artifacts[0].url");
    // Compared by parts, not as strings: neither a longer host nor an encoded `/`
    // gets past a prefix (both did when prefixes were compared as strings).
    for (prefix, url) in [
        (
            "https://dl.example",
            "https://dl.example.attacker.net/a.raw",
        ),
        (
            "https://dl.example/pub/",
            "https://dl.example/pub/..%2fsecret/a.raw",
        ),
    ] {
        p.allowed_url_prefixes = vec![prefix.parse().unwrap()];
        let mut a = artifact(ArtifactType::Sysext);
        a.url = url.into();
        denied_at(&content(vec![a]), &p, "spec.artifacts[0].url");
    }
}

#[test]
fn http_only_when_allowed() {
    let mut p = policy();
    p.allow_http = true;
    p.allowed_url_prefixes
        .push("http://dl.example/".parse().unwrap());
    let mut a = artifact(ArtifactType::Sysext);
    a.url = "http://dl.example/a.raw".into();
    check(&content(vec![a]), &p).unwrap();
}

#[test]
fn size_over_limit() {
    let mut a = artifact(ArtifactType::Sysext);
    a.size = Some(1001);
    denied_at(&content(vec![a]), &policy(), "spec.artifacts[0].size");
    let mut a = artifact(ArtifactType::Archive);
    a.max_extracted_size = Some(1001);
    denied_at(
        &content(vec![a]),
        &policy(),
        "spec.artifacts[0].maxExtractedSize",
    );
}

#[test]
fn targets() {
    for path in [
        "/usr/bin/a",
        "/opt/binx/a",
        "/opt/bin",
        "opt/bin/a",
        "/opt/bin/../sbin/a",
    ] {
        let mut a = artifact(ArtifactType::Binary);
        a.path = Some(path.into());
        denied_at(&content(vec![a]), &policy(), "spec.artifacts[0].path");
    }
    let mut a = artifact(ArtifactType::Archive);
    a.members[0].to = "/etc/shadow".into();
    denied_at(
        &content(vec![a]),
        &policy(),
        "spec.artifacts[0].members[0].to",
    );
    let mut a = artifact(ArtifactType::Binary);
    a.path = Some("/opt/bin/sub/a".into());
    check(&content(vec![a]), &policy()).unwrap();
}

#[test]
fn units() {
    let mut c = content(vec![artifact(ArtifactType::Sysext)]);
    c.activation.restart_units = vec!["kubelet.service".into(), "sshd.service".into()];
    denied_at(&c, &policy(), "spec.activation.restartUnits[1]");
    let mut c = content(vec![artifact(ArtifactType::Sysext)]);
    c.health_checks.units = vec!["dbus.service".into()];
    denied_at(&c, &policy(), "spec.healthChecks.units[0]");
}

#[test]
fn the_agents_own_extension_is_not_a_plan_artifact() {
    // A plan could otherwise swap the agent's own image under it: committed while the
    // old process runs, and a broken agent found only at its next start, with nothing
    // left on the node to roll it back.
    for kind in [
        ArtifactType::Sysext,
        ArtifactType::Binary,
        ArtifactType::Archive,
    ] {
        let mut a = artifact(ArtifactType::Sysext);
        a.name = "inplace-agent".into();
        let c = content(vec![artifact(kind), a]);
        denied_at(&c, &policy(), "spec.artifacts[1].name");
    }
}

#[test]
fn http_checks_loopback_only_unless_allowed() {
    let mut c = content(vec![artifact(ArtifactType::Sysext)]);
    for url in [
        "http://127.0.0.1:10248/healthz",
        "http://localhost/x",
        "http://[::1]:1/",
    ] {
        c.health_checks.http = vec![HttpCheck { url: url.into() }];
        check(&c, &policy()).unwrap();
    }
    c.health_checks.http = vec![HttpCheck {
        url: "http://10.0.0.1/healthz".into(),
    }];
    denied_at(&c, &policy(), "spec.healthChecks.http[0].url");
    let mut p = policy();
    p.allow_remote_health_checks = true;
    check(&c, &p).unwrap();
}

#[test]
fn reports_all_problems() {
    let mut a = artifact(ArtifactType::Binary);
    a.url = "http://x/a".into();
    a.path = Some("/etc/a".into());
    a.size = Some(5000);
    let problems = check(&content(vec![a]), &policy()).unwrap_err();
    assert_eq!(problems.0.len(), 3, "{problems}");
}

#[test]
fn unsigned_artifacts_only_where_signatures_are_not_required() {
    let c = content(vec![artifact(ArtifactType::Sysext)]);
    check(&c, &policy()).unwrap();
    let mut p = policy();
    p.require_signatures = true;
    let problems = check(&c, &p).unwrap_err();
    assert!(problems.has("spec.artifacts[0].signatureUrl"), "{problems}");
    assert_eq!(problems.reason(), Reason::SignatureInvalid);
    assert!(problems.to_string().contains("artifact a "), "{problems}");
    let mut a = artifact(ArtifactType::Sysext);
    a.signature_url = Some("https://dl.example/a.raw.minisig".into());
    check(&content(vec![a]), &p).unwrap();
}

#[test]
fn signature_urls_obey_the_url_policy() {
    for url in [
        "http://dl.example/a.raw.minisig",
        "https://other.example/a.raw.minisig",
        "https://user:pw@dl.example/a.raw.minisig",
    ] {
        let mut a = artifact(ArtifactType::Sysext);
        a.signature_url = Some(url.into());
        denied_at(
            &content(vec![a]),
            &policy(),
            "spec.artifacts[0].signatureUrl",
        );
    }
}

#[test]
fn a_policy_violation_is_reported_before_a_missing_signature() {
    let mut a = artifact(ArtifactType::Sysext);
    a.url = "https://other.example/a.raw".into();
    let mut p = policy();
    p.require_signatures = true;
    let problems = check(&content(vec![a]), &p).unwrap_err();
    assert_eq!(problems.reason(), Reason::PolicyDenied);
    assert!(problems.has("spec.artifacts[0].signatureUrl"), "{problems}");
}
