//! The architecture preflight: a node whose `kubernetes.io/arch` has no build in the release
//! is passed over (skipped, never failed), named in `NodesUnsupported`, and the others
//! proceed.

use super::*;
use inplace_proto::Architecture;

fn on(architecture: &str, mut n: NodeView) -> NodeView {
    n.architecture = Some(architecture.into());
    n
}

/// A release built for amd64 and arm64 (`UpdateContent::architectures`).
fn mixed<'a>(s: &'a NodeRolloutSpec, nodes: Vec<NodeView>) -> RolloutInput<'a> {
    RolloutInput {
        architectures: Some(vec![Architecture::Amd64, Architecture::Arm64]),
        ..input(s, nodes)
    }
}

fn unsupported(d: &Decision) -> (String, String, String) {
    let c = condition(d, "NodesUnsupported");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

#[test]
fn a_node_without_a_build_for_its_architecture_gets_no_plan_and_the_others_proceed() {
    let s = spec(IntOrString::Int(5), 0);
    let nodes = vec![
        on("amd64", node("a")),
        on("arm64", node("b")),
        on("riscv64", node("r")),
        // A label Kubernetes' names do not include has no build either.
        on("mips64le", node("m")),
        // A node without the label is its agent's to judge.
        node("u"),
    ];
    let d = decide(&mixed(&s, nodes));
    let written: Vec<&str> = applies(&d).iter().map(|(n, _)| *n).collect();
    assert_eq!(written, ["a", "b", "u"]);
    assert_eq!(
        (
            d.status.nodes.total,
            d.status.nodes.pending,
            d.status.nodes.skipped
        ),
        (5, 3, 2)
    );
    assert_eq!(d.status.nodes.failed, 0);
    assert_eq!(d.status.skipped_nodes, ["m", "r"]);
    let (status, reason, message) = unsupported(&d);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ArchitectureUnsupported")
    );
    assert_eq!(
        message,
        "2 selected nodes passed over, the release has no build for their kubernetes.io/arch \
         (release \"rel\" is built for amd64, arm64): m (mips64le), r (riscv64); they keep the \
         revision they run and are counted as skipped"
    );
    assert!(has_event(&d, "ArchitectureUnsupported"));
    assert!(!has_event(&d, "NodeSkipped"), "{:?}", d.events);
    assert_eq!(condition(&d, "Progressing").status, "True");
}

#[test]
fn a_node_its_agent_refused_for_its_architecture_halts_nothing() {
    // Plans written before the preflight (or by an older controller): the agent refused.
    let mut refused = on("riscv64", node("r"));
    let mut report = report(Phase::Failed, REV, Some(OLD));
    report.reason = Some("ArchitectureUnsupported".into());
    refused.plan = Some(plan(DesiredState::Staged, report));
    let s = spec(IntOrString::Int(1), 0);
    let d = decide(&mixed(&s, vec![on("amd64", staged(node("a"))), refused]));
    assert_eq!(granted(&d), ["a"]);
    assert_eq!((d.status.nodes.failed, d.status.nodes.skipped), (0, 1));
    assert!(d.status.failed_nodes.is_empty());
    assert_eq!(condition(&d, "Halted").status, "False");
    assert_eq!(unsupported(&d).0, "True");
}

#[test]
fn a_rollout_whose_other_nodes_all_run_the_release_is_complete() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = vec![
        on("amd64", succeeded(node("a"))),
        on("arm64", succeeded(node("b"))),
        on("s390x", node("z")),
    ];
    let d = decide(&mixed(&s, nodes));
    let complete = condition(&d, "Complete");
    assert_eq!(
        (complete.status.as_str(), complete.reason.as_str()),
        ("True", "AllNodesUpdated")
    );
    assert!(
        complete
            .message
            .contains("1 skipped nodes keep the revision they run"),
        "{}",
        complete.message
    );
    assert!(applies(&d).iter().all(|(n, _)| *n != "z"));
}

#[test]
fn a_release_that_serves_every_architecture_passes_no_node_over() {
    let s = spec(IntOrString::Int(2), 0);
    let nodes = vec![on("riscv64", node("r")), on("amd64", node("a"))];
    let d = decide(&input(&s, nodes));
    assert_eq!(applies(&d).len(), 2);
    let (status, reason, message) = unsupported(&d);
    assert_eq!(
        (status.as_str(), reason.as_str(), message.as_str()),
        ("False", "AsExpected", "")
    );
    assert_eq!(d.status.nodes.skipped, 0);
}

#[test]
fn a_node_that_already_runs_the_revision_stays_succeeded() {
    // Its label says riscv64, yet its agent took the revision: what it reports wins.
    let s = spec(IntOrString::Int(1), 0);
    let d = decide(&mixed(&s, vec![on("riscv64", succeeded(node("r")))]));
    assert_eq!((d.status.nodes.succeeded, d.status.nodes.skipped), (1, 0));
    assert_eq!(unsupported(&d).0, "False");
}

#[test]
fn the_condition_names_ten_nodes_and_counts_the_rest() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes: Vec<NodeView> = (0..12)
        .map(|i| on("riscv64", node(&format!("r{i:02}"))))
        .collect();
    let d = decide(&mixed(&s, nodes));
    let message = unsupported(&d).2;
    assert!(
        message.starts_with("12 selected nodes passed over"),
        "{message}"
    );
    assert!(message.contains("r09 (riscv64) and 2 more;"), "{message}");
    assert!(!message.contains("r10"), "{message}");
}

#[test]
fn a_rollout_that_touches_nothing_reports_no_node_passed_over() {
    let s = spec(IntOrString::Int(1), 0);
    let d = decide(&RolloutInput {
        release: ReleaseState::Missing,
        ..mixed(&s, vec![on("riscv64", node("r"))])
    });
    assert_eq!(unsupported(&d).0, "False");
    assert!(d.actions.is_empty());
}
