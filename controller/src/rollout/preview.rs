//! A rollout's preview (`kubectl inplace preview -f rollout.yaml`): what the controller would
//! do with a NodeRollout, from the objects the cluster holds now, with nothing written and
//! nothing downloaded. No second decision engine: the preview builds the nodes' views as a
//! round does (`rollout::view::ViewBuilder`) and runs the rollout's own decision
//! ([`decide`]) round after round on a copy of the fleet in memory, carrying out each
//! round's writes on the copy and letting every agent answer at once (staged, then updated)
//! — so the waves it shows follow every rule the controller applies (slots, control plane
//! first, topology groups, holds, skips, others' disruption, windows, soaks, the skew
//! guard). Time only moves when a round waits (a window that opens, a soak): each wave's
//! time is the earliest it could start, not a forecast of how long nodes take.

use std::collections::HashMap;
use std::sync::Arc;

use inplace_proto::reason::Reason;
use inplace_proto::rollout_slots::activation_slots;
use inplace_proto::{DesiredState, NodeRelease, NodeRollout, NodeUpdatePlan, Phase};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::decision::{
    AlertObservation, Decision, DrainProgress, KubernetesVersions, NodeAction, NodeOrder, NodeView,
    Ownership, PlanReport, PlanView, ReleaseState, RolloutInput, activation_order, decide,
    needs_drain_pass,
};
use crate::error::Result;
use crate::rollout::controller::{release_architectures, release_state};
use crate::rollout::plans::{plan_owner, plan_view};
use crate::rollout::view::{ViewBuilder, rollouts_by_age};

/// What the preview reads: objects listed from the cluster, and the time.
#[derive(Debug, Clone)]
pub struct Cluster<'a> {
    /// Every Node.
    pub nodes: &'a [Node],
    /// Every NodeUpdatePlan.
    pub plans: &'a [NodeUpdatePlan],
    /// Every NodeRollout in the cluster (the previewed one among them or not).
    pub rollouts: &'a [NodeRollout],
    /// The NodeRelease the rollout names, if it exists.
    pub release: Option<&'a NodeRelease>,
    /// The API server's `/version`, when [`crate::decision::asks_api_server`] says the skew
    /// guard needs it.
    pub api_server_version: Option<String>,
    /// The time the preview starts at.
    pub now: Timestamp,
}

/// One node the rollout would update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePreview {
    /// The node.
    pub name: String,
    /// Whether it is a control-plane node (those go first, one at a time).
    pub control_plane: bool,
    /// Its group under `maxUnavailablePerTopology` (empty: no spread, or no label).
    pub topology: String,
    /// At most this many bytes to download: `None` when a release artifact gives no size.
    /// 0 for a node that has the revision staged or runs it already, or that is skipped.
    pub download: Option<u64>,
    /// The wave (1, 2, …) in which it would be granted a slot; `None`: not in this preview.
    pub wave: Option<usize>,
}

/// The slots granted at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    /// When, at the earliest.
    pub at: Timestamp,
    /// The nodes granted a slot.
    pub nodes: Vec<String>,
}

/// What the preview found.
#[derive(Debug, Clone, PartialEq)]
pub struct Preview {
    /// The first round's decision as the controller would take it now: its status holds the
    /// conditions (a refusal, a closed window, a pause), held, skipped nodes and the
    /// disruption others cause.
    pub first: Decision,
    /// The rollout's nodes, in activation order.
    pub nodes: Vec<NodePreview>,
    /// Selected nodes another rollout (or a person's plan) owns, and by whom.
    pub refused: Vec<(String, String)>,
    /// `maxUnavailable` as slots for this many nodes.
    pub slots: usize,
    /// The waves of grants, in order.
    pub waves: Vec<Wave>,
    /// The skew guard's refusal (its reason and message), if it refuses the release.
    pub skew_refusal: Option<(Reason, String)>,
}

/// The preview of `rollout` (as read from a file: not yet, or differently, in the cluster).
pub fn preview(rollout: &NodeRollout, cluster: &Cluster<'_>) -> Result<Preview> {
    let rollout = as_applied(rollout, cluster);
    let release = release_state(cluster.release);
    let mut nodes = node_views(&rollout, cluster)?;
    nodes.sort_by(activation_order);
    let versions = KubernetesVersions {
        release: cluster
            .release
            .and_then(|r| r.spec.content.kubernetes_version.clone()),
        api_server: cluster.api_server_version.clone(),
    };
    let name = rollout.name_any();
    let input = RolloutInput {
        name: &name,
        generation: rollout.metadata.generation,
        spec: &rollout.spec,
        previous: None,
        release: release.clone(),
        architectures: release_architectures(&release, cluster.release),
        nodes,
        order: NodeOrder::Activation,
        // Prometheus is the controller's to ask: the preview leaves alert gates open.
        alerts: AlertObservation::NotAsked,
        versions,
        kured: None,
        now: cluster.now,
    };
    let first = decide(&input);
    let waves = match &release {
        ReleaseState::Valid { revision } => simulate(input.clone(), revision),
        _ => Vec::new(),
    };
    let wave_of: HashMap<&str, usize> = waves
        .iter()
        .enumerate()
        .flat_map(|(i, w)| w.nodes.iter().map(move |n| (n.as_str(), i + 1)))
        .collect();
    let owned: Vec<&NodeView> = input
        .nodes
        .iter()
        .filter(|n| n.ownership == Ownership::Ours)
        .collect();
    let revision = match &release {
        ReleaseState::Valid { revision } => Some(revision.as_ref()),
        _ => None,
    };
    let nodes = owned
        .iter()
        .map(|n| NodePreview {
            name: n.name.clone(),
            control_plane: n.control_plane,
            topology: n.topology.clone(),
            download: download(cluster.release, revision, n),
            wave: wave_of.get(n.name.as_str()).copied(),
        })
        .collect();
    let refused = input
        .nodes
        .iter()
        .filter_map(|n| match &n.ownership {
            Ownership::Other { owner } => Some((n.name.clone(), owner.clone())),
            Ownership::Ours => None,
        })
        .collect();
    let skew_refusal =
        first
            .status
            .conditions
            .iter()
            .find_map(|c| match Reason::parse(&c.reason) {
                Some(r @ (Reason::VersionSkewDenied | Reason::DowngradeDenied)) => {
                    Some((r, c.message.clone()))
                }
                _ => None,
            });
    Ok(Preview {
        slots: activation_slots(&rollout.spec.max_unavailable, owned.len()),
        first,
        nodes,
        refused,
        waves,
        skew_refusal,
    })
}

/// The rollout as the cluster would hold it once applied: oldest rollouts claim nodes
/// first, so a new one is the youngest and an existing one keeps its age.
fn as_applied(rollout: &NodeRollout, cluster: &Cluster<'_>) -> NodeRollout {
    let mut applied = rollout.clone();
    let name = rollout.name_any();
    let existing = cluster.rollouts.iter().find(|r| r.name_any() == name);
    applied.metadata.creation_timestamp = existing
        .and_then(|r| r.metadata.creation_timestamp.clone())
        .or(Some(Time(cluster.now)));
    applied.metadata.uid = existing.and_then(|r| r.metadata.uid.clone());
    applied
}

/// Every selected node's view, built as a round builds it.
fn node_views(rollout: &NodeRollout, cluster: &Cluster<'_>) -> Result<Vec<NodeView>> {
    let name = rollout.name_any();
    let others = cluster.rollouts.iter().filter(|r| r.name_any() != name);
    let by_age = rollouts_by_age(others.chain(std::iter::once(rollout)));
    let builder = ViewBuilder::new(rollout, &by_age)?;
    let plans: HashMap<String, &NodeUpdatePlan> =
        cluster.plans.iter().map(|p| (p.name_any(), p)).collect();
    let mut views = Vec::new();
    for node in cluster.nodes.iter().filter(|n| builder.selects(n)) {
        let plan = plans.get(&node.name_any()).copied();
        let label = plan.and_then(plan_owner).map(str::to_owned);
        let (view, _uid) = builder.view(node, plan.map(plan_view), label)?;
        views.push(view);
    }
    Ok(views)
}

/// At most how many bytes the node would download: nothing once it has the revision staged
/// or runs it, or when a person skips it; else every artifact's size (`None` when one gives
/// none).
fn download(release: Option<&NodeRelease>, revision: Option<&str>, node: &NodeView) -> Option<u64> {
    let has_it = node.plan.as_ref().is_some_and(|p| {
        let report = &p.report;
        report.current_revision.as_deref() == revision
            || (report.target_revision.as_deref() == revision
                && report
                    .phase
                    .is_some_and(|phase| phase != Phase::Downloading))
    });
    if has_it || revision.is_none() || node.steering.skip {
        return Some(0);
    }
    let content = &release?.spec.content;
    let agent = content.agent.iter().map(|a| a.size);
    content
        .artifacts
        .iter()
        .map(|a| a.size)
        .chain(agent)
        .sum::<Option<u64>>()
}

/// The rounds a rollout would go through, on a copy of its nodes: each round's writes
/// carried out on the copy, every agent answering at once. Stops when a round changes
/// nothing and asks to be looked at no later, or after a bound of rounds.
fn simulate(mut input: RolloutInput<'_>, revision: &Arc<str>) -> Vec<Wave> {
    let mut waves: Vec<Wave> = Vec::new();
    let bound = 4 * input.nodes.len() + 20;
    for _ in 0..bound {
        for node in &mut input.nodes {
            node.drain =
                needs_drain_pass(input.spec, &input.release, node).then(DrainProgress::default);
        }
        let decision = decide(&input);
        let granted = carry_out(&mut input.nodes, &decision.actions);
        if !granted.is_empty() {
            waves.push(Wave {
                at: input.now,
                nodes: granted,
            });
        }
        let answered = agents_answer(&mut input.nodes, revision);
        if decision.actions.is_empty() && !answered {
            // Nothing happens until the round asks to look again (a window, a soak).
            let Some(after) = decision.requeue_after.filter(|d| !d.is_zero()) else {
                break;
            };
            let Ok(later) = input.now.checked_add(after) else {
                break;
            };
            input.now = later;
        }
    }
    waves
}

/// Applies a round's writes to the nodes' views; the nodes it granted a slot.
fn carry_out(nodes: &mut [NodeView], actions: &[NodeAction]) -> Vec<String> {
    let mut granted = Vec::new();
    for action in actions {
        let Some(node) = nodes.iter_mut().find(|n| n.name == action.node()) else {
            continue;
        };
        match action {
            NodeAction::ApplyPlan { intent, .. } => {
                let was_granted = node
                    .plan
                    .as_ref()
                    .is_some_and(|p| p.intent.granted_at.is_some());
                if intent.granted_at.is_some() && !was_granted {
                    granted.push(node.name.clone());
                }
                let report = node.plan.take().map(|p| p.report).unwrap_or_default();
                node.plan = Some(PlanView {
                    report,
                    ..PlanView::written(intent)
                });
            }
            NodeAction::Cordon { .. } => node.unschedulable = true,
            NodeAction::Uncordon { .. } => node.unschedulable = false,
            NodeAction::DisableScaleDown { .. } | NodeAction::RestoreScaleDown { .. } => {}
        }
    }
    granted
}

/// Every agent answers its plan at once: a staged plan is staged, an active one succeeds.
/// Whether any report changed.
fn agents_answer(nodes: &mut [NodeView], revision: &Arc<str>) -> bool {
    let mut changed = false;
    for node in nodes.iter_mut().filter(|n| n.ownership == Ownership::Ours) {
        let Some(plan) = node.plan.as_mut() else {
            continue;
        };
        if plan.intent.revision != *revision {
            continue;
        }
        let report = match plan.intent.desired_state {
            DesiredState::Active => PlanReport {
                phase: Some(Phase::Succeeded),
                target_revision: Some(Arc::clone(revision)),
                current_revision: Some(Arc::clone(revision)),
                ..PlanReport::default()
            },
            _ => PlanReport {
                phase: Some(Phase::Staged),
                target_revision: Some(Arc::clone(revision)),
                current_revision: plan.report.current_revision.clone(),
                ..PlanReport::default()
            },
        };
        if plan.report != report {
            plan.report = report;
            changed = true;
        }
    }
    changed
}

#[cfg(test)]
mod tests;
