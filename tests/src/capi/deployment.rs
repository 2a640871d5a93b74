//! A MachineDeployment `workers` of Machines on real-kubelet nodes, driven by Cluster API's
//! own controllers: the bed `tests/tests/capi_machines.rs` proves the in-place flow on and
//! `inplace-demo --cluster-api` shows it on. Nodes on kubelet v1.36.1, a NodeRelease for
//! v1.36.3 in the management cluster, Cluster API with the extension ([`CapiBed`]) and the
//! Cluster, templates and MachineDeployment a user applies ([`cluster_manifest`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kube::api::{DynamicObject, ListParams};
use serde_json::Value;

use super::bed::{CapiBed, PATIENCE, cluster_manifest};
use super::machines::{condition, identities, machine_api};
use crate::install::workspace_binaries;
use crate::kube_node::cluster::Activation;
use crate::kube_node::{ClusterOptions, KubeCluster};

/// The kubelet the nodes boot with, and the MachineDeployment's version.
pub const FROM: &str = "v1.36.1";
/// The version a bump goes to (the walk-through of docs/usage/cluster-api.md names it).
pub const TO: &str = "v1.36.3";

/// Which NodeRelease for [`TO`] the management cluster holds.
pub enum Release {
    /// The release of the built kubelet.
    Working,
    /// Its kubelet refuses its flags: the agent rolls back.
    Broken,
}

/// The running bed: nodes, Cluster API and the MachineDeployment's Machines on the nodes.
pub struct DeploymentBed {
    /// The real-node cluster (management and workload cluster at once).
    pub cluster: KubeCluster,
    /// Cluster API's manager, the extension and the bed's providers.
    pub bed: CapiBed,
    /// How many Machines (one per node).
    pub nodes: usize,
    /// Machine name → (UID, Node) once provisioned.
    pub machines: BTreeMap<String, (String, String)>,
}

impl DeploymentBed {
    /// Boots `nodes` nodes named `prefix-…` under `work`, starts Cluster API with the
    /// extension, applies `release` and the MachineDeployment, and returns once every
    /// Machine is on its own Node and the MachineDeployment is rolled out at [`FROM`].
    /// `progress` hears each step.
    pub async fn start(
        work: &Path,
        prefix: &str,
        nodes: usize,
        release: Release,
        progress: &dyn Fn(&str),
    ) -> anyhow::Result<DeploymentBed> {
        let (agent, _) = workspace_binaries().await?;
        let options = ClusterOptions {
            dir: work.join("cluster"),
            nodes,
            name_prefix: prefix.to_owned(),
            kubelet: FROM.to_owned(),
            agent,
            // Plans are written by the extension, not by the standalone controller.
            controller: None,
            kubelet_path: None,
        };
        let cluster = KubeCluster::start(&options, progress).await?;
        progress("starting Cluster API's manager and the extension");
        let bed = CapiBed::start(&cluster.api).await?;
        let manifest = match release {
            Release::Working => cluster.release_manifest(TO)?,
            Release::Broken => {
                cluster
                    .serve_broken_release(TO, Activation::Restart)
                    .await?
            }
        };
        cluster.apply("release", &manifest)?;
        cluster.apply("capi", &cluster_manifest(nodes, FROM, TO))?;
        progress("waiting for the MachineDeployment's Machines on their Nodes");
        let started = Instant::now();
        wait_for("the Machines on their Nodes", &bed, &cluster, || async {
            identities(&machines(&cluster).await?, nodes).ok_or("Machines without Nodes")?;
            rolled_out(&deployment(&cluster)?, FROM, nodes)
        })
        .await?;
        progress(&format!(
            "{nodes} Machines Running on their Nodes {:.0} s after the apply",
            started.elapsed().as_secs_f64()
        ));
        let machines = identities(
            &machines(&cluster).await.map_err(anyhow::Error::msg)?,
            nodes,
        )
        .context("the Machines lost their Nodes")?;
        Ok(DeploymentBed {
            cluster,
            bed,
            nodes,
            machines,
        })
    }
}

/// Polls `check` every second until it says done, for at most [`PATIENCE`]; the error names
/// `what` with the last state, what Cluster API shows and the bed's logs.
pub async fn wait_for<F, Fut>(
    what: &str,
    bed: &CapiBed,
    cluster: &KubeCluster,
    mut check: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    let mut shown = Instant::now();
    loop {
        let last = match check().await {
            Ok(()) => return Ok(()),
            Err(last) => last,
        };
        if shown.elapsed() > Duration::from_secs(60) {
            eprintln!(
                "{:.0} s waiting for {what}: {last}",
                started.elapsed().as_secs_f64()
            );
            shown = Instant::now();
        }
        if started.elapsed() > PATIENCE {
            let described = cluster
                .kubectl(&["describe", "machinedeployments,machinesets,machines"])
                .unwrap_or_default();
            bail!(
                "{what} not within {PATIENCE:?}; last: {last}\n{described}\n{}\n{}",
                bed.diagnostics(),
                cluster.agent_journals().await
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Cluster API's Machines as the API server has them.
pub async fn machines(cluster: &KubeCluster) -> Result<Vec<DynamicObject>, String> {
    let client = cluster.client().await.map_err(|e| e.to_string())?;
    Ok(machine_api(&client)
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items)
}

/// The MachineDeployment `workers` at `version` with every Machine there, up to date and
/// available, and no rollout going on.
pub fn rolled_out(deployment: &Value, version: &str, count: usize) -> Result<(), String> {
    let status = &deployment["status"];
    let replicas = serde_json::json!(count);
    let done = deployment["spec"]["template"]["spec"]["version"] == version
        && status["observedGeneration"] == deployment["metadata"]["generation"]
        && status["replicas"] == replicas
        && status["upToDateReplicas"] == replicas
        && status["availableReplicas"] == replicas
        && condition(deployment, "RollingOut").is_some_and(|(s, _, _)| s == "False");
    if done {
        Ok(())
    } else {
        Err(format!("MachineDeployment status {status}"))
    }
}

/// The MachineDeployment `workers` rolled out at `version` ([`rolled_out`]) and each of its
/// Machines done: its Node's kubelet at `version`, `UpToDate` and not `Updating`.
pub async fn updated(cluster: &KubeCluster, version: &str, count: usize) -> Result<(), String> {
    rolled_out(&deployment(cluster)?, version, count)?;
    for machine in machines(cluster).await? {
        let name = machine.metadata.name.clone().unwrap_or_default();
        let kubelet = &machine.data["status"]["nodeInfo"]["kubeletVersion"];
        let up_to_date = condition(&machine.data, "UpToDate");
        let updating = condition(&machine.data, "Updating");
        if kubelet != version
            || up_to_date.as_ref().is_none_or(|(s, _, _)| s != "True")
            || updating.as_ref().is_some_and(|(s, _, _)| s != "False")
        {
            return Err(format!(
                "Machine {name}: kubelet {kubelet}, UpToDate {up_to_date:?}, Updating {updating:?}"
            ));
        }
    }
    Ok(())
}

/// The MachineDeployment `workers` as `kubectl get -o json` shows it.
pub fn deployment(cluster: &KubeCluster) -> Result<Value, String> {
    let text = cluster
        .kubectl(&["get", "machinedeployment", "workers", "-o", "json"])
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}
