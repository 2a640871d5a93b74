//! The NodeRelease controller: validates each release, computes its revision and reports
//! both in its status (`Valid` with `ValidRelease` or `InvalidRelease` and every problem).

use std::sync::Arc;
use std::time::Instant;

use inplace_proto::reason::{Reason, release_condition};
use inplace_proto::{ConditionUpdate, NodeRelease, NodeReleaseStatus, revision_of};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::rollout::plans::FIELD_MANAGER;

/// The controller's name in metrics.
pub const CONTROLLER: &str = "release";

/// The status a release should carry.
pub fn release_status(release: &NodeRelease, now: Timestamp) -> NodeReleaseStatus {
    let revision = revision_of(&release.spec.content);
    let (valid, reason, message) = match release.validate() {
        Ok(()) => (
            true,
            Reason::ValidRelease,
            format!("valid; revision {revision}"),
        ),
        Err(problems) => (false, Reason::InvalidRelease, problems.to_string()),
    };
    let previous = release
        .status
        .as_ref()
        .map_or(&[][..], |s| s.conditions.as_slice());
    let valid = ConditionUpdate::new(release_condition::VALID, valid, reason, message);
    NodeReleaseStatus {
        observed_generation: release.metadata.generation,
        revision: Some(revision),
        conditions: vec![valid.into_condition(previous, release.metadata.generation, now)],
    }
}

/// Reconciles one release.
pub async fn reconcile(release: Arc<NodeRelease>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let name = release.name_any();
    let status = release_status(&release, Timestamp::now());
    if release.status.as_ref() != Some(&status) {
        let api: Api<NodeRelease> = Api::all(ctx.client.clone());
        let body = json!({ "status": status });
        ctx.metrics.wrote("release_status");
        api.patch_status(
            &name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            },
            &Patch::Merge(body),
        )
        .await
        .map_err(Error::kube(format!("writing the status of release {name}")))?;
        let was_valid = release
            .status
            .as_ref()
            .and_then(|s| s.conditions.first())
            .map(|c| c.status.clone());
        let condition = &status.conditions[0];
        if was_valid.as_deref() != Some(condition.status.as_str()) {
            let event = Event {
                type_: if condition.status == "True" {
                    EventType::Normal
                } else {
                    EventType::Warning
                },
                reason: condition.reason.clone(),
                note: Some(truncate(&condition.message)),
                action: "Validate".to_owned(),
                secondary: None,
            };
            ctx.metrics.wrote("event");
            if let Err(error) = ctx.recorder.publish(&event, &release.object_ref(&())).await {
                tracing::warn!(release = %name, %error, "could not publish an Event");
            }
        }
    }
    ctx.metrics.reconciled(CONTROLLER, started.elapsed());
    Ok(Action::requeue(ctx.settings.resync))
}

/// What to do after a failed reconcile: count it and try again soon.
pub fn error_policy(release: Arc<NodeRelease>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(CONTROLLER, error.metric_label());
    tracing::warn!(release = %release.name_any(), error = %error, "release reconcile failed");
    Action::requeue(std::time::Duration::from_secs(5))
}

/// Event notes are capped at 1 kB by the API.
pub fn truncate(text: &str) -> String {
    if text.len() <= 1000 {
        return text.to_owned();
    }
    let mut end = 1000;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(sha: &str) -> NodeRelease {
        serde_json::from_value(json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
            "metadata": {"name": "r", "generation": 2},
            "spec": {"version": "v1", "artifacts": [{
                "name": "kubernetes", "type": "Sysext",
                "url": "https://example.com/kubernetes.raw", "sha256": sha,
            }]},
        }))
        .unwrap()
    }

    #[test]
    fn valid_release_reports_its_revision() {
        let r = release(&"a".repeat(64));
        let s = release_status(&r, Timestamp::UNIX_EPOCH);
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!(
            s.revision.as_deref(),
            Some(revision_of(&r.spec.content).as_str())
        );
        assert_eq!(s.conditions[0].status, "True");
        assert_eq!(s.conditions[0].reason, "ValidRelease");
    }

    #[test]
    fn invalid_release_lists_its_problems_and_keeps_the_transition_time() {
        let mut r = release("NOT-HEX");
        let s = release_status(&r, Timestamp::UNIX_EPOCH);
        assert_eq!(s.conditions[0].status, "False");
        assert_eq!(s.conditions[0].reason, "InvalidRelease");
        assert!(
            s.conditions[0].message.contains("sha256"),
            "{}",
            s.conditions[0].message
        );
        r.status = Some(s.clone());
        let again = release_status(&r, Timestamp::now());
        assert_eq!(again, s, "same input, same status: no write");
    }

    #[test]
    fn long_notes_are_cut_on_a_character_boundary() {
        let text = "é".repeat(700);
        let cut = truncate(&text);
        assert!(cut.len() <= 1004);
        assert!(cut.ends_with('…'));
    }
}
