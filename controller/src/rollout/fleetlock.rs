//! The FleetLock server's I/O (`--fleetlock-addr`): `POST /v1/pre-reboot` and
//! `POST /v1/steady-state`, decided by `decision/fleetlock.rs` from the watch caches, the
//! lock recorded on the client's Node. Only the leader serves it (it runs with the
//! controllers).
//!
//! A grant and a rollout's round never overlap: both hold the context's budget gate, and a
//! grant keeps it until the Node cache shows the lock, so the next round counts the holder.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use crate::context::Context;
use crate::decision::fleetlock::{
    self, ClientParams, FLEETLOCK, PROTOCOL_HEADER, Refusal, RolloutBudget, holder, holder_value,
    is_client_of,
};
use crate::decision::{NodeState, classify, fluo};
use crate::rollout::view::ViewBuilder;

/// `--fleetlock-addr` and `--fleetlock-max-holders`.
#[derive(Debug, Clone)]
pub struct FleetLockSettings {
    /// Where to serve the protocol.
    pub addr: SocketAddr,
    /// How many clients of one group may hold a reboot slot at once.
    pub max_holders: usize,
}

/// Serves the protocol until `stop` turns true.
pub async fn serve(
    settings: FleetLockSettings,
    ctx: Arc<Context>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let listener = tokio::net::TcpListener::bind(settings.addr)
        .await
        .with_context(|| format!("binding the FleetLock address {}", settings.addr))?;
    tracing::info!(addr = %settings.addr, "serving FleetLock");
    let router = Router::new()
        .route("/v1/pre-reboot", post(pre_reboot))
        .route("/v1/steady-state", post(steady_state))
        .with_state((ctx, settings.max_holders));
    axum::serve(listener, router)
        .with_graceful_shutdown(stop)
        .await
        .context("serving FleetLock")
}

type Shared = State<(Arc<Context>, usize)>;

async fn pre_reboot(
    State((ctx, max_holders)): Shared,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(lock(&ctx, max_holders, &headers, &body).await)
}

async fn steady_state(State((ctx, _)): Shared, headers: HeaderMap, body: Bytes) -> Response {
    answer(unlock(&ctx, &headers, &body).await)
}

fn answer(result: Result<(), Refusal>) -> Response {
    match result {
        Ok(()) => StatusCode::OK.into_response(),
        Err(refusal) => {
            let status =
                StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = json!({"kind": refusal.kind, "value": refusal.value});
            (status, axum::Json(body)).into_response()
        }
    }
}

fn params(headers: &HeaderMap, body: &[u8]) -> Result<ClientParams, Refusal> {
    let header = headers.get(PROTOCOL_HEADER).and_then(|v| v.to_str().ok());
    fleetlock::parse_request(header, body)
}

/// `RecursiveLock`.
async fn lock(
    ctx: &Context,
    max_holders: usize,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), Refusal> {
    let client = params(headers, body)?;
    ctx.caches_ready.wait().await;
    let _gate = ctx.budget_gate.lock().await;
    let node = client_node(ctx, &client).ok_or_else(|| Refusal {
        status: 404,
        kind: "unknown_client",
        value: format!(
            "no Node is client {}: its id is neither a Node's name nor zincati's ID of a Node's machine ID",
            client.id
        ),
    })?;
    let nodes = ctx.nodes.state();
    let group_prefix = format!("{}/", client.group);
    let group_holders = nodes
        .iter()
        .filter(|n| {
            holder(n.metadata.annotations.as_ref()).is_some_and(|h| h.starts_with(&group_prefix))
        })
        .count();
    let node_holder = holder(node.metadata.annotations.as_ref());
    if node_holder == Some(holder_value(&client).as_str()) {
        return Ok(());
    }
    let budgets = rollout_budgets(ctx, &node, &nodes);
    fleetlock::may_lock(&client, node_holder, group_holders, max_holders, &budgets)?;
    write_holder(ctx, &node.name_any(), Some(holder_value(&client))).await
}

/// `UnlockIfHeld`: success whether or not the client held a slot.
async fn unlock(ctx: &Context, headers: &HeaderMap, body: &[u8]) -> Result<(), Refusal> {
    let client = params(headers, body)?;
    ctx.caches_ready.wait().await;
    let _gate = ctx.budget_gate.lock().await;
    let Some(node) = client_node(ctx, &client) else {
        return Ok(());
    };
    if holder(node.metadata.annotations.as_ref()) != Some(holder_value(&client).as_str()) {
        return Ok(());
    }
    write_holder(ctx, &node.name_any(), None).await
}

/// The Node whose client `client` is.
fn client_node(ctx: &Context, client: &ClientParams) -> Option<Arc<Node>> {
    if let Some(node) = ctx.nodes.get(&ObjectRef::new(&client.id)) {
        return Some(node);
    }
    ctx.nodes.state().into_iter().find(|node| {
        let machine_id = node
            .status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.machine_id.as_str());
        is_client_of(&client.id, &node.name_any(), machine_id)
    })
}

/// Every rollout that selects `node`: its slots and its selected nodes that are down now.
fn rollout_budgets(ctx: &Context, node: &Node, nodes: &[Arc<Node>]) -> Vec<RolloutBudget> {
    let rollouts = ctx.rollouts.state();
    let by_age = crate::rollout::view::rollouts_by_age(rollouts.iter().map(AsRef::as_ref));
    rollouts
        .iter()
        .filter_map(|rollout| {
            let builder = ViewBuilder::new(rollout, &by_age).ok()?;
            if !builder.selects(node) {
                return None;
            }
            let selected: Vec<&Arc<Node>> = nodes.iter().filter(|n| builder.selects(n)).collect();
            let slots = inplace_proto::rollout_slots::activation_slots(
                &rollout.spec.max_unavailable,
                selected.len(),
            );
            let down = selected
                .iter()
                .filter_map(|n| down_because(ctx, n).map(|why| (n.name_any(), why)))
                .collect();
            Some(RolloutBudget {
                rollout: rollout.name_any(),
                slots,
                down,
            })
        })
        .collect()
}

/// Why `node` is down now, if it is: a reboot slot held, a reboot under FLUO, an inplace
/// activation, a cordon, or not `Ready`.
fn down_because(ctx: &Context, node: &Node) -> Option<String> {
    let annotations = node.metadata.annotations.as_ref();
    if let Some(held) = holder(annotations) {
        return Some(format!("held by {FLEETLOCK} ({held})"));
    }
    if fluo::rebooting(node.labels(), annotations) {
        return Some(format!("rebooting under {}", fluo::FLUO));
    }
    let name = node.name_any();
    let cached = ctx.plans.get(&ObjectRef::new(&name));
    if let Some(view) = ctx.writes.current(&name, cached.as_deref())
        && classify(&view, &view.intent.revision) == Some(NodeState::Updating)
    {
        return Some("activating".to_owned());
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return Some("cordoned".to_owned());
    }
    match crate::rollout::node_readiness::readiness(node) {
        crate::decision::Readiness::Ready => None,
        crate::decision::Readiness::NotReady { why } => Some(format!("NotReady ({why})")),
    }
}

/// Records (or, with `None`, removes) the lock on the Node, then waits until the Node cache
/// shows it: a rollout round after the gate opens must count it.
async fn write_holder(ctx: &Context, node: &str, value: Option<String>) -> Result<(), Refusal> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let patch = json!({"metadata": {"annotations": {fleetlock::HOLDER_ANNOTATION: value}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Refusal {
            status: 503,
            kind: "failed_write",
            value: format!("recording the reboot slot on Node {node}: {e}"),
        })?;
    let shows = |n: &Node| holder(n.metadata.annotations.as_ref()) == value.as_deref();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if ctx
            .nodes
            .get(&ObjectRef::new(node))
            .is_some_and(|n| shows(&n))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(
        node,
        "the Node cache did not show the FleetLock holder within 10 s"
    );
    Ok(())
}
