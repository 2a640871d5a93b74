//! Which Machine, Cluster and node a hook call is about, read from Cluster API's objects.

use serde_json::Value;

use crate::error::Error;

/// The label Cluster API puts on every Machine: the name of its Cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// What `UpdateMachine` reads from the Machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineTarget {
    /// The Machine's namespace (also the Cluster's and the kubeconfig Secret's).
    pub namespace: String,
    /// The Machine's name.
    pub name: String,
    /// The Cluster's name (label `cluster.x-k8s.io/cluster-name`, else `spec.clusterName`).
    pub cluster: String,
    /// The workload node (`status.nodeRef.name`).
    pub node: String,
    /// The desired Kubernetes version (`spec.version`).
    pub version: String,
    /// Whether it is a control-plane Machine (see `claim::control_plane`).
    pub control_plane: bool,
}

impl MachineTarget {
    /// Reads the target from a full Machine object as the management cluster holds it, or
    /// says what is missing.
    pub fn from_machine(machine: &Value) -> Result<Self, Error> {
        let target = Self::from_request(machine)?;
        if target.node.is_empty() {
            return Err(Error::BadRequest(format!(
                "Machine {} has no status.nodeRef.name: the node has not joined the workload cluster, so there is nothing to update in place",
                target.name
            )));
        }
        Ok(target)
    }

    /// Reads what an `UpdateMachine` request asks for. Cluster API sends the Machine
    /// without its status, so `node` is empty unless the request names one: the node acted
    /// on is always the stored Machine's (see `machines::verify_request`).
    pub fn from_request(machine: &Value) -> Result<Self, Error> {
        if !machine.is_object() {
            return Err(Error::BadRequest(
                "the request carries no desired.machine object".into(),
            ));
        }
        let name = text(machine, "/metadata/name").unwrap_or_else(|| "(unnamed)".into());
        let missing = |what: &str| Error::BadRequest(format!("Machine {name} has no {what}"));
        let namespace =
            text(machine, "/metadata/namespace").ok_or_else(|| missing("metadata.namespace"))?;
        let cluster = cluster_name(machine).ok_or_else(|| {
            missing(&format!(
                "label {CLUSTER_NAME_LABEL} (nor spec.clusterName)"
            ))
        })?;
        let version = text(machine, "/spec/version").ok_or_else(|| missing("spec.version"))?;
        Ok(MachineTarget {
            namespace,
            name,
            cluster,
            node: text(machine, "/status/nodeRef/name").unwrap_or_default(),
            version,
            control_plane: crate::claim::control_plane::is_control_plane(machine),
        })
    }
}

/// `(namespace, cluster name)` of a Machine or MachineSet.
pub fn cluster_of(object: &Value) -> Option<(String, String)> {
    Some((text(object, "/metadata/namespace")?, cluster_name(object)?))
}

/// The Cluster an object belongs to: its `cluster.x-k8s.io/cluster-name` label, else
/// `spec.clusterName` (both are set by Cluster API; older objects may carry only one).
fn cluster_name(object: &Value) -> Option<String> {
    object
        .pointer("/metadata/labels")
        .and_then(|labels| labels.get(CLUSTER_NAME_LABEL))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .or_else(|| text(object, "/spec/clusterName"))
}

/// A non-empty string field, by JSON pointer.
fn text(object: &Value, pointer: &str) -> Option<String> {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn machine() -> Value {
        json!({
            "metadata": {"name": "w-1", "namespace": "ns1",
                         "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"clusterName": "c1", "version": "v1.31.2"},
            "status": {"nodeRef": {"name": "node-1"}}
        })
    }

    #[test]
    fn a_full_machine_gives_its_target() {
        assert_eq!(
            MachineTarget::from_machine(&machine()).unwrap(),
            MachineTarget {
                namespace: "ns1".into(),
                name: "w-1".into(),
                cluster: "c1".into(),
                node: "node-1".into(),
                version: "v1.31.2".into(),
                control_plane: false,
            }
        );
    }

    #[test]
    fn the_cluster_name_falls_back_to_spec_cluster_name() {
        let mut m = machine();
        m["metadata"].as_object_mut().unwrap().remove("labels");
        assert_eq!(MachineTarget::from_machine(&m).unwrap().cluster, "c1");
    }

    #[test]
    fn missing_fields_are_named() {
        type Edit = fn(&mut Value);
        let cases: [(&str, Edit); 4] = [
            ("status.nodeRef.name", |m| {
                m.as_object_mut().unwrap().remove("status");
            }),
            ("spec.version", |m| {
                m["spec"].as_object_mut().unwrap().remove("version");
            }),
            ("metadata.namespace", |m| {
                m["metadata"].as_object_mut().unwrap().remove("namespace");
            }),
            ("label cluster.x-k8s.io/cluster-name", |m| {
                m["metadata"].as_object_mut().unwrap().remove("labels");
                m["spec"].as_object_mut().unwrap().remove("clusterName");
            }),
        ];
        for (what, edit) in cases {
            let mut m = machine();
            edit(&mut m);
            let error = MachineTarget::from_machine(&m).unwrap_err();
            assert!(error.to_string().contains(what), "{what}: {error}");
            assert!(error.to_string().contains("Machine w-1"), "{error}");
            assert!(!error.is_transient());
        }
        assert!(MachineTarget::from_machine(&Value::Null).is_err());
    }
}
