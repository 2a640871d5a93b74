//! Cluster API's Machines on the real-node bed as a test reads them: listing, conditions,
//! identities (name, UID, Node) and a watch of what they and the Nodes showed during a
//! rollout.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use serde_json::Value;

/// Cluster API's Machines (v1beta2) in every namespace.
pub fn machine_api(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// A v1beta2 condition's status, reason and message.
pub fn condition(object: &Value, kind: &str) -> Option<(String, String, String)> {
    let found = object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?;
    let text = |field: &str| found[field].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

/// Each Machine's name → (UID, Node), once every Machine of the MachineDeployment has its
/// Node.
pub fn identities(
    machines: &[DynamicObject],
    count: usize,
) -> Option<BTreeMap<String, (String, String)>> {
    let found: BTreeMap<String, (String, String)> = machines
        .iter()
        .filter_map(|m| {
            let node = m.data["status"]["nodeRef"]["name"].as_str()?;
            Some((
                m.metadata.name.clone()?,
                (m.metadata.uid.clone()?, node.to_owned()),
            ))
        })
        .collect();
    (found.len() == count && machines.len() == count).then_some(found)
}

/// What the Machines and Nodes showed while watched: every Machine UID that existed, every
/// message of a Machine's `Updating` condition while it was `True`, the most Machines
/// `Updating` at once, and each Node's longest spell not `Ready`; until dropped.
pub struct MachineWatch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

/// What a [`MachineWatch`] has seen so far.
#[derive(Default, Clone)]
pub struct Seen {
    /// Every Machine UID that existed.
    pub uids: BTreeSet<String>,
    /// Every message of a Machine's `Updating` condition while it was `True`.
    pub updating: BTreeSet<String>,
    /// The most Machines `Updating` at once.
    pub most_updating: usize,
    /// Node → when its current spell not `Ready` began.
    pub not_ready_since: BTreeMap<String, Instant>,
    /// Node → its longest spell not `Ready` so far.
    pub longest_not_ready: BTreeMap<String, Duration>,
}

impl Seen {
    fn machines(&mut self, machines: Vec<DynamicObject>) {
        let mut updating = 0;
        for machine in machines {
            self.uids.extend(machine.metadata.uid.clone());
            if let Some((status, _, message)) = condition(&machine.data, "Updating")
                && status == "True"
            {
                self.updating.insert(message);
                updating += 1;
            }
        }
        self.most_updating = self.most_updating.max(updating);
    }

    fn nodes(&mut self, nodes: Vec<Node>) {
        for node in nodes {
            let name = node.metadata.name.unwrap_or_default();
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                if let Some(since) = self.not_ready_since.remove(&name) {
                    let longest = self.longest_not_ready.entry(name).or_default();
                    *longest = (*longest).max(since.elapsed());
                }
            } else {
                self.not_ready_since
                    .entry(name)
                    .or_insert_with(Instant::now);
            }
        }
    }
}

impl MachineWatch {
    /// Watches the Machines and Nodes `client` reaches, every half second.
    pub fn start(client: kube::Client) -> MachineWatch {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let api = machine_api(&client);
            let nodes: Api<Node> = Api::all(client.clone());
            loop {
                if let Ok(list) = api.list(&ListParams::default()).await {
                    record
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .machines(list.items);
                }
                if let Ok(list) = nodes.list(&ListParams::default()).await {
                    record
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .nodes(list.items);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        MachineWatch { seen, task }
    }

    /// What has been seen so far.
    pub fn seen(&self) -> Seen {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for MachineWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
