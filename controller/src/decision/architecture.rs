//! The rollout's architecture preflight, applied to each node's state right after a
//! person's steering (`steer.rs`): a release whose artifacts are built for named
//! architectures (`architecture`, `otherArchitectures`) has no build for a node whose
//! `kubernetes.io/arch` is not among those every such artifact has a build for. The
//! node's agent would refuse the plan (`ArchitectureUnsupported`) and count as failed;
//! instead the rollout passes it over before writing any plan:
//!
//! - it is counted as skipped, never as failed (it halts nothing), and keeps the revision it
//!   runs: its plan is not moved to the rollout's revision (`steer::leaves_plan_alone`), and a
//!   plan its agent already refused stops counting as a failure;
//! - the condition `NodesUnsupported` (True, reason `ArchitectureUnsupported`) names each
//!   node passed over with its architecture, and the architectures the release has;
//! - every other node proceeds. A node without the label is not judged (its agent is).

use inplace_proto::architecture::ARCHITECTURE_LABEL;
use inplace_proto::reason::{Reason, rollout_condition};
use inplace_proto::{Architecture, ConditionUpdate};

use super::{NodeState, NodeView, RolloutInput};

/// How many nodes the condition's message names; the rest are counted.
const NAMED: usize = 10;

/// Whether the release has no build for `node`'s architecture: `release` is what
/// [`inplace_proto::UpdateContent::architectures`] says of it (`None`: every architecture).
/// A label Kubernetes' names do not include has no build either.
pub(super) fn unsupported(release: Option<&[Architecture]>, node: &NodeView) -> bool {
    let (Some(release), Some(label)) = (release, node.architecture.as_deref()) else {
        return false;
    };
    Architecture::parse(label).is_none_or(|a| !release.contains(&a))
}

/// Passes `node` over when the release has no build for it: a node that would be staged,
/// waits for a slot or failed becomes skipped. One that already runs the revision, or is in
/// the middle of a disruptive step, is left to finish as it is.
pub(super) fn pass_over(input: &RolloutInput<'_>, node: &NodeView, state: &mut NodeState) {
    if matches!(
        state,
        NodeState::Pending | NodeState::Staged | NodeState::Failed { .. }
    ) && unsupported(input.architectures.as_deref(), node)
    {
        *state = NodeState::Skipped;
    }
}

/// The `NodesUnsupported` condition: True, naming the owned nodes passed over for their
/// architecture (skipped and unsupported), and the architectures the release has.
pub(super) fn unsupported_condition(
    input: &RolloutInput<'_>,
    owned: &[&NodeView],
    states: &[NodeState],
) -> ConditionUpdate {
    let release = input.architectures.as_deref();
    let passed_over: Vec<String> = owned
        .iter()
        .zip(states)
        .filter(|(node, state)| **state == NodeState::Skipped && unsupported(release, node))
        .map(|(node, _)| {
            let label = node.architecture.as_deref().unwrap_or_default();
            format!("{} ({label})", node.name)
        })
        .collect();
    let Some(release) = release.filter(|_| !passed_over.is_empty()) else {
        return ConditionUpdate::new(
            rollout_condition::NODES_UNSUPPORTED,
            false,
            Reason::AsExpected,
            "",
        );
    };
    let builds: Vec<&str> = release.iter().map(|a| a.as_str()).collect();
    let builds = if builds.is_empty() {
        "no architecture every artifact is built for".to_owned()
    } else {
        builds.join(", ")
    };
    let mut named = passed_over[..passed_over.len().min(NAMED)].join(", ");
    if passed_over.len() > NAMED {
        named.push_str(&format!(" and {} more", passed_over.len() - NAMED));
    }
    ConditionUpdate::new(
        rollout_condition::NODES_UNSUPPORTED,
        true,
        Reason::ArchitectureUnsupported,
        format!(
            "{} selected nodes passed over, the release has no build for their {ARCHITECTURE_LABEL} \
             (release {:?} is built for {builds}): {named}; they keep the revision they run \
             and are counted as skipped",
            passed_over.len(),
            input.spec.release,
        ),
    )
}
