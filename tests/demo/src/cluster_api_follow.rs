//! What `--cluster-api` tells while Cluster API rolls the version out: each distinct hook
//! call the extension answered (from its log), each Machine's `Updating` message and when it
//! is up to date, each Node's kubelet version as it changes, and any Machine that appears;
//! until the MachineDeployment is rolled out with every Machine done
//! ([`deployment::updated`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use inplace_tests::capi::deployment::{self, DeploymentBed, TO};
use inplace_tests::capi::machines::condition;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams};

/// The hooks, longest name first: `UpdateMachine:` is also the end of `CanUpdateMachine:`.
const HOOKS: [(&str, &str); 3] = [
    (
        "CanUpdateMachineSet: ",
        "Cluster API asked the extension whether the new MachineSet can be reached in place (CanUpdateMachineSet); it answered:",
    ),
    (
        "CanUpdateMachine: ",
        "Cluster API asked the extension whether a Machine can be updated in place (CanUpdateMachine); it answered:",
    ),
    (
        "UpdateMachine: ",
        "Cluster API called UpdateMachine; the extension answered:",
    ),
];

/// What has been told so far.
#[derive(Default)]
struct Told {
    hooks: BTreeSet<String>,
    /// Machine → its last `Updating` message told.
    updating: BTreeMap<String, String>,
    up_to_date: BTreeSet<String>,
    /// Node → its kubelet version last told.
    kubelets: BTreeMap<String, String>,
    machines: BTreeSet<String>,
}

/// Follows the rollout on `bed`.
pub(crate) struct Follow<'a> {
    bed: &'a DeploymentBed,
    told: RefCell<Told>,
}

impl<'a> Follow<'a> {
    pub(crate) fn new(bed: &'a DeploymentBed) -> Follow<'a> {
        let told = Told {
            machines: bed.machines.keys().cloned().collect(),
            ..Told::default()
        };
        Follow {
            bed,
            told: RefCell::new(told),
        }
    }

    /// Tells what happens until the MachineDeployment is rolled out at [`TO`] with every
    /// Machine done; an error after the bed's patience.
    pub(crate) async fn run(&self) -> anyhow::Result<()> {
        let (bed, cluster) = (&self.bed.bed, &self.bed.cluster);
        let nodes: Api<Node> = Api::all(cluster.client().await?);
        deployment::wait_for("the rollout to v1.36.3", bed, cluster, || {
            let nodes = nodes.clone();
            async move {
                let machines = deployment::machines(cluster).await?;
                let nodes = nodes
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                self.tell(&bed.extension.log(), &machines, &nodes);
                deployment::updated(cluster, TO, self.bed.nodes).await
            }
        })
        .await
    }

    fn tell(&self, log: &str, machines: &[DynamicObject], nodes: &[Node]) {
        let mut told = self.told.borrow_mut();
        for line in log.lines().map(plain) {
            let Some((at, (hook, words))) =
                HOOKS.iter().find_map(|h| line.find(h.0).map(|at| (at, h)))
            else {
                continue;
            };
            let answer = line[at + hook.len()..].trim().to_owned();
            if told.hooks.insert(answer.clone()) {
                println!("    {words} {answer}");
            }
        }
        for machine in machines {
            let name = machine.metadata.name.clone().unwrap_or_default();
            let node = machine.data["status"]["nodeRef"]["name"]
                .as_str()
                .unwrap_or("no node");
            if told.machines.insert(name.clone()) {
                println!("    a new Machine appeared: {name}");
            }
            match condition(&machine.data, "Updating") {
                Some((status, _, message))
                    if status == "True" && told.updating.get(&name) != Some(&message) =>
                {
                    println!(
                        "    Machine {name} (node {node}) is being updated in place: {message}"
                    );
                    told.updating.insert(name.clone(), message);
                }
                _ => {}
            }
            let up_to_date =
                condition(&machine.data, "UpToDate").is_some_and(|(s, _, _)| s == "True");
            if up_to_date
                && machine.data["spec"]["version"] == TO
                && told.up_to_date.insert(name.clone())
            {
                println!("    Machine {name} (node {node}) is up to date at {TO}");
            }
        }
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let Some(version) = node
                .status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.kubelet_version.clone())
            else {
                continue;
            };
            match told.kubelets.insert(name.clone(), version.clone()) {
                Some(was) if was != version => {
                    println!("    node {name}: its kubelet now reports {version} (was {was})")
                }
                _ => {}
            }
        }
    }
}

/// `line` without terminal escape sequences (the extension's log may colour its fields).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters, then one final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
