//! The NodeUpdatePlan as the controller decodes it from the API server ([`WatchedPlan`]):
//! only what it reads. Every agent report and every apply response is a whole plan, and a
//! 30,000-node rollout decodes hundreds of thousands of them; the generated type decodes
//! the managed fields (a third of the object) and the release content copied into the
//! spec (through serde's `flatten`, which buffers every field of the spec first), which
//! the controller then dropped unread. Decoded this way, both are skipped by the parser
//! and never built. The reflector's store and the rest of the controller keep the
//! generated [`NodeUpdatePlan`], its content and the agent's per-artifact progress empty.

use std::borrow::Cow;
use std::collections::BTreeMap;

use inplace_proto::{
    Activation, DesiredState, HealthChecks, NodeUpdatePlan, NodeUpdatePlanSpec,
    NodeUpdatePlanStatus, UpdateContent,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use kube::runtime::watcher;
use serde::Deserialize;

/// A NodeUpdatePlan without its managed fields and its release content.
#[derive(Debug, Clone, Deserialize)]
pub struct WatchedPlan {
    #[serde(deserialize_with = "meta_without_managed_fields")]
    metadata: ObjectMeta,
    spec: WatchedSpec,
    #[serde(default)]
    status: Option<NodeUpdatePlanStatus>,
}

/// The spec's fields but the copied release content.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchedSpec {
    node_name: String,
    #[serde(default)]
    revision: Option<String>,
    #[serde(default)]
    release: Option<String>,
    #[serde(default)]
    desired_state: DesiredState,
    #[serde(default)]
    allow_downgrade: bool,
}

/// The metadata the controller and kube's watcher read; `managedFields` is not among them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchedMeta {
    name: Option<String>,
    uid: Option<String>,
    generation: Option<i64>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    owner_references: Option<Vec<OwnerReference>>,
    finalizers: Option<Vec<String>>,
}

fn meta_without_managed_fields<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<ObjectMeta, D::Error> {
    let meta = WatchedMeta::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: meta.name,
        uid: meta.uid,
        generation: meta.generation,
        resource_version: meta.resource_version,
        labels: meta.labels,
        annotations: meta.annotations,
        creation_timestamp: meta.creation_timestamp,
        deletion_timestamp: meta.deletion_timestamp,
        owner_references: meta.owner_references,
        finalizers: meta.finalizers,
        ..ObjectMeta::default()
    })
}

impl Resource for WatchedPlan {
    type DynamicType = ();
    type Scope = <NodeUpdatePlan as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        NodeUpdatePlan::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        NodeUpdatePlan::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        NodeUpdatePlan::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        NodeUpdatePlan::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<WatchedPlan> for NodeUpdatePlan {
    fn from(watched: WatchedPlan) -> Self {
        let WatchedSpec {
            node_name,
            revision,
            release,
            desired_state,
            allow_downgrade,
        } = watched.spec;
        let mut plan = NodeUpdatePlan::new(
            "",
            NodeUpdatePlanSpec {
                node_name,
                revision,
                release,
                desired_state,
                allow_downgrade,
                content: no_content(),
            },
        );
        plan.metadata = watched.metadata;
        plan.status = watched.status.map(|mut status| {
            // The agent's per-artifact progress: never read by the controller.
            status.artifacts.clear();
            status
        });
        plan
    }
}

/// The content a watched plan carries: none (the controller never reads it back).
fn no_content() -> UpdateContent {
    UpdateContent {
        kubernetes_version: None,
        artifacts: Vec::new(),
        agent: None,
        activation: Activation::default(),
        health_checks: HealthChecks::default(),
    }
}

/// A watch event of the slim decoding as an event of the generated type.
pub fn plan_event(event: watcher::Event<WatchedPlan>) -> watcher::Event<NodeUpdatePlan> {
    match event {
        watcher::Event::Apply(p) => watcher::Event::Apply(p.into()),
        watcher::Event::Delete(p) => watcher::Event::Delete(p.into()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(p) => watcher::Event::InitApply(p.into()),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plan_decodes_without_managed_fields_and_content_and_keeps_the_rest() {
        let wire = json!({
            "apiVersion": "inplace.dev/v1alpha1",
            "kind": "NodeUpdatePlan",
            "metadata": {
                "name": "n1", "uid": "u1", "generation": 3, "resourceVersion": "42",
                "labels": {"inplace.dev/rollout": "r"},
                "annotations": {"inplace.dev/activation-granted": "2026-01-01T00:00:00Z"},
                "managedFields": [{"manager": "inplace-controller", "operation": "Apply",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
            },
            "spec": {
                "nodeName": "n1", "revision": "rev", "release": "v2",
                "desiredState": "Active", "allowDowngrade": true,
                "artifacts": [{"name": "a", "type": "Sysext", "url": "https://example.invalid/a",
                               "sha256": "0".repeat(64)}],
            },
            "status": {"phase": "Staged", "targetRevision": "rev", "observedGeneration": 3},
        });
        let full: NodeUpdatePlan = serde_json::from_value(wire.clone()).unwrap();
        let slim: NodeUpdatePlan = serde_json::from_value::<WatchedPlan>(wire).unwrap().into();

        assert_eq!(slim.metadata.managed_fields, None);
        assert!(slim.spec.content.artifacts.is_empty());
        let mut expected = full;
        expected.metadata.managed_fields = None;
        expected.spec.content = no_content();
        assert_eq!(
            serde_json::to_value(&slim).unwrap(),
            serde_json::to_value(&expected).unwrap()
        );
    }

    #[test]
    fn events_keep_their_kind() {
        let plan: WatchedPlan = serde_json::from_value(json!({
            "metadata": {"name": "n1"}, "spec": {"nodeName": "n1"},
        }))
        .unwrap();
        let converted = plan_event(watcher::Event::Delete(plan));
        assert!(matches!(converted, watcher::Event::Delete(p) if p.spec.node_name == "n1"));
        assert!(matches!(
            plan_event(watcher::Event::InitDone),
            watcher::Event::InitDone
        ));
    }
}
