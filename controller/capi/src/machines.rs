//! Who may ask for an update: `UpdateMachine` acts only on what the management cluster says.
//! The request body is not proof (anyone who reaches the extension can send one), so the
//! Machine it names is read from the management API and must exist, be marked by Cluster
//! API as being updated in place (v1.12+: the update-in-progress annotation and
//! `UpdateMachine` among its pending hooks), and want what the request says; its Cluster must
//! exist. The node, cluster and version acted on are the stored Machine's.

use async_trait::async_trait;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use serde_json::Value;

use crate::error::Error;
use crate::target::MachineTarget;

/// Set by the controller that owns a Machine when it starts an in-place update; removed by
/// the Machine controller when the update is done.
pub const UPDATE_IN_PROGRESS_ANNOTATION: &str =
    "in-place-updates.internal.cluster.x-k8s.io/update-in-progress";
/// The lifecycle hooks Cluster API still has to call for a Machine, comma-separated.
pub const PENDING_HOOKS_ANNOTATION: &str = "runtime.cluster.x-k8s.io/pending-hooks";
const UPDATE_MACHINE_HOOK: &str = "UpdateMachine";

/// The management cluster's Machines and Clusters.
#[async_trait]
pub trait ManagementMachines: Send + Sync {
    /// The stored Machine `namespace/name`, if it exists.
    async fn machine(&self, namespace: &str, name: &str) -> Result<Option<Value>, Error>;
    /// Whether Cluster `namespace/name` exists.
    async fn cluster_exists(&self, namespace: &str, name: &str) -> Result<bool, Error>;
}

/// Machines and Clusters (`cluster.x-k8s.io/v1beta2`) read through a management client.
pub struct KubeMachines {
    management: kube::Client,
}

impl KubeMachines {
    /// Reads through `management`.
    pub fn new(management: kube::Client) -> Self {
        KubeMachines { management }
    }

    async fn get(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>, Error> {
        let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind);
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.management.clone(),
            namespace,
            &ApiResource::from_gvk(&gvk),
        );
        let object = api
            .get_opt(name)
            .await
            .map_err(|source| Error::Management {
                action: format!("reading {kind} {namespace}/{name}"),
                source,
            })?;
        object
            .map(|o| {
                serde_json::to_value(o).map_err(|e| {
                    Error::BadRequest(format!("{kind} {namespace}/{name} is unreadable: {e}"))
                })
            })
            .transpose()
    }
}

#[async_trait]
impl ManagementMachines for KubeMachines {
    async fn machine(&self, namespace: &str, name: &str) -> Result<Option<Value>, Error> {
        self.get("Machine", namespace, name).await
    }

    async fn cluster_exists(&self, namespace: &str, name: &str) -> Result<bool, Error> {
        Ok(self.get("Cluster", namespace, name).await?.is_some())
    }
}

/// The target to act on: the stored Machine's, when it is being updated in place by Cluster
/// API and agrees with what the request asks; otherwise why not.
pub fn verify_request(
    requested: &MachineTarget,
    stored: Option<&Value>,
) -> Result<MachineTarget, Error> {
    let key = format!("{}/{}", requested.namespace, requested.name);
    let refuse = |why: String| Error::NotUpdatingInPlace(format!("Machine {key}: {why}"));
    let stored = stored.ok_or_else(|| {
        refuse("does not exist in the management cluster; nothing was done".into())
    })?;
    let annotations = stored.pointer("/metadata/annotations");
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
    if annotation(UPDATE_IN_PROGRESS_ANNOTATION).is_none() {
        return Err(refuse(format!(
            "Cluster API is not updating it in place (no {UPDATE_IN_PROGRESS_ANNOTATION} annotation); nothing was done"
        )));
    }
    let pending = annotation(PENDING_HOOKS_ANNOTATION).unwrap_or_default();
    if !pending
        .split(',')
        .any(|hook| hook.trim() == UPDATE_MACHINE_HOOK)
    {
        return Err(refuse(format!(
            "Cluster API has no {UPDATE_MACHINE_HOOK} hook pending for it (annotation {PENDING_HOOKS_ANNOTATION} is {pending:?}); nothing was done"
        )));
    }
    let actual = MachineTarget::from_machine(stored)?;
    for (field, asked, stored) in [
        ("spec.version", &requested.version, &actual.version),
        ("cluster", &requested.cluster, &actual.cluster),
        ("status.nodeRef.name", &requested.node, &actual.node),
    ] {
        // Cluster API's requests carry no status: a node the request does not name is the
        // stored Machine's.
        let unnamed_node = field == "status.nodeRef.name" && asked.is_empty();
        if asked != stored && !unnamed_node {
            return Err(refuse(format!(
                "the request asks for {field} {asked}, the Machine has {stored}; nothing was done"
            )));
        }
    }
    Ok(actual)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(version: &str, annotations: Value) -> Value {
        json!({
            "metadata": {"name": "m1", "namespace": "ns", "annotations": annotations,
                         "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"version": version},
            "status": {"nodeRef": {"name": "node-1"}},
        })
    }

    fn marked() -> Value {
        json!({UPDATE_IN_PROGRESS_ANNOTATION: "", PENDING_HOOKS_ANNOTATION: "UpdateMachine"})
    }

    fn requested(version: &str) -> MachineTarget {
        MachineTarget::from_machine(&stored(version, json!({}))).unwrap()
    }

    #[test]
    fn a_marked_machine_that_wants_what_the_request_says_is_the_target() {
        let machine = stored("v1.31.2", marked());
        let target = verify_request(&requested("v1.31.2"), Some(&machine)).unwrap();
        assert_eq!(target, requested("v1.31.2"));
        let other_hooks = stored(
            "v1.31.2",
            json!({UPDATE_IN_PROGRESS_ANNOTATION: "", PENDING_HOOKS_ANNOTATION: "AfterControlPlaneUpgrade, UpdateMachine"}),
        );
        verify_request(&requested("v1.31.2"), Some(&other_hooks)).unwrap();
    }

    #[test]
    fn a_request_without_status_acts_on_the_stored_machine_s_node() {
        // What Cluster API sends: the Machine's metadata and spec, never its status.
        let mut sent = stored("v1.31.2", marked());
        sent.as_object_mut().unwrap().remove("status");
        let requested = MachineTarget::from_request(&sent).unwrap();
        assert_eq!(requested.node, "");
        let target = verify_request(&requested, Some(&stored("v1.31.2", marked()))).unwrap();
        assert_eq!(target.node, "node-1");
    }

    #[test]
    fn forged_requests_are_refused_saying_why() {
        let cases = [
            (None, "does not exist in the management cluster"),
            (
                Some(stored("v1.31.2", json!({}))),
                "is not updating it in place",
            ),
            (
                Some(stored(
                    "v1.31.2",
                    json!({UPDATE_IN_PROGRESS_ANNOTATION: ""}),
                )),
                "no UpdateMachine hook pending",
            ),
            (
                Some(stored("v1.31.1", marked())),
                "asks for spec.version v1.31.2, the Machine has v1.31.1",
            ),
        ];
        for (machine, why) in cases {
            let error = verify_request(&requested("v1.31.2"), machine.as_ref()).unwrap_err();
            assert_eq!(error.kind(), "NotUpdatingInPlace");
            assert!(!error.is_transient());
            let text = error.to_string();
            assert!(
                text.starts_with("Machine ns/m1: ") && text.contains(why),
                "{text}"
            );
        }
    }
}
