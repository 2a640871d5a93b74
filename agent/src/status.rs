//! The plan's status: written by this agent only, to the status subresource only.
//!
//! The coordinator [`StatusSink::publish`]es the latest status and never waits for the API
//! server; a background task writes the newest value with a JSON merge patch (field manager
//! `inplace-agent`), retrying on conflicts and outages with capped backoff, so the status
//! catches up within seconds once the server is back. A new agent proving it can do its
//! job (an agent switch) writes once and waits for the answer: [`StatusSink::write_now`].

use std::sync::Mutex;
use std::time::Duration;

use inplace_proto::{NodeUpdatePlan, NodeUpdatePlanStatus};
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;

/// The field manager for every write.
pub const FIELD_MANAGER: &str = "inplace-agent";

/// Where the coordinator puts status. `publish` never blocks.
#[async_trait::async_trait]
pub trait StatusSink: Send + Sync {
    /// Replaces the status to be written.
    fn publish(&self, status: NodeUpdatePlanStatus);

    /// Writes `status` now, with this agent's identity, and says whether the API server
    /// took it (the error's text otherwise). Also published, so the writer keeps it.
    async fn write_now(&self, status: NodeUpdatePlanStatus) -> Result<(), String>;
}

/// Keeps every published status (for tests and `--once` style runs).
#[derive(Default)]
pub struct MemorySink {
    /// Everything published, in order.
    pub published: Mutex<Vec<NodeUpdatePlanStatus>>,
    /// While set, `write_now` fails with this text (an API server refusing the identity).
    pub refuse: Mutex<Option<String>>,
}

#[async_trait::async_trait]
impl StatusSink for MemorySink {
    fn publish(&self, status: NodeUpdatePlanStatus) {
        if let Ok(mut list) = self.published.lock() {
            list.push(status);
        }
    }

    async fn write_now(&self, status: NodeUpdatePlanStatus) -> Result<(), String> {
        if let Some(refused) = self.refuse.lock().ok().and_then(|r| r.clone()) {
            return Err(refused);
        }
        self.publish(status);
        Ok(())
    }
}

impl MemorySink {
    /// The last status published.
    pub fn last(&self) -> Option<NodeUpdatePlanStatus> {
        self.published.lock().ok().and_then(|l| l.last().cloned())
    }
}

/// The merge patch for a status: every field present, absent ones as `null`, so fields
/// from an earlier revision (say `finishedAt`) are cleared. Never mentions the spec.
pub fn status_patch(status: &NodeUpdatePlanStatus) -> Value {
    let mut value = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut value {
        for key in [
            "observedGeneration",
            "phase",
            "currentRevision",
            "targetRevision",
            "progress",
            "artifacts",
            "attempts",
            "failedRevisions",
            "conditions",
            "startedAt",
            "finishedAt",
            "agentVersion",
            "bootID",
        ] {
            map.entry(key).or_insert(Value::Null);
        }
    }
    json!({ "status": value })
}

/// Publishes into a channel drained by [`run_writer`]; writes now through `api`.
pub struct ChannelSink {
    tx: watch::Sender<Option<NodeUpdatePlanStatus>>,
    api: kube::Api<NodeUpdatePlan>,
    name: String,
}

#[async_trait::async_trait]
impl StatusSink for ChannelSink {
    fn publish(&self, status: NodeUpdatePlanStatus) {
        self.tx.send_replace(Some(status));
    }

    async fn write_now(&self, status: NodeUpdatePlanStatus) -> Result<(), String> {
        let patch = Patch::Merge(status_patch(&status));
        let params = PatchParams::apply(FIELD_MANAGER);
        let written = self.api.patch_status(&self.name, &params, &patch).await;
        self.publish(status);
        written.map(drop).map_err(|e| e.to_string())
    }
}

/// A sink writing plan `name` through `api`, and the receiver for its writer task.
pub fn channel(
    api: kube::Api<NodeUpdatePlan>,
    name: String,
) -> (ChannelSink, watch::Receiver<Option<NodeUpdatePlanStatus>>) {
    let (tx, rx) = watch::channel(None);
    (ChannelSink { tx, api, name }, rx)
}

/// Writes the newest published status to the API server, until the sink is dropped.
/// Failures are retried with backoff capped at `max_backoff`; a newer status replaces a
/// pending one.
pub async fn run_writer(
    api: kube::Api<NodeUpdatePlan>,
    name: String,
    mut rx: watch::Receiver<Option<NodeUpdatePlanStatus>>,
    max_backoff: Duration,
) {
    let params = PatchParams::apply(FIELD_MANAGER);
    loop {
        let current = rx.borrow_and_update().clone();
        if let Some(status) = current {
            let mut delay = Duration::from_millis(200);
            loop {
                let patch = Patch::Merge(status_patch(&status));
                match api.patch_status(&name, &params, &patch).await {
                    Ok(_) => break,
                    // The plan is gone: nothing to report to. A new plan brings a new status.
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        tracing::info!("plan deleted; dropping its status");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "status write failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(max_backoff);
                        // A newer status supersedes this one.
                        if rx.has_changed().unwrap_or(false) {
                            break;
                        }
                    }
                }
            }
            if rx.has_changed().unwrap_or(false) {
                continue;
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inplace_proto::Phase;

    #[test]
    fn patch_nulls_absent_fields_and_only_touches_status() {
        let status = NodeUpdatePlanStatus {
            phase: Some(Phase::Staged),
            ..Default::default()
        };
        let patch = status_patch(&status);
        let object = patch.as_object().unwrap();
        assert_eq!(object.keys().collect::<Vec<_>>(), vec!["status"]);
        assert_eq!(patch["status"]["phase"], "Staged");
        assert!(patch["status"]["finishedAt"].is_null());
        assert!(
            patch["status"]
                .as_object()
                .unwrap()
                .contains_key("finishedAt")
        );
    }
}
