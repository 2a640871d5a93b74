//! The rollout controller's writes: a decision's plan applies, cordons and uncordons and
//! the autoscaler's scale-down annotation (in order per node, nodes in parallel), a
//! teardown's forgotten cordons, and the rollout's status (paced,
//! [`crate::rollout::status_pacing`]). Each plan write feeds the rollout's view
//! ([`crate::rollout::view::ChangeFeed`]) so the next round rebuilds that node.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use futures::{StreamExt, stream};
use inplace_drain::cordon;
use inplace_proto::{NodeRelease, NodeRollout, NodeRolloutStatus};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::context::Context;
use crate::decision::{Decision, NodeAction};
use crate::error::{Error, Result};
use crate::rollout::plan_watch::WatchedPlan;
use crate::rollout::plans::{FIELD_MANAGER, PlanSource, plan_apply_body};
use crate::rollout::status_pacing::StatusWrite;

/// Writes the rollout's owed status (`status`, or the one last decided) when its pacing
/// allows; otherwise returns how soon it may.
pub(crate) async fn write_owed_status(
    name: &str,
    status: Option<&NodeRolloutStatus>,
    ctx: &Context,
) -> Result<Option<std::time::Duration>> {
    match ctx
        .status_pacer
        .with(name, |p| p.next_write(Instant::now()))
    {
        StatusWrite::Nothing => Ok(None),
        StatusWrite::After(wait) => Ok(Some(wait)),
        StatusWrite::Now => {
            let remembered;
            let status = match status {
                Some(status) => status,
                None => {
                    remembered = ctx.last_status(name).unwrap_or_default();
                    &remembered
                }
            };
            write_status(name, status, ctx).await?;
            ctx.status_pacer.with(name, |p| p.wrote(Instant::now()));
            Ok(None)
        }
    }
}

/// Removes the controller's cordon record from a plan (the annotation was applied by the
/// controller's field manager, so its own merge patch may drop it).
pub(crate) async fn forget_cordon(node: &str, ctx: &Context) -> Result<()> {
    // Decoded slim: the response is a whole plan, read only for `RecentWrites`.
    let plans: Api<WatchedPlan> = Api::all(ctx.client.clone());
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
    ctx.writes.record(&written.into());
    ctx.views.feed.node_changed(node);
    Ok(())
}

/// Carries out the decision's actions: in order for each node, nodes in parallel. Stops a
/// node's sequence at its first failure; returns the first failure after all are done.
pub(crate) async fn carry_out(
    rollout: &str,
    release: &NodeRelease,
    uids: &HashMap<String, String>,
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
pub(crate) fn by_node<A>(
    actions: impl IntoIterator<Item = A>,
    node: impl Fn(&A) -> &str,
) -> Vec<Vec<A>> {
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
pub(crate) async fn run_per_node<A, Fut>(
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
    uids: &HashMap<String, String>,
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
            );
            // Decoded slim: the response is a whole plan, read only for `RecentWrites`.
            let plans: Api<WatchedPlan> = Api::all(ctx.client.clone());
            ctx.metrics.wrote("plan_apply");
            let written = plans
                .patch(
                    node,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(body),
                )
                .await
                .map_err(Error::kube(format!("applying the plan of node {node}")))?;
            ctx.writes.record(&written.into());
            ctx.views.feed.node_changed(node);
        }
        NodeAction::Cordon { node } => set_unschedulable(node, true, ctx).await?,
        NodeAction::Uncordon { node } => set_unschedulable(node, false, ctx).await?,
        NodeAction::DisableScaleDown { node } => mark_scale_down(node, true, ctx).await?,
        NodeAction::RestoreScaleDown { node } => mark_scale_down(node, false, ctx).await?,
    }
    Ok(())
}

/// Sets (or removes) the autoscaler's scale-down annotation together with inplace's mark
/// that it set it, in one merge patch (`decision/autoscaler.rs`).
pub(crate) async fn mark_scale_down(node: &str, disabled: bool, ctx: &Context) -> Result<()> {
    use crate::decision::{SCALE_DOWN_DISABLED_ANNOTATION, SCALE_DOWN_MARK_ANNOTATION};
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    ctx.metrics.wrote(if disabled {
        "node_scale_down_disable"
    } else {
        "node_scale_down_restore"
    });
    let value = if disabled { json!("true") } else { Value::Null };
    let mut annotations = serde_json::Map::new();
    annotations.insert(SCALE_DOWN_DISABLED_ANNOTATION.to_owned(), value.clone());
    annotations.insert(SCALE_DOWN_MARK_ANNOTATION.to_owned(), value);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    cordon::patch_node(&nodes, &params, node, None, annotations).await?;
    ctx.views.feed.node_changed(node);
    Ok(())
}

pub(crate) async fn set_unschedulable(
    node: &str,
    unschedulable: bool,
    ctx: &Context,
) -> Result<()> {
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
    ctx.views.feed.node_changed(node);
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
            "foreignDisruptions",
            "conditions",
        ] {
            map.entry(list).or_insert_with(|| json!([]));
        }
        map.entry("revision").or_insert(Value::Null);
        map.entry("nextWindowOpensAt").or_insert(Value::Null);
    }
    Ok(json!({ "status": value }))
}

pub(crate) async fn write_status(
    name: &str,
    status: &NodeRolloutStatus,
    ctx: &Context,
) -> Result<()> {
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
        assert_eq!(patch["status"]["foreignDisruptions"], json!([]));
        assert_eq!(patch["status"]["revision"], Value::Null);
    }
}
