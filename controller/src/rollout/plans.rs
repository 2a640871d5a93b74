//! Between a NodeUpdatePlan object and the decision's plain data: reading what the plan
//! says ([`plan_view`]), writing what the controller wants ([`plan_apply_body`], applied
//! server-side with the controller's own field manager and never touching status), and
//! remembering recent writes until the watch cache catches up ([`RecentWrites`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use inplace_proto::reason::plan_condition;
use inplace_proto::{NodeReleaseSpec, NodeUpdatePlan, NodeUpdatePlanSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;

use crate::decision::{
    CORDONED_ANNOTATION, DRAIN_SKIPPED_ANNOTATION, DRAIN_TIMEOUT_ANNOTATION, DrainTimedOut,
    GRANTED_ANNOTATION, PlanIntent, PlanReport, PlanView, READY_SINCE_ANNOTATION, ROLLOUT_LABEL,
};

/// The field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "inplace-controller";

/// What the decision needs from a plan object.
pub fn plan_view(plan: &NodeUpdatePlan) -> PlanView {
    let annotations = plan.metadata.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key));
    let status = plan.status.as_ref();
    let ready =
        status.and_then(|s| inplace_proto::condition::find(&s.conditions, plan_condition::READY));
    PlanView {
        intent: PlanIntent {
            revision: plan.spec.revision.as_deref().unwrap_or_default().into(),
            desired_state: plan.spec.desired_state,
            granted_at: annotation(GRANTED_ANNOTATION).and_then(|t| t.parse::<Timestamp>().ok()),
            ready_since: annotation(READY_SINCE_ANNOTATION)
                .and_then(|t| t.parse::<Timestamp>().ok()),
            cordoned: inplace_drain::cordon::is_recorded(annotations),
            drain_timeout: drain_timed_out(annotation),
            allow_downgrade: plan.spec.allow_downgrade,
        },
        retry_pending: inplace_proto::steering::pending_retry(
            annotations,
            status.and_then(|s| s.retry_honoured.as_deref()),
        )
        .is_some(),
        report: PlanReport {
            phase: status.and_then(|s| s.phase),
            target_revision: status.and_then(|s| s.target_revision.as_deref().map(Arc::from)),
            current_revision: status.and_then(|s| s.current_revision.as_deref().map(Arc::from)),
            reason: ready.map(|c| c.reason.clone()),
            message: ready.map(|c| c.message.clone()),
            observed_generation: status.and_then(|s| s.observed_generation),
            plan_generation: plan.metadata.generation,
            degraded: status.is_some_and(|s| s.agent_report().degraded),
        },
    }
}

/// A drain that timed out, from its annotation (a failure wins over a skip).
fn drain_timed_out<'a>(annotation: impl Fn(&str) -> Option<&'a String>) -> Option<DrainTimedOut> {
    let record = |message: &String, skipped| DrainTimedOut {
        message: message.clone(),
        skipped,
    };
    annotation(DRAIN_TIMEOUT_ANNOTATION)
        .map(|m| record(m, false))
        .or_else(|| annotation(DRAIN_SKIPPED_ANNOTATION).map(|m| record(m, true)))
}

/// The rollout that owns a plan, from its label.
pub fn plan_owner(plan: &NodeUpdatePlan) -> Option<&str> {
    plan.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ROLLOUT_LABEL))
        .map(String::as_str)
}

/// Where a plan comes from and belongs to.
pub struct PlanSource<'a> {
    /// The owning rollout.
    pub rollout: &'a str,
    /// The release name (`spec.release`).
    pub release: &'a str,
    /// The release's spec; its content is copied into the plan.
    pub release_spec: &'a NodeReleaseSpec,
    /// The node's name.
    pub node: &'a str,
    /// The node's uid, for the owner reference (the plan is garbage-collected with it).
    pub node_uid: &'a str,
}

/// The body of a server-side apply of a plan: spec, the owner label, the controller's
/// annotations and an owner reference to the Node. Never status. Typed, not a JSON value:
/// a large rollout applies tens of thousands of these, and building, writing and
/// dropping a value tree for each was a tenth of the controller's CPU.
pub fn plan_apply_body(source: &PlanSource<'_>, intent: &PlanIntent) -> NodeUpdatePlan {
    let mut spec = NodeUpdatePlanSpec::for_release_at(
        source.node,
        source.release,
        source.release_spec,
        &intent.revision,
        intent.desired_state,
    );
    spec.allow_downgrade = intent.allow_downgrade;
    let mut annotations = BTreeMap::new();
    let mut annotate = |key: &str, value: String| annotations.insert(key.to_owned(), value);
    if let Some(at) = intent.granted_at {
        annotate(GRANTED_ANNOTATION, at.to_string());
    }
    if let Some(at) = intent.ready_since {
        annotate(READY_SINCE_ANNOTATION, at.to_string());
    }
    if intent.cordoned {
        annotate(CORDONED_ANNOTATION, "true".to_owned());
    }
    if let Some(timed_out) = &intent.drain_timeout {
        let key = if timed_out.skipped {
            DRAIN_SKIPPED_ANNOTATION
        } else {
            DRAIN_TIMEOUT_ANNOTATION
        };
        annotate(key, timed_out.message.clone());
    }
    let mut plan = NodeUpdatePlan::new(source.node, spec);
    plan.metadata.labels = Some(BTreeMap::from([(
        ROLLOUT_LABEL.to_owned(),
        source.rollout.to_owned(),
    )]));
    plan.metadata.annotations = Some(annotations);
    plan.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: source.node.to_owned(),
        uid: source.node_uid.to_owned(),
        controller: Some(false),
        block_owner_deletion: Some(false),
    }]);
    plan
}

/// Drops what the controller never reads from a cached Node (managed fields, annotations
/// but a person's steering and the autoscaler's scale-down, all of the status but the
/// `Ready` condition and the kubelet's version): it needs the name, uid, labels,
/// `spec.unschedulable`, the `inplace.dev/hold` and `inplace.dev/skip` annotations, the
/// scale-down annotation and inplace's mark of it (`decision/autoscaler.rs`), FLUO's
/// `reboot-needed` and `reboot-ok` (`decision/fluo.rs`), readiness
/// (the health gate) and the kubelet's version (the skew guard).
pub fn slim_node(node: &mut k8s_openapi::api::core::v1::Node) {
    use crate::decision::{
        SCALE_DOWN_DISABLED_ANNOTATION, SCALE_DOWN_MARK_ANNOTATION, fleetlock, fluo,
    };
    use inplace_proto::steering::{HOLD_ANNOTATION, SKIP_ANNOTATION};
    node.metadata.managed_fields = None;
    node.metadata.annotations = node
        .metadata
        .annotations
        .take()
        .map(|mut a| {
            a.retain(|k, _| {
                [
                    HOLD_ANNOTATION,
                    SKIP_ANNOTATION,
                    SCALE_DOWN_DISABLED_ANNOTATION,
                    SCALE_DOWN_MARK_ANNOTATION,
                    fluo::REBOOT_NEEDED,
                    fluo::REBOOT_OK,
                    fleetlock::HOLDER_ANNOTATION,
                ]
                .contains(&k.as_str())
            });
            a
        })
        .filter(|a| !a.is_empty());
    node.status = crate::rollout::node_readiness::slim_status(node.status.take());
}

#[derive(Debug, Clone)]
struct Written {
    uid: String,
    generation: i64,
    view: PlanView,
    at: std::time::Instant,
}

/// How long a remembered write may stand in for the cache at most (a safety net: the
/// watch delivers our own writes within moments).
const REMEMBER_AT_MOST: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether two views agree on every field the controller writes.
fn same_controller_fields(a: &PlanView, b: &PlanView) -> bool {
    a.intent.revision == b.intent.revision
        && a.intent.desired_state == b.intent.desired_state
        && a.intent.granted_at == b.intent.granted_at
        && a.intent.ready_since == b.intent.ready_since
        && a.intent.cordoned == b.intent.cordoned
        && a.intent.drain_timeout == b.intent.drain_timeout
        && a.intent.allow_downgrade == b.intent.allow_downgrade
}

/// Plans the controller wrote whose new state the watch cache may not show yet. Without
/// it a reconcile that runs before the cache catches up would see a slot as free that it
/// has just granted.
#[derive(Debug, Default)]
pub struct RecentWrites {
    plans: Mutex<HashMap<String, Written>>,
}

impl RecentWrites {
    /// Records the plan the API server returned after an apply.
    pub fn record(&self, written: &NodeUpdatePlan) {
        let (Some(name), Some(uid)) = (written.metadata.name.clone(), written.metadata.uid.clone())
        else {
            return;
        };
        let view = plan_view(written);
        self.lock().insert(
            name,
            Written {
                uid,
                generation: written.metadata.generation.unwrap_or(0),
                view,
                at: std::time::Instant::now(),
            },
        );
    }

    /// The plan as the decision should see it: the cached one once it shows our last
    /// write (annotation-only writes do not bump the generation, so the written fields
    /// themselves are compared), else the written fields with the cached agent report.
    pub fn current(&self, name: &str, cached: Option<&NodeUpdatePlan>) -> Option<PlanView> {
        let mut plans = self.lock();
        let Some(written) = plans.get(name) else {
            return cached.map(plan_view);
        };
        let Some(plan) = cached else {
            return Some(written.view.clone());
        };
        let seen = plan_view(plan);
        let caught_up = plan.metadata.uid.as_deref() != Some(written.uid.as_str())
            || plan.metadata.generation.unwrap_or(0) > written.generation
            || same_controller_fields(&seen, &written.view)
            || written.at.elapsed() > REMEMBER_AT_MOST;
        if caught_up {
            plans.remove(name);
            return Some(seen);
        }
        let mut view = written.view.clone();
        // A person's token and the agent's report from the cache, the report judged
        // against the generation we wrote.
        view.retry_pending = seen.retry_pending;
        view.report = PlanReport {
            plan_generation: view.report.plan_generation,
            ..seen.report
        };
        Some(view)
    }

    /// Forgets a plan (its node is gone).
    pub fn forget(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        self.plans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inplace_proto::{DesiredState, NodeUpdatePlanStatus, Phase};
    use serde_json::{Value, json};

    fn content() -> NodeReleaseSpec {
        serde_json::from_value(json!({
            "version": "v1",
            "artifacts": [{
                "name": "kubernetes", "type": "Sysext",
                "url": "https://example.com/k.raw",
                "sha256": "0".repeat(64),
            }],
        }))
        .unwrap()
    }

    fn source(content: &NodeReleaseSpec) -> PlanSource<'_> {
        PlanSource {
            rollout: "ro",
            release: "rel",
            release_spec: content,
            node: "n1",
            node_uid: "uid-1",
        }
    }

    fn intent() -> PlanIntent {
        PlanIntent {
            revision: "abc".into(),
            desired_state: DesiredState::Active,
            granted_at: Some("2026-11-22T03:00:00Z".parse().unwrap()),
            ready_since: Some("2026-11-22T03:10:00Z".parse().unwrap()),
            cordoned: true,
            drain_timeout: None,
            allow_downgrade: true,
        }
    }

    #[test]
    fn apply_body_round_trips_through_the_view() {
        let content = content();
        let source = source(&content);
        let body = serde_json::to_value(plan_apply_body(&source, &intent())).unwrap();
        assert_eq!(body["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(body["metadata"]["labels"][ROLLOUT_LABEL], "ro");
        assert_eq!(body["spec"]["desiredState"], "Active");
        assert_eq!(body["spec"]["nodeName"], "n1");
        assert!(body.get("status").is_none());
        let plan: NodeUpdatePlan = serde_json::from_value(body).unwrap();
        let view = plan_view(&plan);
        assert_eq!(view.intent.granted_at, intent().granted_at);
        assert_eq!(view.intent.ready_since, intent().ready_since);
        assert!(view.intent.cordoned);
        assert_eq!(view.intent.desired_state, DesiredState::Active);
        assert!(
            view.intent.allow_downgrade,
            "the rollout's allowDowngrade reaches the plan"
        );
        assert_eq!(plan_owner(&plan), Some("ro"));
    }

    /// The exact body the earlier JSON-value builder sent (server-side apply owns every
    /// field in it, so a field more or less would change what the controller owns).
    #[test]
    fn the_apply_body_is_exactly_the_fields_the_controller_owns() {
        let content = content();
        let source = source(&content);
        let wire = |annotations: Value, spec: Value| {
            json!({
                "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan",
                "metadata": {
                    "name": "n1",
                    "labels": {ROLLOUT_LABEL: "ro"},
                    "annotations": annotations,
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1",
                        "uid": "uid-1", "controller": false, "blockOwnerDeletion": false}],
                },
                "spec": spec,
            })
        };
        let artifacts = json!([{"name": "kubernetes", "type": "Sysext",
            "url": "https://example.com/k.raw", "sha256": "0".repeat(64)}]);

        let full = serde_json::to_value(plan_apply_body(&source, &intent())).unwrap();
        let expected = wire(
            json!({
                GRANTED_ANNOTATION: "2026-11-22T03:00:00Z",
                READY_SINCE_ANNOTATION: "2026-11-22T03:10:00Z",
                CORDONED_ANNOTATION: "true",
            }),
            json!({"nodeName": "n1", "revision": "abc", "release": "rel",
                   "desiredState": "Active", "allowDowngrade": true, "artifacts": artifacts,
                   "activation": {}, "healthChecks": {"timeout": "300s", "window": "30s"}}),
        );
        assert_eq!(full, expected);

        let bare = PlanIntent {
            desired_state: DesiredState::Staged,
            granted_at: None,
            ready_since: None,
            cordoned: false,
            allow_downgrade: false,
            drain_timeout: Some(DrainTimedOut {
                message: "pod p blocked".to_owned(),
                skipped: true,
            }),
            ..intent()
        };
        let bare = serde_json::to_value(plan_apply_body(&source, &bare)).unwrap();
        let expected = wire(
            json!({DRAIN_SKIPPED_ANNOTATION: "pod p blocked"}),
            json!({"nodeName": "n1", "revision": "abc", "release": "rel",
                   "desiredState": "Staged", "artifacts": artifacts,
                   "activation": {}, "healthChecks": {"timeout": "300s", "window": "30s"}}),
        );
        assert_eq!(bare, expected);
    }

    #[test]
    fn recent_writes_cover_a_stale_cache_until_it_catches_up() {
        let content = content();
        let source = source(&content);
        let mut old: NodeUpdatePlan = plan_apply_body(&source, &intent());
        old.metadata.uid = Some("p1".into());
        old.metadata.generation = Some(1);
        old.spec.desired_state = DesiredState::Staged;
        old.status = Some(NodeUpdatePlanStatus {
            phase: Some(Phase::Staged),
            ..Default::default()
        });
        let mut new = old.clone();
        new.metadata.generation = Some(2);
        new.spec.desired_state = DesiredState::Active;

        let writes = RecentWrites::default();
        writes.record(&new);
        let seen = writes.current("n1", Some(&old)).unwrap();
        assert_eq!(seen.intent.desired_state, DesiredState::Active);
        assert_eq!(
            seen.report.phase,
            Some(Phase::Staged),
            "report from the cache"
        );
        // Not cached at all yet.
        assert!(writes.current("n1", None).is_some());
        // Caught up: the cache wins and the record is dropped.
        let seen = writes.current("n1", Some(&new)).unwrap();
        assert_eq!(seen.intent.desired_state, DesiredState::Active);
        assert_eq!(
            writes
                .current("n1", Some(&old))
                .unwrap()
                .intent
                .desired_state,
            DesiredState::Staged
        );
    }
}
