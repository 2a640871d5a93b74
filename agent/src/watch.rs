//! Watches this node's NodeUpdatePlan only (`fieldSelector=metadata.name=<node>`): no
//! polling. kube-runtime's watcher relists on `410 Gone` and backs off during outages; the
//! latest plan is published on a channel, changed only when the plan's identity,
//! generation, spec or retry token (`inplace.dev/retry`) changes (our own status writes do
//! not wake the coordinator).

use futures::StreamExt;
use inplace_proto::NodeUpdatePlan;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

/// What the coordinator knows about the plan: `None` until the first list completed,
/// then `Some(None)` (no plan) or `Some(Some(plan))`.
pub type PlanState = Option<Option<NodeUpdatePlan>>;

/// Whether two plans call for the same work (status, resourceVersion and annotations but
/// the retry token ignored: a person's token does not bump the generation).
pub fn same_work(a: &Option<NodeUpdatePlan>, b: &Option<NodeUpdatePlan>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.metadata.uid == b.metadata.uid
                && a.metadata.generation == b.metadata.generation
                && a.spec == b.spec
                && retry_token(a) == retry_token(b)
        }
        _ => false,
    }
}

fn retry_token(plan: &NodeUpdatePlan) -> Option<&str> {
    inplace_proto::steering::pending_retry(plan.metadata.annotations.as_ref(), None)
}

/// Runs the watch until the receiver is dropped.
pub async fn run(api: kube::Api<NodeUpdatePlan>, node: String, tx: watch::Sender<PlanState>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    // During a relist: whether the plan showed up.
    let mut listed: Option<Option<NodeUpdatePlan>> = None;
    let publish = |plan: Option<NodeUpdatePlan>| {
        tx.send_if_modified(|state| match state {
            Some(current) if same_work(current, &plan) => false,
            _ => {
                *state = Some(plan);
                true
            }
        });
    };
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => listed = Some(None),
            Ok(Event::InitApply(plan)) => {
                if plan.metadata.name.as_deref() == Some(node.as_str()) {
                    listed = Some(Some(plan));
                }
            }
            Ok(Event::InitDone) => publish(listed.take().flatten()),
            Ok(Event::Apply(plan)) => {
                if plan.metadata.name.as_deref() == Some(node.as_str()) {
                    publish(Some(plan));
                }
            }
            Ok(Event::Delete(plan)) => {
                if plan.metadata.name.as_deref() == Some(node.as_str()) {
                    publish(None);
                }
            }
            Err(e) => tracing::warn!(error = %e, "plan watch error; retrying"),
        }
        if tx.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(uid: &str, generation: i64, desired: &str) -> NodeUpdatePlan {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan",
            "metadata": {"name": "n", "uid": uid, "generation": generation, "resourceVersion": "1"},
            "spec": {"nodeName": "n", "desiredState": desired, "artifacts": [
                {"name": "k", "type": "Sysext", "url": "https://x/k.raw", "sha256": "0".repeat(64)}]},
        }))
        .unwrap()
    }

    #[test]
    fn status_writes_are_not_new_work_but_spec_identity_and_retry_token_changes_are() {
        let a = plan("u1", 1, "Staged");
        let mut status_only = a.clone();
        status_only.metadata.resource_version = Some("2".into());
        status_only.status = Some(Default::default());
        assert!(same_work(&Some(a.clone()), &Some(status_only)));
        assert!(!same_work(&Some(a.clone()), &Some(plan("u1", 2, "Active"))));
        assert!(
            !same_work(&Some(a.clone()), &Some(plan("u2", 1, "Staged"))),
            "recreated"
        );
        assert!(!same_work(&Some(a.clone()), &None));
        let mut retried = a.clone();
        retried.metadata.annotations = Some(
            [(
                inplace_proto::steering::RETRY_ANNOTATION.to_owned(),
                "t1".to_owned(),
            )]
            .into(),
        );
        assert!(
            !same_work(&Some(a.clone()), &Some(retried)),
            "a retry token is new work"
        );
        assert!(same_work(&None, &None));
    }
}
