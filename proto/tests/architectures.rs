//! One release for a mixed fleet: an artifact built for several architectures, each node
//! taking its own build (`architecture`, `otherArchitectures`), and the bad forms refused
//! with the field that is wrong.

use inplace_proto::{Architecture, NodeUpdatePlan, Reason};
use inplace_strict_yaml::object_from_yaml;

const PLAN: &str = r#"
apiVersion: inplace.dev/v1alpha1
kind: NodeUpdatePlan
metadata: {name: worker-1}
spec:
  nodeName: worker-1
  desiredState: Active
  artifacts:
  - name: kubernetes
    type: Sysext
    url: https://extensions.example/kubernetes-v1.36.3-x86-64.raw
    sha256: a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1
    size: 1024
    architecture: amd64
    otherArchitectures:
    - architecture: arm64
      url: https://extensions.example/kubernetes-v1.36.3-arm64.raw
      sha256: b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2
      size: 2048
  - name: node-config
    type: Config
    url: https://dl.example/50-pods.conf
    sha256: c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3
    path: /etc/kubernetes/kubelet.conf.d/50-pods.conf
  activation: {restartUnits: [kubelet.service]}
"#;

fn plan() -> NodeUpdatePlan {
    object_from_yaml(PLAN).expect("the mixed-fleet plan parses")
}

/// The problems of `plan` after `change`, as (reason, path).
fn problems(change: impl FnOnce(&mut NodeUpdatePlan)) -> Vec<(Reason, String)> {
    let mut plan = plan();
    change(&mut plan);
    match plan.validate() {
        Ok(()) => Vec::new(),
        Err(problems) => problems.0.into_iter().map(|p| (p.reason, p.path)).collect(),
    }
}

#[test]
fn each_architecture_takes_its_own_build_and_the_shared_file() {
    let plan = plan();
    plan.validate().unwrap();
    let amd64 = plan
        .spec
        .content
        .for_architecture(Some(Architecture::Amd64), "spec")
        .unwrap();
    let arm64 = plan
        .spec
        .content
        .for_architecture(Some(Architecture::Arm64), "spec")
        .unwrap();

    let (x86, arm) = (&amd64.artifacts[0], &arm64.artifacts[0]);
    assert_eq!(x86.url, plan.spec.content.artifacts[0].url);
    assert_eq!(x86.size, Some(1024));
    assert!(arm.url.ends_with("-arm64.raw"), "{}", arm.url);
    assert!(arm.sha256.starts_with("b2b2"), "{}", arm.sha256);
    assert_eq!(arm.size, Some(2048));
    assert_eq!(arm.architecture, Some(Architecture::Arm64));
    for narrowed in [x86, arm] {
        assert_eq!(narrowed.name, "kubernetes");
        assert!(narrowed.other_architectures.is_empty());
    }
    // The configuration file has no architecture: every node takes it as it is.
    assert_eq!(amd64.artifacts[1], plan.spec.content.artifacts[1]);
    assert_eq!(arm64.artifacts[1], plan.spec.content.artifacts[1]);
    // The rest of the content is the plan's.
    assert_eq!(arm64.activation, plan.spec.content.activation);
    // A narrowed content is valid on its own.
    let mut narrowed = plan.clone();
    narrowed.spec.content = arm64;
    narrowed.spec.revision = None;
    narrowed.validate().unwrap();
}

#[test]
fn a_node_whose_architecture_has_no_build_is_told_which_there_are() {
    let problems = plan()
        .spec
        .content
        .for_architecture(Some(Architecture::Riscv64), "spec")
        .expect_err("riscv64 has no build of the kubernetes image");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].reason, Reason::ArchitectureUnsupported);
    assert_eq!(problems[0].path, "spec.artifacts[0]");
    assert_eq!(
        problems[0].message,
        "artifact kubernetes has no build for this node's architecture riscv64 (it has amd64, arm64)"
    );
}

#[test]
fn builds_for_other_architectures_need_the_first_ones_and_differ_from_it() {
    assert_eq!(
        problems(|p| p.spec.content.artifacts[0].architecture = None),
        [(
            Reason::InvalidPlan,
            "spec.artifacts[0].architecture".to_owned()
        )]
    );
    assert_eq!(
        problems(
            |p| p.spec.content.artifacts[0].other_architectures[0].architecture =
                Architecture::Amd64
        ),
        [(
            Reason::InvalidPlan,
            "spec.artifacts[0].otherArchitectures[0].architecture".to_owned()
        )]
    );
}

#[test]
fn each_build_is_checked_as_the_artifacts_own_file() {
    assert_eq!(
        problems(|p| p.spec.content.artifacts[0].other_architectures[0].sha256 = "B2".into()),
        [(
            Reason::InvalidPlan,
            "spec.artifacts[0].otherArchitectures[0].sha256".to_owned()
        )]
    );
    assert_eq!(
        problems(|p| p.spec.content.artifacts[0].other_architectures[0].url =
            "ftp://extensions.example/kubernetes.raw".into()),
        [(
            Reason::PolicyDenied,
            "spec.artifacts[0].otherArchitectures[0].url".to_owned()
        )]
    );
    assert_eq!(
        problems(|p| p.spec.content.artifacts[0].other_architectures[0].size = Some(0)),
        [(
            Reason::InvalidPlan,
            "spec.artifacts[0].otherArchitectures[0].size".to_owned()
        )]
    );
}

#[test]
fn an_architecture_is_named_as_kubernetes_names_it() {
    let text = PLAN.replace("architecture: arm64", "architecture: aarch64");
    let error = object_from_yaml::<NodeUpdatePlan>(&text)
        .expect_err("aarch64 is not a Kubernetes architecture name");
    assert!(error.to_string().contains("aarch64"), "{error}");
    assert_eq!(Architecture::parse("arm64"), Some(Architecture::Arm64));
    let expected = match std::env::consts::ARCH {
        "x86_64" => Some(Architecture::Amd64),
        "aarch64" => Some(Architecture::Arm64),
        _ => Architecture::of_this_build(),
    };
    assert_eq!(Architecture::of_this_build(), expected);
}

#[test]
fn a_release_names_the_architectures_every_artifact_has_a_build_for() {
    let content = plan().spec.content;
    assert_eq!(
        content.architectures(),
        Some(vec![Architecture::Amd64, Architecture::Arm64])
    );
    // A second artifact built for amd64 alone narrows the release to amd64.
    let mut narrower = content.clone();
    let mut amd64_only = narrower.artifacts[0].clone();
    amd64_only.name = "kernel".into();
    amd64_only.other_architectures.clear();
    narrower.artifacts.push(amd64_only);
    assert_eq!(narrower.architectures(), Some(vec![Architecture::Amd64]));
    for architecture in Architecture::ALL {
        let takes = narrower
            .for_architecture(Some(architecture), "spec")
            .is_ok();
        assert_eq!(takes, architecture == Architecture::Amd64, "{architecture}");
    }
    // Artifacts without an architecture serve every node.
    let mut shared = content;
    shared.artifacts.remove(0);
    assert_eq!(shared.architectures(), None);
}
