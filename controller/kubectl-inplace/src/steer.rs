//! Verbs that change a rollout: each one plain merge patch of a field a person could also
//! set with `kubectl patch`, so the plugin adds no state and no API of its own.

use anyhow::Context as _;
use inplace_proto::NodeRollout;
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
