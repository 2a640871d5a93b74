//! Verbs that change a rollout or steer one node: each one plain merge patch of a field or
//! annotation a person could also set with `kubectl patch` / `kubectl annotate`, so the
//! plugin adds no state and no API of its own.

use anyhow::Context as _;
use inplace_proto::steering::{HOLD_ANNOTATION, RETRY_ANNOTATION, SKIP_ANNOTATION};
use inplace_proto::{NodeRollout, NodeUpdatePlan};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

/// The field manager the plugin's patches are recorded under (`managedFields`), so a person
/// reading the object can tell who paused it.
pub const FIELD_MANAGER: &str = "kubectl-inplace";

/// `kubectl inplace pause|resume ROLLOUT`: sets `spec.paused` and says what that means.
pub async fn set_paused(client: &Client, rollout: &str, paused: bool) -> anyhow::Result<String> {
    let patch = serde_json::json!({"spec": {"paused": paused}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match Api::<NodeRollout>::all(client.clone())
        .patch(rollout, &params, &Patch::Merge(patch))
        .await
    {
        Ok(_) if paused => Ok(format!(
            "NodeRollout {rollout} paused: no further node is activated; staging goes on and nodes already activating finish"
        )),
        Ok(_) => Ok(format!(
            "NodeRollout {rollout} resumed: staged nodes are activated again as slots allow"
        )),
        // A 404 is the person's typo or a deleted rollout, not a failure of the API.
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            anyhow::bail!("NodeRollout {rollout} not found")
        }
        Err(e) => Err(e).with_context(|| format!("patching NodeRollout {rollout}")),
    }
}

/// What `kubectl inplace hold|release|skip NODE` asks of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeSteer {
    /// Set `inplace.dev/hold`: not activated until released.
    Hold,
    /// Remove `inplace.dev/hold` and `inplace.dev/skip`.
    Release,
    /// Set `inplace.dev/skip`: left at the revision it runs.
    Skip,
}

impl NodeSteer {
    /// The merge patch of the Node's annotations (`null` removes one).
    pub fn patch(self) -> serde_json::Value {
        let annotations = match self {
            NodeSteer::Hold => serde_json::json!({ HOLD_ANNOTATION: "true" }),
            NodeSteer::Skip => serde_json::json!({ SKIP_ANNOTATION: "true" }),
            NodeSteer::Release => {
                serde_json::json!({ HOLD_ANNOTATION: null, SKIP_ANNOTATION: null })
            }
        };
        serde_json::json!({"metadata": {"annotations": annotations}})
    }

    fn done(self, node: &str) -> String {
        match self {
            NodeSteer::Hold => format!(
                "node {node} held ({HOLD_ANNOTATION}): its rollout stages it but does not activate it until released"
            ),
            NodeSteer::Release => format!(
                "node {node} released: {HOLD_ANNOTATION} and {SKIP_ANNOTATION} removed; its rollout may activate it"
            ),
            NodeSteer::Skip => format!(
                "node {node} skipped ({SKIP_ANNOTATION}): it keeps the revision it runs and is counted as skipped"
            ),
        }
    }
}

/// `kubectl inplace hold|release|skip NODE`: patches the Node's annotations.
pub async fn steer_node(client: &Client, node: &str, verb: NodeSteer) -> anyhow::Result<String> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match Api::<Node>::all(client.clone())
        .patch(node, &params, &Patch::Merge(verb.patch()))
        .await
    {
        Ok(_) => Ok(verb.done(node)),
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            anyhow::bail!("node {node} not found")
        }
        Err(e) => Err(e).with_context(|| format!("patching node {node}")),
    }
}

/// The merge patch of `kubectl inplace retry NODE`: a new token in the plan's
/// `inplace.dev/retry` (a token the agent has honoured is never honoured again, so each
/// retry needs a new one: the time, to the nanosecond).
pub fn retry_patch(token: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": { RETRY_ANNOTATION: token }}})
}

/// `kubectl inplace retry NODE`: sets a new retry token on the node's plan (the agent reads
/// only its plan, so the token lives there, not on the Node).
pub async fn retry_node(client: &Client, node: &str) -> anyhow::Result<String> {
    let token = k8s_openapi::jiff::Timestamp::now().to_string();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match Api::<NodeUpdatePlan>::all(client.clone())
        .patch(node, &params, &Patch::Merge(retry_patch(&token)))
        .await
    {
        Ok(_) => Ok(format!(
            "node {node}: retry {token} asked ({RETRY_ANNOTATION} on its plan); its agent stages the failed revision again once its rollout moves the plan back to Staged"
        )),
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            anyhow::bail!("node {node} has no NodeUpdatePlan: nothing to retry")
        }
        Err(e) => Err(e).with_context(|| format!("patching the plan of node {node}")),
    }
}
