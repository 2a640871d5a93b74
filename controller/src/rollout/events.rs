//! Publishing the decision's Events (events.k8s.io/v1, through kube-runtime's Recorder):
//! every one on the rollout, and those a person looking at one node cares about
//! ([`EventNote::on_node`]) also on that Node and on its NodeUpdatePlan, under their
//! `Inplace…` reason, so `kubectl describe node NAME` and `kubectl describe nodeupdateplan
//! NAME` tell the node's own story. Best effort: a failed publish is logged, never retried.

use futures::{StreamExt, stream};
use inplace_proto::{NodeRollout, NodeUpdatePlan};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Resource;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;

use crate::context::Context;
use crate::decision::{EventKind, EventNote};
use crate::release::controller::truncate;

/// How many Events are being written at once.
const CONCURRENCY: usize = 16;

/// Publishes `events` about `rollout` (per-node ones only with `settings.node_events`, or
/// when they are Warnings).
pub async fn publish(rollout: &NodeRollout, events: &[EventNote], ctx: &Context) {
    let rollout_ref = rollout.object_ref(&());
    let notes = events
        .iter()
        .filter(|e| ctx.settings.node_events || e.kind == EventKind::Warning || e.node.is_none());
    let mut writes: Vec<(Event, ObjectReference)> = Vec::new();
    for note in notes {
        let node_ref = note.node.as_deref().map(|n| node_reference(n, ctx));
        writes.push((
            event(note, &note.reason, node_ref.clone()),
            rollout_ref.clone(),
        ));
        if let (Some(reason), Some(node_ref), Some(node)) =
            (note.on_node, node_ref, note.node.as_deref())
        {
            // On the Node, the rollout is the related object; on the plan, the Node.
            writes.push((
                event(note, reason, Some(rollout_ref.clone())),
                node_ref.clone(),
            ));
            if let Some(plan_ref) = plan_reference(node, ctx) {
                writes.push((event(note, reason, Some(node_ref)), plan_ref));
            }
        }
    }
    stream::iter(writes)
        .for_each_concurrent(CONCURRENCY, |(event, regarding)| async move {
            ctx.metrics.wrote("event");
            if let Err(error) = ctx.recorder.publish(&event, &regarding).await {
                tracing::warn!(reason = %event.reason, %error, "could not publish an Event");
            }
        })
        .await;
}

fn event(note: &EventNote, reason: &str, related: Option<ObjectReference>) -> Event {
    Event {
        type_: match note.kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        },
        reason: reason.to_owned(),
        note: Some(truncate(&note.note)),
        action: "Rollout".to_owned(),
        secondary: related,
    }
}

/// The Node, with its uid when the cache has it: `kubectl describe node` finds Events by
/// the Node's uid (or by its name in the uid field, the kubelet's way).
fn node_reference(name: &str, ctx: &Context) -> ObjectReference {
    let uid = ctx
        .nodes
        .get(&ObjectRef::<Node>::new(name))
        .and_then(|n| n.metadata.uid.clone());
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Node".to_owned()),
        name: Some(name.to_owned()),
        uid,
        ..ObjectReference::default()
    }
}

/// The node's plan, when the cache has it (a skipped node may have none).
fn plan_reference(node: &str, ctx: &Context) -> Option<ObjectReference> {
    ctx.plans
        .get(&ObjectRef::<NodeUpdatePlan>::new(node))
        .map(|p| p.object_ref(&()))
}
