//! Every bad plan of `faults.md` § Plans gets the exact reason and field path, and a plan
//! with several problems reports all of them.

use inplace_proto::{
    ArchiveMember, Artifact, ArtifactType, Duration, HttpCheck, NodeUpdatePlan, Reason, revision_of,
};
use inplace_strict_yaml::{StrictError, object_from_yaml};

const PLAN: &str = r#"
apiVersion: inplace.dev/v1alpha1
kind: NodeUpdatePlan
metadata: {name: worker-1}
spec:
  nodeName: worker-1
  desiredState: Active
  kubernetesVersion: v1.31.2
  artifacts:
  - name: kubernetes
    type: Sysext
    url: https://extensions.example/kubernetes-v1.31.2-x86-64.raw
    sha256: a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1
    size: 1024
  - name: kubectl
    type: Binary
    url: https://dl.example/kubectl
    sha256: b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2
    path: /opt/bin/kubectl
  - name: node
    type: Archive
    url: https://dl.example/node.tar.gz
    sha256: c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3
    members: [{from: kubernetes/node/bin/kubeadm, to: /opt/bin/kubeadm}]
  activation: {restartUnits: [kubelet.service]}
  healthChecks:
    units: [kubelet.service]
    http: [{url: "http://127.0.0.1:10248/healthz"}]
    nodeKubeletVersion: true
    window: 10s
    timeout: 1m
"#;

fn plan() -> NodeUpdatePlan {
    object_from_yaml(PLAN).expect("the base plan parses")
}

/// Applies `change` to a valid plan and returns the single (reason, path) reported.
fn only_problem(change: impl FnOnce(&mut NodeUpdatePlan)) -> (Reason, String) {
    let mut plan = plan();
    change(&mut plan);
    let problems = plan
        .validate()
        .expect_err("the changed plan must be refused");
    assert_eq!(problems.0.len(), 1, "expected one problem, got: {problems}");
    let problem = &problems.0[0];
    (problem.reason, problem.path.clone())
}

fn sysext(plan: &mut NodeUpdatePlan) -> &mut Artifact {
    &mut plan.spec.content.artifacts[0]
}

#[test]
fn the_base_plan_is_valid() {
    plan().validate().unwrap();
}

#[test]
fn sha256_must_be_64_lowercase_hex() {
    let path = "spec.artifacts[0].sha256";
    for bad in ["", "abc", &"A".repeat(64), &"g".repeat(64), &"1".repeat(65)] {
        let bad = bad.to_owned();
        assert_eq!(
            only_problem(|p| sysext(p).sha256 = bad),
            (Reason::InvalidPlan, path.into())
        );
    }
}

#[test]
fn size_zero_is_invalid() {
    assert_eq!(
        only_problem(|p| sysext(p).size = Some(0)),
        (Reason::InvalidPlan, "spec.artifacts[0].size".into())
    );
}

#[test]
fn negative_size_and_wrong_types_are_refused_while_parsing() {
    for (from, to) in [
        ("size: 1024", "size: -5"),
        ("size: 1024", "size: \"1024\""),
        ("desiredState: Active", "desiredState: Running"),
        ("type: Sysext", "type: Tarball"),
    ] {
        let text = PLAN.replacen(from, to, 1);
        let error = object_from_yaml::<NodeUpdatePlan>(&text).expect_err(to);
        assert!(matches!(error, StrictError::Malformed(_)), "{to}: {error}");
    }
}

#[test]
fn unknown_fields_are_named() {
    let text = PLAN.replacen("    size: 1024", "    size: 1024\n    checksum: md5", 1);
    match object_from_yaml::<NodeUpdatePlan>(&text) {
        Err(StrictError::UnknownFields(fields)) => {
            assert_eq!(fields, ["spec.artifacts[0].checksum"]);
        }
        other => panic!("expected UnknownFields, got {other:?}"),
    }
}

#[test]
fn oversized_documents_and_strings_are_refused() {
    let huge = format!("{PLAN}# {}\n", "x".repeat(4 * 1024 * 1024));
    assert!(matches!(
        object_from_yaml::<NodeUpdatePlan>(&huge),
        Err(StrictError::TooLarge(_))
    ));
    assert_eq!(
        only_problem(|p| sysext(p).url = format!("https://x.example/{}", "a".repeat(5000))),
        (Reason::InvalidPlan, "spec.artifacts[0].url".into())
    );
    assert_eq!(
        only_problem(
            |p| p.spec.content.artifacts[1].path = Some(format!("/opt/{}", "b".repeat(5000)))
        ),
        (Reason::PolicyDenied, "spec.artifacts[1].path".into())
    );
}

#[test]
fn artifact_list_must_be_non_empty_with_unique_names() {
    assert_eq!(
        only_problem(|p| p.spec.content.artifacts.clear()),
        (Reason::InvalidPlan, "spec.artifacts".into())
    );
    assert_eq!(
        only_problem(|p| p.spec.content.artifacts[2].name = "kubectl".into()),
        (Reason::InvalidPlan, "spec.artifacts[2].name".into())
    );
}

#[test]
fn sysext_names_must_be_plain_file_names() {
    for bad in ["", "a/b", "..", ".", "../etc", "-x", "a b", &"n".repeat(64)] {
        let bad = bad.to_owned();
        assert_eq!(
            only_problem(|p| sysext(p).name = bad),
            (Reason::InvalidPlan, "spec.artifacts[0].name".into())
        );
    }
}

#[test]
fn target_paths_must_be_absolute_and_normalized() {
    for bad in [
        "opt/bin/kubectl",
        "/opt/bin/../../etc/shadow",
        "/opt//bin/kubectl",
        "/opt/bin/",
        "/opt/./x",
    ] {
        let bad = bad.to_owned();
        assert_eq!(
            only_problem(|p| p.spec.content.artifacts[1].path = Some(bad)),
            (Reason::PolicyDenied, "spec.artifacts[1].path".into())
        );
    }
    assert_eq!(
        only_problem(|p| p.spec.content.artifacts[2].members[0].to = "../kubeadm".into()),
        (
            Reason::PolicyDenied,
            "spec.artifacts[2].members[0].to".into()
        )
    );
}

#[test]
fn config_needs_a_path_and_daemon_reload_follows_unit_files() {
    // A path on a Sysext is still refused (the rule now names both types).
    assert_eq!(
        only_problem(|p| sysext(p).path = Some("/etc/kubernetes/x".into())),
        (Reason::InvalidPlan, "spec.artifacts[0].path".into())
    );
    let config = |p: &mut NodeUpdatePlan| {
        let a = &mut p.spec.content.artifacts[1];
        a.kind = ArtifactType::Config;
        a.path = Some("/etc/kubernetes/kubelet.conf".into());
    };
    assert_eq!(
        only_problem(|p| {
            config(p);
            p.spec.content.artifacts[1].path = None;
        }),
        (Reason::InvalidPlan, "spec.artifacts[1].path".into())
    );
    let mut plan = plan();
    config(&mut plan);
    plan.spec
        .content
        .artifacts
        .retain(|a| a.kind == ArtifactType::Config);
    plan.validate().unwrap();
    assert!(!plan.spec.content.daemon_reload());
    plan.spec.content.artifacts[0].path =
        Some("/etc/systemd/system/kubelet.service.d/50-flags.conf".into());
    assert!(plan.spec.content.daemon_reload());
    plan.spec.content.activation.daemon_reload = Some(false);
    assert!(!plan.spec.content.daemon_reload());
}

#[test]
fn mode_and_owner_are_a_config_files_and_must_be_well_formed() {
    let config = |p: &mut NodeUpdatePlan, mode: Option<&str>, owner: Option<&str>| {
        let a = &mut p.spec.content.artifacts[1];
        a.kind = ArtifactType::Config;
        a.path = Some("/etc/kubernetes/kubelet.conf".into());
        a.mode = mode.map(Into::into);
        a.owner = owner.map(Into::into);
    };
    let mut plan = plan();
    config(&mut plan, None, None);
    let artifact = &plan.spec.content.artifacts[1];
    assert_eq!(artifact.config_mode(), Ok(0o644));
    assert_eq!(artifact.config_owner(), Ok(("root", "root")));
    for (mode, bits) in [("0640", 0o640), ("600", 0o600), ("0000", 0)] {
        for owner in ["root:kubelet", "0:990", "_kubelet:systemd-journal"] {
            let mut plan = plan.clone();
            config(&mut plan, Some(mode), Some(owner));
            plan.validate().unwrap();
            assert_eq!(plan.spec.content.artifacts[1].config_mode(), Ok(bits));
        }
    }
    for mode in ["4755", "1777", "0o644", "644 ", "", "0", "0888", "00644"] {
        assert_eq!(
            only_problem(|p| config(p, Some(mode), None)),
            (Reason::InvalidPlan, "spec.artifacts[1].mode".into()),
            "{mode:?}"
        );
    }
    for owner in [
        "root",
        "root:",
        ":root",
        "root:kube:let",
        "root:../x",
        "a b:c",
    ] {
        assert_eq!(
            only_problem(|p| config(p, None, Some(owner))),
            (Reason::InvalidPlan, "spec.artifacts[1].owner".into()),
            "{owner:?}"
        );
    }
    assert_eq!(
        only_problem(|p| sysext(p).mode = Some("0644".into())),
        (Reason::InvalidPlan, "spec.artifacts[0].mode".into())
    );
    assert_eq!(
        only_problem(|p| sysext(p).owner = Some("root:root".into())),
        (Reason::InvalidPlan, "spec.artifacts[0].owner".into())
    );
}

#[test]
fn a_directory_is_a_config_without_a_mode_and_may_bound_its_extraction() {
    let tree = |p: &mut NodeUpdatePlan| {
        let a = &mut p.spec.content.artifacts[1];
        a.kind = ArtifactType::Config;
        a.path = Some("/etc/kubernetes/kubelet.conf.d".into());
        a.directory = true;
        a.owner = Some("root:kubelet".into());
        a.max_extracted_size = Some(1 << 20);
    };
    let mut plan = plan();
    tree(&mut plan);
    plan.validate().unwrap();
    assert!(plan.spec.content.artifacts[1].is_extracted());
    assert_eq!(
        only_problem(|p| {
            tree(p);
            p.spec.content.artifacts[1].mode = Some("0640".into());
        }),
        (Reason::InvalidPlan, "spec.artifacts[1].mode".into())
    );
    assert_eq!(
        only_problem(|p| sysext(p).directory = true),
        (Reason::InvalidPlan, "spec.artifacts[0].directory".into())
    );
    assert_eq!(
        only_problem(|p| {
            tree(p);
            p.spec.content.artifacts[1].directory = false;
        }),
        (
            Reason::InvalidPlan,
            "spec.artifacts[1].maxExtractedSize".into()
        )
    );
}

#[test]
fn a_config_linked_in_var_lib_confexts_is_a_configuration_extension() {
    let mut plan = plan();
    plan.spec
        .content
        .artifacts
        .retain(|a| a.kind == ArtifactType::Binary);
    let artifact = &mut plan.spec.content.artifacts[0];
    artifact.kind = ArtifactType::Config;
    let name_at = |artifact: &mut Artifact, path: &str| {
        artifact.path = Some(path.into());
        artifact.confext_name().map(str::to_owned)
    };
    assert_eq!(
        name_at(artifact, "/var/lib/confexts/kubelet-conf.raw").as_deref(),
        Some("kubelet-conf")
    );
    for not_one in [
        "/var/lib/confexts/kubelet-conf.yaml",
        "/var/lib/confexts/sub/kubelet-conf.raw",
        "/var/lib/confexts/.raw",
        "/var/lib/confexts.raw",
        "/etc/confexts/kubelet-conf.raw",
        "/etc/kubernetes/kubelet.conf",
    ] {
        assert_eq!(name_at(artifact, not_one), None, "{not_one}");
    }
    artifact.path = Some("/var/lib/confexts/kubelet-conf.raw".into());
    plan.validate().unwrap();
    // An image may bring units: reloaded unless the release says otherwise.
    assert!(plan.spec.content.has_confext());
    assert!(plan.spec.content.daemon_reload());
    plan.spec.content.artifacts[0].kind = ArtifactType::Binary;
    assert!(!plan.spec.content.has_confext());
}

#[test]
fn type_specific_fields_are_checked() {
    assert_eq!(
        only_problem(|p| p.spec.content.artifacts[1].path = None),
        (Reason::InvalidPlan, "spec.artifacts[1].path".into())
    );
    assert_eq!(
        only_problem(|p| sysext(p).path = Some("/opt/bin/x".into())),
        (Reason::InvalidPlan, "spec.artifacts[0].path".into())
    );
    assert_eq!(
        only_problem(|p| p.spec.content.artifacts[2].members.clear()),
        (Reason::InvalidPlan, "spec.artifacts[2].members".into())
    );
    assert_eq!(
        only_problem(|p| p.spec.content.artifacts[2].members[0].from = "../../x".into()),
        (
            Reason::InvalidPlan,
            "spec.artifacts[2].members[0].from".into()
        )
    );
    assert_eq!(
        only_problem(|p| {
            p.spec.content.artifacts[1].kind = ArtifactType::Archive;
            p.spec.content.artifacts[1].path = None;
            p.spec.content.artifacts[1].members = vec![ArchiveMember {
                from: "a".into(),
                to: "/opt/bin/kubeadm".into(),
            }];
        }),
        (
            Reason::InvalidPlan,
            "spec.artifacts[2].members[0].to".into()
        )
    );
}

#[test]
fn urls_must_be_http_without_credentials() {
    let path = "spec.artifacts[0].url";
    for bad in [
        "file:///etc/shadow",
        "ftp://x.example/k.raw",
        "https://user:pw@x.example/k.raw",
    ] {
        let bad = bad.to_owned();
        assert_eq!(
            only_problem(|p| sysext(p).url = bad),
            (Reason::PolicyDenied, path.into())
        );
    }
    assert_eq!(
        only_problem(|p| sysext(p).url = "not a url".into()),
        (Reason::InvalidPlan, path.into())
    );
    assert_eq!(
        only_problem(|p| sysext(p).url = "https://x.example/".into()),
        (Reason::InvalidPlan, path.into())
    );
}

#[test]
fn registry_artifacts_are_pinned_by_digest_and_unsigned() {
    let digest = "sha256:".to_owned() + &"ab".repeat(32);
    let mut p = plan();
    sysext(&mut p).url = format!("oci://registry.example:5000/sysext/kubernetes:v1.31@{digest}");
    p.validate()
        .expect("a digest-pinned reference (with a tag as a note) is valid");

    let mut p = plan();
    sysext(&mut p).url = "oci://registry.example/sysext/kubernetes:v1.31".into();
    let problems = p.validate().expect_err("a tag alone is refused");
    assert_eq!(problems.0.len(), 1, "{problems}");
    assert_eq!(problems.0[0].reason, Reason::InvalidPlan);
    assert_eq!(problems.0[0].path, "spec.artifacts[0].url");
    assert!(
        problems.0[0]
            .message
            .contains("tag \"v1.31\" alone does not pin"),
        "{problems}"
    );

    let signed = format!("oci://registry.example/sysext/kubernetes@{digest}");
    assert_eq!(
        only_problem(|p| {
            sysext(p).url = signed;
            sysext(p).signature_url = Some("https://x.example/k.raw.minisig".into());
        }),
        (Reason::InvalidPlan, "spec.artifacts[0].signatureUrl".into())
    );
}

#[test]
fn units_must_be_plain_service_names() {
    for bad in [
        "kubelet",
        "kubelet.socket",
        "../kubelet.service",
        "/etc/systemd/system/kubelet.service",
        ".service",
    ] {
        let bad = bad.to_owned();
        assert_eq!(
            only_problem(|p| p.spec.content.activation.restart_units[0] = bad),
            (
                Reason::PolicyDenied,
                "spec.activation.restartUnits[0]".into()
            )
        );
    }
    assert_eq!(
        only_problem(|p| p.spec.content.health_checks.units[0] = "sshd".into()),
        (Reason::PolicyDenied, "spec.healthChecks.units[0]".into())
    );
}

#[test]
fn health_window_and_timeout_are_consistent() {
    assert_eq!(
        only_problem(|p| p.spec.content.health_checks.window = Duration::parse("2m").unwrap()),
        (Reason::InvalidPlan, "spec.healthChecks.window".into())
    );
    let problems = {
        let mut p = plan();
        p.spec.content.health_checks.timeout = Duration::parse("0s").unwrap();
        p.validate().unwrap_err()
    };
    assert!(problems.has("spec.healthChecks.timeout"), "{problems}");
    assert_eq!(
        only_problem(|p| p.spec.content.kubernetes_version = None),
        (
            Reason::InvalidPlan,
            "spec.healthChecks.nodeKubeletVersion".into()
        )
    );
    assert_eq!(
        only_problem(|p| p.spec.content.health_checks.http = vec![HttpCheck {
            url: "gopher://h/".into()
        }]),
        (Reason::PolicyDenied, "spec.healthChecks.http[0].url".into())
    );
}

#[test]
fn node_name_must_match_the_object_name() {
    assert_eq!(
        only_problem(|p| p.spec.node_name = "worker-2".into()),
        (Reason::InvalidPlan, "spec.nodeName".into())
    );
}

#[test]
fn a_stated_revision_must_match_the_content() {
    let mut good = plan();
    good.spec.revision = Some(revision_of(&good.spec.content));
    good.validate().unwrap();
    assert_eq!(
        only_problem(|p| p.spec.revision = Some("0123456789ab".into())),
        (Reason::InvalidPlan, "spec.revision".into())
    );
}

#[test]
fn every_problem_is_reported_and_invalid_wins_over_denied() {
    let mut p = plan();
    p.spec.content.artifacts[0].sha256 = "nope".into();
    p.spec.content.artifacts[0].url = "file:///x".into();
    p.spec.content.activation.restart_units[0] = "kubelet".into();
    let problems = p.validate().unwrap_err();
    assert_eq!(problems.0.len(), 3, "{problems}");
    assert_eq!(problems.reason(), Reason::InvalidPlan);
    let text = problems.to_string();
    assert!(text.contains("spec.artifacts[0].sha256"), "{text}");
    assert!(text.contains("spec.activation.restartUnits[0]"), "{text}");
}

#[test]
fn signature_urls_must_be_http_without_credentials_and_name_a_file() {
    let mut signed = plan();
    sysext(&mut signed).signature_url =
        Some("https://extensions.example/kubernetes-v1.31.2-x86-64.raw.minisig".into());
    signed.validate().unwrap();
    let path = "spec.artifacts[0].signatureUrl";
    for (bad, reason) in [
        ("not a url", Reason::InvalidPlan),
        ("file:///etc/k.raw.minisig", Reason::PolicyDenied),
        ("https://u:p@x.example/k.raw.minisig", Reason::PolicyDenied),
    ] {
        assert_eq!(
            only_problem(|p| sysext(p).signature_url = Some(bad.into())),
            (reason, path.into()),
            "{bad}"
        );
    }
    // The signature's trusted comment names the artifact's file: its URL must end in one.
    assert_eq!(
        only_problem(|p| {
            let kubectl = &mut p.spec.content.artifacts[1];
            kubectl.url = "https://dl.example/".into();
            kubectl.signature_url = Some("https://dl.example/kubectl.minisig".into());
        }),
        (Reason::InvalidPlan, "spec.artifacts[1].url".into())
    );
}

#[test]
fn allow_downgrade_is_not_content_so_a_stated_revision_still_matches() {
    let mut plan = plan();
    plan.spec.revision = Some(revision_of(&plan.spec.content));
    plan.spec.allow_downgrade = true;
    plan.validate().unwrap();
}

#[test]
fn max_extracted_size_is_for_archives_and_positive() {
    let path = "spec.artifacts[0].maxExtractedSize";
    assert_eq!(
        only_problem(|p| sysext(p).max_extracted_size = Some(1 << 30)),
        (Reason::InvalidPlan, path.into())
    );
    let mut archive = plan();
    let artifact = sysext(&mut archive);
    artifact.kind = inplace_proto::ArtifactType::Archive;
    artifact.members = vec![inplace_proto::ArchiveMember {
        from: "bin/crictl".into(),
        to: "/opt/bin/crictl".into(),
    }];
    artifact.max_extracted_size = Some(1 << 30);
    archive.validate().unwrap();
    assert_eq!(
        only_problem(|p| {
            *p = archive.clone();
            sysext(p).max_extracted_size = Some(0);
        }),
        (Reason::InvalidPlan, path.into())
    );
}
