//! The NodeRollout controller: gathers the decision's inputs from the watch caches (never
//! listing nodes or plans from the API), runs the drain passes the decision needs, calls
//! [`decide`], and carries out what it returns: plan applies, cordons, uncordons, the
//! rollout's status and its Events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt, stream};
use inplace_proto::{
    NodeRelease, NodeRollout, NodeRolloutSpec, NodeRolloutStatus, NodeUpdatePlan, Steering,
    revision_of,
};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::context::Context;
use crate::decision::{
    CONTROL_PLANE_LABEL, Decision, EventKind, EventNote, NodeAction, NodeView, ReleaseState,
    RolloutInput, decide, needs_drain_pass, resolve_ownership,
};
use crate::error::{Error, Result};
use crate::plans::{FIELD_MANAGER, PlanSource, plan_apply_body, plan_owner};
use crate::release_controller::truncate;
use crate::teardown::{
    TEARDOWN_RETRY, TeardownAction, TeardownNode, UNCORDON_FINALIZER, decide_teardown,
};
use inplace_drain::{cordon, drain_pass};

/// The controller's name in metrics.
pub const CONTROLLER: &str = "rollout";

/// How many drain passes one reconcile runs at once.
const DRAIN_CONCURRENCY: usize = 8;

/// The release a rollout names, as the decision sees it.
pub fn release_state(release: Option<&NodeRelease>) -> ReleaseState {
    match release {
        None => ReleaseState::Missing,
        Some(release) => match release.validate() {
            Err(problems) => ReleaseState::Invalid {
                message: problems.to_string(),
            },
            Ok(()) => ReleaseState::Valid {
                revision: revision_of(&release.spec.content),
            },
        },
    }
}

/// Every rollout with its selector, oldest first (ties by name): the order in which
/// rollouts claim nodes nobody owns yet.
fn rollouts_by_age(rollouts: &Store<NodeRollout>) -> Vec<(String, Selector)> {
    let mut all: Vec<(Option<Timestamp>, String, Selector)> = rollouts
        .state()
        .iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .filter_map(|r| {
            let selector = Selector::try_from(r.spec.node_selector.clone()).ok()?;
            Some((
                r.metadata.creation_timestamp.as_ref().map(|t| t.0),
                r.name_any(),
                selector,
            ))
        })
        .collect();
    all.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    all.into_iter().map(|(_, name, s)| (name, s)).collect()
}

/// The rollouts a change of `node` concerns: those selecting it, and the owner of its plan.
pub fn rollouts_for_node(
    rollouts: &Store<NodeRollout>,
    plans: &Store<NodeUpdatePlan>,
    node: &Node,
) -> Vec<ObjectRef<NodeRollout>> {
    let labels = node.labels();
    let mut names: BTreeSet<String> = rollouts
        .state()
        .iter()
        .filter(|r| {
            Selector::try_from(r.spec.node_selector.clone()).is_ok_and(|s| s.matches(labels))
        })
        .map(|r| r.name_any())
        .collect();
    if let Some(plan) = plans.get(&ObjectRef::new(&node.name_any()))
        && let Some(owner) = plan_owner(&plan)
    {
        names.insert(owner.to_owned());
    }
    names.iter().map(|n| ObjectRef::new(n)).collect()
}

/// The rollouts that name `release`.
pub fn rollouts_for_release(
    rollouts: &Store<NodeRollout>,
    release: &NodeRelease,
) -> Vec<ObjectRef<NodeRollout>> {
    let name = release.name_any();
    rollouts
        .state()
        .iter()
        .filter(|r| r.spec.release == name)
        .map(|r| ObjectRef::from_obj(r.as_ref()))
        .collect()
}

/// Reconciles one rollout. kube's [`finalizer`] adds [`UNCORDON_FINALIZER`] to a new
/// rollout (guarded by a JSON patch test of the list it read) and, once the rollout is
/// deleted, removes it only after [`tear_down`] succeeds; a teardown still waiting for an
/// activation fails with [`Error::TeardownWaiting`] so the finalizer stays.
pub async fn reconcile(rollout: Arc<NodeRollout>, ctx: Arc<Context>) -> Result<Action> {
    // An empty cache would look like "no nodes": wait for the first full list.
    let _ = ctx.nodes.wait_until_ready().await;
    let _ = ctx.plans.wait_until_ready().await;
    let _ = ctx.releases.wait_until_ready().await;

    let name = rollout.name_any();
    let api: Api<NodeRollout> = Api::all(ctx.client.clone());
    let adds_finalizer = rollout.metadata.deletion_timestamp.is_none()
        && !rollout.finalizers().iter().any(|f| f == UNCORDON_FINALIZER);
    if adds_finalizer {
        ctx.metrics.wrote("rollout_finalizer");
    }
    if rollout.metadata.deletion_timestamp.is_some()
        && !rollout.finalizers().iter().any(|f| f == UNCORDON_FINALIZER)
    {
        // Deleted without the finalizer (someone removed it): nothing to undo.
        forget(&name, &ctx);
    }
    let done = finalizer(&api, UNCORDON_FINALIZER, rollout, |event| async {
        match event {
            finalizer::Event::Apply(rollout) => apply(&rollout, &ctx).await,
            finalizer::Event::Cleanup(rollout) => tear_down(&rollout, &ctx).await,
        }
    })
    .await;
    match done {
        Ok(action) => Ok(action),
        Err(finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e)) => Err(e),
        Err(finalizer::Error::AddFinalizer(source)) => Err(Error::Kube {
            action: format!("adding the finalizer of rollout {name}"),
            source,
        }),
        // A reconcile queued before the removal, from a cache that had not seen it yet.
        Err(finalizer::Error::RemoveFinalizer(kube::Error::Api(status)))
            if status.is_not_found() =>
        {
            Ok(Action::await_change())
        }
        Err(finalizer::Error::RemoveFinalizer(source)) => Err(Error::Kube {
            action: format!("removing the finalizer of rollout {name}"),
            source,
        }),
        Err(finalizer::Error::UnnamedObject | finalizer::Error::InvalidFinalizer) => {
            Err(Error::MissingField {
                kind: "NodeRollout",
                field: "metadata.name",
            })
        }
    }
}

/// Reconciles a rollout that carries the finalizer and is not being deleted.
async fn apply(rollout: &NodeRollout, ctx: &Context) -> Result<Action> {
    let started = Instant::now();
    let name = rollout.name_any();
    let release = ctx.releases.get(&ObjectRef::new(&rollout.spec.release));
    let release_state = release_state(release.as_deref());
    let (input_nodes, uids) = gather_nodes(rollout, ctx)?;
    let previous = ctx.last_status(&name).or_else(|| rollout.status.clone());
    let mut input = RolloutInput {
        name: &name,
        generation: rollout.metadata.generation,
        spec: &rollout.spec,
        previous: previous.as_ref(),
        release: release_state,
        nodes: input_nodes,
        now: Timestamp::now(),
    };
    run_drain_passes(&mut input, ctx).await?;
    let decision = decide(&input);
    let now = input.now;
    drop(input);

    if let Some(release) = &release {
        carry_out(&name, release, &uids, &decision, ctx).await?;
    }
    publish_events(rollout, &decision.events, ctx).await;
    if previous.as_ref() != Some(&decision.status) {
        write_status(&name, &decision.status, ctx).await?;
    }
    ctx.remember_status(&name, decision.status.clone());
    ctx.metrics.rollout_counts(&name, &decision.status.nodes);
    ctx.metrics.reconciled(CONTROLLER, started.elapsed());
    tracing::debug!(
        rollout = %name,
        actions = decision.actions.len(),
        took_ms = started.elapsed().as_millis() as u64,
        %now,
        "reconciled"
    );
    // A wake-up days away (the next maintenance window) never stretches the resync.
    Ok(Action::requeue(
        decision
            .requeue_after
            .map_or(ctx.settings.resync, |after| after.min(ctx.settings.resync)),
    ))
}

/// A deleted rollout: undoes its own cordons ([`decide_teardown`]); once none waits for
/// an activation, forgets it and lets [`finalizer`] remove the finalizer.
async fn tear_down(rollout: &NodeRollout, ctx: &Context) -> Result<Action> {
    let name = rollout.name_any();
    let nodes: Vec<TeardownNode> = ctx
        .plans
        .state()
        .iter()
        .filter(|plan| plan_owner(plan) == Some(name.as_str()))
        .filter_map(|cached| {
            let node_name = cached.name_any();
            let plan = ctx.writes.view(&node_name, Some(cached))?;
            let unschedulable = ctx
                .nodes
                .get(&ObjectRef::new(&node_name))
                .map(|node| unschedulable(&node));
            Some(TeardownNode {
                name: node_name,
                unschedulable,
                plan,
            })
        })
        .collect();
    let teardown = decide_teardown(
        &nodes,
        rollout.spec.progress_deadline.as_ref(),
        Timestamp::now(),
    );
    // A node's writes in order (uncordon, then forget); nodes in parallel.
    let groups = by_node(teardown.actions.iter().cloned(), TeardownAction::node);
    let written = run_per_node(groups, ctx, |action| async move {
        match action {
            TeardownAction::Uncordon { node } => set_unschedulable(&node, false, ctx).await,
            TeardownAction::ForgetCordon { node } => forget_cordon(&node, ctx).await,
        }
    })
    .await;
    publish_events(rollout, &teardown.events, ctx).await;
    written?;
    if !teardown.finished() {
        return Err(Error::TeardownWaiting {
            nodes: teardown.waiting,
        });
    }
    ctx.metrics.wrote("rollout_finalizer");
    forget(&name, ctx);
    Ok(Action::await_change())
}

fn forget(rollout: &str, ctx: &Context) {
    ctx.metrics.forget_rollout(rollout);
    ctx.forget_status(rollout);
}

/// A node's group under `maxUnavailablePerTopology`: its value of the key's label; a node
/// without the label belongs to the empty value's group.
fn topology_group(spec: &NodeRolloutSpec, labels: &BTreeMap<String, String>) -> String {
    spec.max_unavailable_per_topology
        .as_ref()
        .and_then(|spread| labels.get(&spread.key))
        .cloned()
        .unwrap_or_default()
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Removes the controller's cordon record from a plan (the annotation was applied by the
/// controller's field manager, so its own merge patch may drop it).
async fn forget_cordon(node: &str, ctx: &Context) -> Result<()> {
    let plans: Api<NodeUpdatePlan> = Api::all(ctx.client.clone());
    ctx.metrics.wrote("plan_forget_cordon");
    let written = plans
        .patch(
            node,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"metadata": {"annotations": cordon::forget()}})),
        )
        .await
        .map_err(Error::kube(format!("forgetting the cordon of node {node}")))?;
    ctx.writes.record(&written);
    Ok(())
}

/// What to do after a failed reconcile: count it and try again soon.
pub fn error_policy(rollout: Arc<NodeRollout>, error: &Error, ctx: Arc<Context>) -> Action {
    if let Error::TeardownWaiting { nodes } = error {
        // Not a failure: the finalizer stays until these nodes' agents finish.
        tracing::info!(rollout = %rollout.name_any(), waiting = ?nodes, "deleted rollout waits for activations to finish");
        return Action::requeue(TEARDOWN_RETRY);
    }
    ctx.metrics.failed(CONTROLLER, error.metric_label());
    tracing::warn!(rollout = %rollout.name_any(), error = %error, "rollout reconcile failed");
    Action::requeue(std::time::Duration::from_secs(2))
}

/// The selected nodes as the decision sees them, from the caches; and their uids.
fn gather_nodes(
    rollout: &NodeRollout,
    ctx: &Context,
) -> Result<(Vec<NodeView>, BTreeMap<String, String>)> {
    let name = rollout.name_any();
    let selector = Selector::try_from(rollout.spec.node_selector.clone())
        .map_err(|e| Error::Selector(e.to_string()))?;
    let rollouts = rollouts_by_age(&ctx.rollouts);
    let existing: BTreeSet<String> = rollouts.iter().map(|(n, _)| n.clone()).collect();
    let mut views = Vec::new();
    let mut uids = BTreeMap::new();
    for node in ctx.nodes.state() {
        let labels = node.labels();
        if !selector.matches(labels) {
            continue;
        }
        let node_name = node.name_any();
        let cached = ctx.plans.get(&ObjectRef::new(&node_name));
        let plan = ctx.writes.view(&node_name, cached.as_deref());
        let label = match &cached {
            Some(p) => plan_owner(p).map(str::to_owned),
            None if plan.is_some() => Some(name.clone()),
            None => None,
        };
        let claimants: Vec<&str> = rollouts
            .iter()
            .filter(|(_, s)| s.matches(labels))
            .map(|(n, _)| n.as_str())
            .collect();
        let ownership = resolve_ownership(
            &name,
            plan.is_some(),
            label.as_deref(),
            &existing,
            &claimants,
        );
        let uid = node.metadata.uid.clone().ok_or(Error::MissingField {
            kind: "Node",
            field: "metadata.uid",
        })?;
        uids.insert(node_name.clone(), uid);
        views.push(NodeView {
            control_plane: labels.contains_key(CONTROL_PLANE_LABEL),
            topology: topology_group(&rollout.spec, labels),
            unschedulable: unschedulable(&node),
            name: node_name,
            ownership,
            plan,
            drain: None,
            steering: Steering::of(node.metadata.annotations.as_ref()),
        });
    }
    Ok((views, uids))
}

async fn run_drain_passes(input: &mut RolloutInput<'_>, ctx: &Context) -> Result<()> {
    let wanted: Vec<usize> = (0..input.nodes.len())
        .filter(|&i| needs_drain_pass(input.spec, &input.release, &input.nodes[i]))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let results: Vec<(usize, crate::decision::DrainProgress)> = stream::iter(wanted)
        .map(|i| {
            let node = input.nodes[i].name.clone();
            async move {
                drain_pass(&ctx.eviction_client, &node, &|| {
                    ctx.metrics.wrote("eviction")
                })
                .await
                .map(|p| (i, p))
                .map_err(Error::from)
            }
        })
        .buffer_unordered(DRAIN_CONCURRENCY)
        .try_collect()
        .await?;
    for (i, progress) in results {
        input.nodes[i].drain = Some(progress);
    }
    Ok(())
}

/// Carries out the decision's actions: in order for each node, nodes in parallel. Stops a
/// node's sequence at its first failure; returns the first failure after all are done.
async fn carry_out(
    rollout: &str,
    release: &NodeRelease,
    uids: &BTreeMap<String, String>,
    decision: &Decision,
    ctx: &Context,
) -> Result<()> {
    let release_name = release.name_any();
    let release_name = release_name.as_str();
    let groups = by_node(decision.actions.iter().cloned(), NodeAction::node);
    run_per_node(groups, ctx, |action| async move {
        carry_out_one(rollout, release_name, release, uids, &action, ctx).await
    })
    .await
}

/// Groups actions by node, keeping their order within a node.
fn by_node<A>(actions: impl IntoIterator<Item = A>, node: impl Fn(&A) -> &str) -> Vec<Vec<A>> {
    let mut groups: Vec<Vec<A>> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for action in actions {
        let i = *index.entry(node(&action).to_owned()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(action);
    }
    groups
}

/// Runs each node's actions in order, stopping a node's sequence at its first failure;
/// nodes in parallel. Returns the first failure after all are done.
async fn run_per_node<A, Fut>(
    groups: Vec<Vec<A>>,
    ctx: &Context,
    run: impl Fn(A) -> Fut + Copy,
) -> Result<()>
where
    Fut: std::future::Future<Output = Result<()>>,
{
    let futures: Vec<_> = groups
        .into_iter()
        .map(|actions| async move {
            for action in actions {
                run(action).await?;
            }
            Ok::<(), Error>(())
        })
        .collect();
    let results: Vec<Result<()>> = stream::iter(futures)
        .buffer_unordered(ctx.settings.write_concurrency.max(1))
        .collect()
        .await;
    results.into_iter().collect()
}

async fn carry_out_one(
    rollout: &str,
    release_name: &str,
    release: &NodeRelease,
    uids: &BTreeMap<String, String>,
    action: &NodeAction,
    ctx: &Context,
) -> Result<()> {
    match action {
        NodeAction::ApplyPlan { node, intent } => {
            let node_uid = uids.get(node).ok_or(Error::MissingField {
                kind: "Node",
                field: "metadata.uid",
            })?;
            let body = plan_apply_body(
                &PlanSource {
                    rollout,
                    release: release_name,
                    release_spec: &release.spec,
                    node,
                    node_uid,
                },
                intent,
            )?;
            let plans: Api<NodeUpdatePlan> = Api::all(ctx.client.clone());
            ctx.metrics.wrote("plan_apply");
            let written = plans
                .patch(
                    node,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(body),
                )
                .await
                .map_err(Error::kube(format!("applying the plan of node {node}")))?;
            ctx.writes.record(&written);
        }
        NodeAction::Cordon { node } => set_unschedulable(node, true, ctx).await?,
        NodeAction::Uncordon { node } => set_unschedulable(node, false, ctx).await?,
    }
    Ok(())
}

async fn set_unschedulable(node: &str, unschedulable: bool, ctx: &Context) -> Result<()> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    ctx.metrics.wrote(if unschedulable {
        "node_cordon"
    } else {
        "node_uncordon"
    });
    // The record lives on the plan (written before the cordon), so only the spec changes.
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    cordon::patch_node(
        &nodes,
        &params,
        node,
        Some(unschedulable),
        Default::default(),
    )
    .await?;
    Ok(())
}

/// The rollout's status as a merge patch that also clears lists that became empty.
fn status_patch(status: &NodeRolloutStatus) -> Result<Value> {
    let mut value = serde_json::to_value(status).map_err(|source| Error::Serialize {
        what: "rollout status",
        source,
    })?;
    if let Some(map) = value.as_object_mut() {
        for list in [
            "activeNodes",
            "failedNodes",
            "heldNodes",
            "skippedNodes",
            "conditions",
        ] {
            map.entry(list).or_insert_with(|| json!([]));
        }
        map.entry("revision").or_insert(Value::Null);
        map.entry("nextWindowOpensAt").or_insert(Value::Null);
    }
    Ok(json!({ "status": value }))
}

async fn write_status(name: &str, status: &NodeRolloutStatus, ctx: &Context) -> Result<()> {
    let api: Api<NodeRollout> = Api::all(ctx.client.clone());
    ctx.metrics.wrote("rollout_status");
    api.patch_status(
        name,
        &PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        },
        &Patch::Merge(status_patch(status)?),
    )
    .await
    .map_err(Error::kube(format!("writing the status of rollout {name}")))?;
    Ok(())
}

async fn publish_events(rollout: &NodeRollout, events: &[EventNote], ctx: &Context) {
    let reference = rollout.object_ref(&());
    let notes = events
        .iter()
        .filter(|e| ctx.settings.node_events || e.kind == EventKind::Warning || e.node.is_none());
    let futures: Vec<_> = notes
        .map(|note| {
            let reference = &reference;
            async move {
                let event = Event {
                    type_: match note.kind {
                        EventKind::Normal => EventType::Normal,
                        EventKind::Warning => EventType::Warning,
                    },
                    reason: note.reason.clone(),
                    note: Some(truncate(&note.note)),
                    action: "Rollout".to_owned(),
                    secondary: note.node.as_ref().map(|n| ObjectReference {
                        api_version: Some("v1".to_owned()),
                        kind: Some("Node".to_owned()),
                        name: Some(n.clone()),
                        ..ObjectReference::default()
                    }),
                };
                ctx.metrics.wrote("event");
                if let Err(error) = ctx.recorder.publish(&event, reference).await {
                    tracing::warn!(reason = %note.reason, %error, "could not publish an Event");
                }
            }
        })
        .collect();
    stream::iter(futures)
        .buffer_unordered(16)
        .for_each(|()| async {})
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_patch_clears_emptied_lists() {
        let patch = status_patch(&NodeRolloutStatus::default()).unwrap();
        assert_eq!(patch["status"]["failedNodes"], json!([]));
        assert_eq!(patch["status"]["activeNodes"], json!([]));
        assert_eq!(patch["status"]["heldNodes"], json!([]));
        assert_eq!(patch["status"]["skippedNodes"], json!([]));
        assert_eq!(patch["status"]["revision"], Value::Null);
    }
}
