//! The NodeRollout controller: refreshes the rollout's per-node view from the watch caches
//! (never listing nodes or plans from the API; only what changed, `rollout::view`), and
//! unless nothing the decision reads changed, runs the drain passes the decision needs,
//! calls [`decide_with_memo`], and carries out what it returns (`rollout::writes`: plan applies,
//! cordons, uncordons, the rollout's status) and publishes its Events.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt, stream};
use inplace_proto::{NodeRelease, NodeRollout, NodeRolloutSpec, NodeUpdatePlan};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::{Selector, SelectorExt};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::context::Context;
use crate::decision::kured::{KuredWrite, lock_write};
use crate::decision::{
    Decision, DecisionMemo, KubernetesVersions, NodeOrder, ReleaseState, RolloutInput,
    ScaleDownMark, asks_api_server, decide_with_memo, drain_pass_options, needs_drain_pass,
    rollout_drains,
};
use crate::error::{Error, Result};
use crate::rollout::alert_gate::observe_alerts;
use crate::rollout::kured_lock::KuredRead;
use crate::rollout::plans::plan_owner;
use crate::rollout::round_pacing;
use crate::rollout::teardown::{
    TEARDOWN_RETRY, TeardownAction, TeardownNode, UNCORDON_FINALIZER, decide_teardown,
};
use crate::rollout::view::{LastRound, unschedulable};
use crate::rollout::writes::{
    by_node, carry_out, forget_cordon, mark_scale_down, run_per_node, set_unschedulable,
    write_owed_status,
};
use inplace_drain::drain_pass;

/// The controller's name in metrics.
pub const CONTROLLER: &str = "rollout";

/// How many drain passes one reconcile runs at once.
const DRAIN_CONCURRENCY: usize = 8;

/// The release a rollout names, as the decision sees it.
pub fn release_state(release: Option<&NodeRelease>) -> ReleaseState {
    match release {
        None => ReleaseState::Missing,
        Some(release) => match release.usable() {
            Err(unusable) => ReleaseState::Invalid {
                message: unusable.to_string(),
            },
            Ok(revision) => ReleaseState::Valid {
                revision: Arc::from(revision),
            },
        },
    }
}

/// The architectures a valid release has a build of every artifact for (the decision's
/// architecture preflight, `decision/architecture.rs`); `None` for a release that serves
/// every architecture, or none that is usable.
pub fn release_architectures(
    state: &ReleaseState,
    release: Option<&NodeRelease>,
) -> Option<Vec<inplace_proto::Architecture>> {
    match state {
        ReleaseState::Valid { .. } => release?.spec.content.architectures(),
        _ => None,
    }
}

/// What the skew guard compares the nodes' kubelets with: the release's
/// `kubernetesVersion` and, unless the rollout allows skew, the API server's version
/// (asked only for a release that brings a Kubernetes version).
async fn kubernetes_versions(
    spec: &NodeRolloutSpec,
    release: Option<&NodeRelease>,
    ctx: &Context,
) -> Result<KubernetesVersions> {
    let release = release.and_then(|r| r.spec.content.kubernetes_version.clone());
    let api_server = match asks_api_server(spec, release.as_deref()) {
        true => Some(ctx.api_server_version.get(&ctx.client).await?),
        false => None,
    };
    Ok(KubernetesVersions {
        release,
        api_server,
    })
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
    ctx.caches_ready.wait().await;

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

/// Reconciles a rollout that carries the finalizer and is not being deleted: refreshes
/// the nodes' views that changed; unless nothing the decision reads changed since the last
/// round, decides and carries the decision out; writes an owed status when its interval
/// allows.
async fn apply(rollout: &NodeRollout, ctx: &Context) -> Result<Action> {
    let started = Instant::now();
    let name = rollout.name_any();
    let release = ctx.releases.get(&ObjectRef::new(&rollout.spec.release));
    let mut view = ctx.views.take(&name);
    let next_round_at = view.last.as_ref().map(|last| last.next_round_at);
    if let Some(wait) = round_pacing::wait_before_deciding(next_round_at, started) {
        // What changed meanwhile stays in the change feed for that round.
        ctx.views.put(&name, view);
        ctx.metrics.rollout_round("paced");
        return Ok(Action::requeue(wait));
    }
    // A FleetLock grant and this round never decide on one budget at once: the grant holds
    // the gate until the Node cache shows its holder (`rollout/fleetlock.rs`).
    let _budget = match ctx.settings.fleetlock {
        Some(_) => Some(ctx.budget_gate.lock().await),
        None => None,
    };
    let refreshed = view.refresh(rollout, &ctx.view_sources())?;
    let refresh_cost = started.elapsed();
    let release_state = view.share_release(release_state(release.as_deref()));
    let kured = match &ctx.settings.kured {
        Some(settings) => Some(settings.read(&ctx.client, &name, Timestamp::now()).await),
        None => None,
    };
    let kured_view = kured.as_ref().map(|k| k.view.clone());
    if !refreshed.changed
        && view.unchanged_since_last_round(&release_state, kured_view.as_ref(), started)
    {
        let wake_at = view.last.as_ref().map(|last| last.wake_at);
        ctx.views.put(&name, view);
        ctx.metrics.rollout_round("unchanged");
        let paced = write_owed_status(&name, None, ctx).await?;
        let until_wake = wake_at.map_or(ctx.settings.resync, |at| at - started);
        return Ok(Action::requeue(
            paced.map_or(until_wake, |p| p.min(until_wake)),
        ));
    }
    ctx.metrics.rollout_round("decided");
    let previous = ctx.last_status(&name).or_else(|| rollout.status.clone());
    let alerts = observe_alerts(&rollout.spec, ctx.alerts.as_ref()).await;
    let versions = kubernetes_versions(&rollout.spec, release.as_deref(), ctx).await?;
    let mut input = RolloutInput {
        name: &name,
        generation: rollout.metadata.generation,
        spec: &rollout.spec,
        previous: previous.as_ref(),
        release: release_state.clone(),
        architectures: release_architectures(&release_state, release.as_deref()),
        nodes: std::mem::take(&mut view.nodes),
        // The view keeps its nodes so (`RolloutView::sort`).
        order: NodeOrder::Activation,
        alerts,
        versions,
        kured: kured_view.clone(),
        now: Timestamp::now(),
    };
    run_drain_passes(&mut input, ctx).await?;
    let deciding = Instant::now();
    let decision = decide_with_memo(&input, &mut view.memo);
    if let Some(kured) = kured
        && !hold_kured_lock(kured, &decision, input.now, ctx).await?
    {
        // Someone wrote kured's DaemonSet between this round's read and its write: nothing
        // this round decided is carried out (its grants need the lock); the next round
        // reads the lock again. The memo holds those grants: forget it.
        view.nodes = input.nodes;
        view.memo = DecisionMemo::default();
        ctx.views.put(&name, view);
        return Ok(Action::requeue(std::time::Duration::from_secs(1)));
    }
    // The round's own work, not the drain's or Prometheus' answers it waited for.
    let cost = refresh_cost + deciding.elapsed();
    let next_round_at = round_pacing::next_round_at(started, cost);
    let now = input.now;
    view.nodes = input.nodes;
    for node in view.nodes.iter_mut().filter(|n| n.drain.is_some()) {
        node.drain = None;
    }

    if let Some(release) = &release {
        carry_out(&name, release, &view.uids, &decision, ctx).await?;
    }
    crate::rollout::events::publish(rollout, &decision.events, ctx).await;
    if previous.as_ref() != Some(&decision.status) {
        ctx.status_pacer.with(&name, |p| p.owe());
    }
    ctx.remember_status(&name, decision.status.clone());
    let paced = write_owed_status(&name, Some(&decision.status), ctx).await?;
    ctx.metrics.rollout_counts(&name, &decision.status.nodes);
    // A wake-up days away (the next maintenance window) never stretches the resync; alerts
    // are polled while they may hold back an activation (no watch says when one resolves,
    // and a round only decides, asking Prometheus, when something changed or is due).
    let complete = inplace_proto::condition::is_true(
        &decision.status.conditions,
        inplace_proto::reason::rollout_condition::COMPLETE,
    );
    let alerts_recheck =
        (!rollout.spec.gates.alerts.is_empty() && !complete).then_some(ctx.settings.alert_recheck);
    let after = [decision.requeue_after, alerts_recheck]
        .into_iter()
        .flatten()
        .fold(ctx.settings.resync, std::cmp::Ord::min);
    let kured_recheck = ctx
        .settings
        .kured
        .as_ref()
        .filter(|_| decision.status.nodes.staged > 0)
        .map(|k| k.recheck);
    let after = after.min(kured_recheck.unwrap_or(after));
    view.last = Some(LastRound {
        release: release_state,
        kured: kured_view,
        wake_at: started + after,
        next_round_at,
    });
    ctx.views.put(&name, view);
    ctx.metrics.reconciled(CONTROLLER, started.elapsed());
    tracing::debug!(
        rollout = %name,
        actions = decision.actions.len(),
        took_ms = started.elapsed().as_millis() as u64,
        %now,
        "reconciled"
    );
    Ok(Action::requeue(paced.map_or(after, |p| p.min(after))))
}

/// Takes kured's lock before the round's grants are carried out, and releases it once the
/// rollout holds no slot (`decision/kured.rs`). `Ok(false)`: the lock was to be taken and
/// someone else wrote the DaemonSet first.
async fn hold_kured_lock(
    kured: KuredRead,
    decision: &Decision,
    now: Timestamp,
    ctx: &Context,
) -> Result<bool> {
    let Some(settings) = &ctx.settings.kured else {
        return Ok(true);
    };
    let needed = decision.status.nodes.updating > 0;
    let Some(write) = lock_write(&kured.view, needed, settings.ttl, now) else {
        return Ok(true);
    };
    let taking = matches!(write, KuredWrite::Take(_));
    let written = settings.write(&ctx.client, kured, &write).await?;
    ctx.metrics.wrote("kured_lock");
    // A release that lost to another write is retried by the next round.
    Ok(written || !taking)
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
            let plan = ctx.writes.current(&node_name, Some(cached))?;
            let node = ctx.nodes.get(&ObjectRef::new(&node_name));
            Some(TeardownNode {
                unschedulable: node.as_deref().map(unschedulable),
                scale_down_ours: node
                    .is_some_and(|n| ScaleDownMark::of(n.metadata.annotations.as_ref()).ours),
                name: node_name,
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
            TeardownAction::RestoreScaleDown { node } => mark_scale_down(&node, false, ctx).await,
        }
    })
    .await;
    crate::rollout::events::publish(rollout, &teardown.events, ctx).await;
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
    ctx.views.forget(rollout);
    ctx.status_pacer.forget(rollout);
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

/// Runs this round's drain passes. A rollout that does not drain skips the walk over its
/// nodes (a pass over the whole fleet per deciding round).
async fn run_drain_passes(input: &mut RolloutInput<'_>, ctx: &Context) -> Result<()> {
    // An invalid rollout touches nothing (the decision reports it): no evictions either.
    if !rollout_drains(input.spec) || input.spec.validate().is_err() {
        return Ok(());
    }
    let wanted: Vec<usize> = (0..input.nodes.len())
        .filter(|&i| needs_drain_pass(input.spec, &input.release, &input.nodes[i]))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let mut passes = Vec::with_capacity(wanted.len());
    for i in wanted {
        let options =
            drain_pass_options(input.spec, &input.nodes[i], input.now).map_err(Error::Selector)?;
        passes.push((i, input.nodes[i].name.clone(), options));
    }
    let results: Vec<(usize, crate::decision::DrainProgress)> = stream::iter(passes)
        .map(|(i, node, options)| async move {
            drain_pass(&ctx.eviction_client, &node, &options, &|| {
                ctx.metrics.wrote("eviction")
            })
            .await
            .map(|p| (i, p))
            .map_err(Error::from)
        })
        .buffer_unordered(DRAIN_CONCURRENCY)
        .try_collect()
        .await?;
    for (i, progress) in results {
        input.nodes[i].drain = Some(progress);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rollout judges a release as the Cluster API extension does (`NodeRelease::usable`):
    /// one the release controller marked `Valid=False` for its generation is not used, even
    /// where this build's `validate()` accepts it (a controller of another version wrote it).
    #[test]
    fn a_release_marked_invalid_for_its_generation_is_not_used() {
        let mut release: NodeRelease = serde_json::from_value(serde_json::json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
            "metadata": {"name": "k8s", "generation": 3},
            "spec": {"version": "v1", "artifacts": [{"name": "kubernetes", "type": "Sysext",
                "url": "https://example.com/kubernetes.raw", "sha256": "a".repeat(64)}]}
        }))
        .unwrap();
        assert!(matches!(
            release_state(Some(&release)),
            ReleaseState::Valid { .. }
        ));
        release.status = Some(
            serde_json::from_value(serde_json::json!({"conditions": [{"type": "Valid",
                "status": "False", "reason": "InvalidRelease", "message": "spec.artifacts[0]: no",
                "lastTransitionTime": "2026-11-28T00:00:00Z", "observedGeneration": 3}]}))
            .unwrap(),
        );
        match release_state(Some(&release)) {
            ReleaseState::Invalid { message } => {
                assert_eq!(message, "Valid=False: spec.artifacts[0]: no");
            }
            other => panic!("{other:?}"),
        }
    }
}
