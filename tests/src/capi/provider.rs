//! The test bed's own Cluster API providers, not Cluster API's (its own test providers are not
//! published as a module): the kinds of `tests/capi/provider/crds` under the v1beta2 provider
//! contract, and the small reconciler here that plays their controllers.
//!
//! - **Infrastructure** (`infrastructure.bed.inplace.dev`): a `BedCluster` is provisioned at
//!   once (the nodes already share the control plane's network); a `BedMachine` takes one of
//!   the bed's booted real-kubelet nodes that no other `BedMachine` holds, sets its
//!   `spec.providerID` to that Node's (the kubelet registers it,
//!   [`crate::kube_node::config::provider_id`]) and reports itself provisioned. Like a pool of
//!   hosts that are already installed: the bed creates no machine, and a `BedMachine` finds
//!   none when every node is taken (its `Ready` condition says so).
//! - **Control plane** (`controlplane.bed.inplace.dev`): a `BedControlPlane` stands for the
//!   bed's kube-apiserver on the host, which no Machine runs (like a hosted control plane): it
//!   is initialized, reports the server's version and endpoint, and keeps the Cluster's
//!   kubeconfig Secret (`<cluster>-kubeconfig`, key `value`) as the control-plane contract
//!   asks, with a client certificate of the bed's CA in `system:masters`.
//!
//! - **Bootstrap** (`bootstrap.bed.inplace.dev`): a `BedBootstrapConfig` gets a Secret of
//!   its name saying the node is booted already, and reports it as its data secret. Nothing
//!   runs it; it exists because Cluster API v1.14.2 marks a Machine's bootstrap data ready
//!   only through a bootstrap config, and updates a Machine in place only once it is marked
//!   (a Machine with a bare `spec.bootstrap.dataSecretName` never is).
//!
//! The management cluster and the workload cluster are the same API server: the bed's.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::apiserver::{ApiServer, repo_root};

/// The field manager of everything the bed's providers write.
const MANAGER: &str = "inplace-testbed-providers";
const INFRASTRUCTURE: &str = "infrastructure.bed.inplace.dev";
const CONTROL_PLANE: &str = "controlplane.bed.inplace.dev";
const BOOTSTRAP: &str = "bootstrap.bed.inplace.dev";
const VERSION: &str = "v1alpha1";
/// How often the reconciler looks at every object (there are a handful).
const PERIOD: Duration = Duration::from_secs(1);

/// The running reconciler; dropping it stops it.
pub struct BedProviders {
    task: tokio::task::JoinHandle<()>,
    last_error: Arc<Mutex<Option<String>>>,
}

impl BedProviders {
    /// Installs the providers' CRDs and RBAC into `server` and starts reconciling its objects.
    pub async fn start(server: &ApiServer) -> anyhow::Result<BedProviders> {
        let dir = repo_root().join("tests/capi/provider");
        server.apply_crd_dir(&dir.join("crds")).await?;
        let rbac = dir.join("rbac.yaml");
        server.run_kubectl(&["apply", "-f", rbac.to_str().context("path is not UTF-8")?])?;
        let kubeconfig = server.dir().join("cluster-api-workload.kubeconfig");
        server.write_kubeconfig(
            &kubeconfig,
            "inplace-testbed:cluster-api",
            &["system:masters"],
        )?;
        let client = server.client().await?;
        let bed = Bed {
            version: client.apiserver_version().await?.git_version,
            endpoint: endpoint(server.url())?,
            kubeconfig: std::fs::read(&kubeconfig)?,
            client,
        };
        let last_error = Arc::new(Mutex::new(None));
        let record = last_error.clone();
        let task = tokio::spawn(async move {
            loop {
                let result = bed.reconcile().await.err().map(|e| format!("{e:#}"));
                *record.lock().unwrap_or_else(|e| e.into_inner()) = result;
                tokio::time::sleep(PERIOD).await;
            }
        });
        Ok(BedProviders { task, last_error })
    }

    /// What the last pass failed on, if it did (for a test's failure message).
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for BedProviders {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The API server's host and port, for `spec.controlPlaneEndpoint`.
fn endpoint(url: &str) -> anyhow::Result<(String, u16)> {
    let authority = url
        .strip_prefix("https://")
        .and_then(|rest| rest.split('/').next())
        .with_context(|| format!("not an https URL: {url}"))?;
    let (host, port) = authority
        .rsplit_once(':')
        .with_context(|| format!("no port in {url}"))?;
    Ok((host.to_owned(), port.parse()?))
}

struct Bed {
    client: kube::Client,
    version: String,
    endpoint: (String, u16),
    kubeconfig: Vec<u8>,
}

impl Bed {
    async fn reconcile(&self) -> anyhow::Result<()> {
        self.clusters().await?;
        self.control_planes().await?;
        self.bootstrap_configs().await?;
        self.machines().await
    }

    fn api(&self, group: &str, kind: &str) -> (Api<DynamicObject>, ApiResource) {
        let plural = format!("{}s", kind.to_lowercase());
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, VERSION, kind),
            &plural,
        );
        (Api::all_with(self.client.clone(), &resource), resource)
    }

    /// Server-side applies `body` (without apiVersion and kind) to `object`, or to its status.
    async fn apply(
        &self,
        resource: &ApiResource,
        object: &DynamicObject,
        status: bool,
        body: Value,
    ) -> anyhow::Result<()> {
        let name = object.metadata.name.clone().unwrap_or_default();
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, resource);
        let mut body = body;
        body["apiVersion"] = resource.api_version.clone().into();
        body["kind"] = resource.kind.clone().into();
        let params = PatchParams::apply(MANAGER).force();
        let patch = Patch::Apply(&body);
        if status {
            api.patch_status(&name, &params, &patch).await
        } else {
            api.patch(&name, &params, &patch).await
        }
        .with_context(|| format!("applying {} {namespace}/{name}", resource.kind))?;
        Ok(())
    }

    async fn clusters(&self) -> anyhow::Result<()> {
        let (api, resource) = self.api(INFRASTRUCTURE, "BedCluster");
        for cluster in api.list(&ListParams::default()).await?.items {
            if cluster.data["status"]["initialization"]["provisioned"] != json!(true) {
                let status = json!({"status": {"initialization": {"provisioned": true}}});
                self.apply(&resource, &cluster, true, status).await?;
            }
        }
        Ok(())
    }

    async fn control_planes(&self) -> anyhow::Result<()> {
        let (api, resource) = self.api(CONTROL_PLANE, "BedControlPlane");
        for plane in api.list(&ListParams::default()).await?.items {
            let (host, port) = &self.endpoint;
            let endpoint = json!({"host": host, "port": port});
            if plane.data["spec"]["controlPlaneEndpoint"] != endpoint {
                let spec = json!({"spec": {"controlPlaneEndpoint": endpoint}});
                self.apply(&resource, &plane, false, spec).await?;
            }
            // The kubeconfig before the initialization: Cluster API connects once it reads
            // that the control plane is initialized.
            let Some(cluster) = owning_cluster(&plane) else {
                continue; // Cluster API has not adopted it yet.
            };
            self.kubeconfig_secret(&plane, &cluster).await?;
            let status = json!({"status": {
                "version": self.version,
                "initialization": {"controlPlaneInitialized": true},
            }});
            if plane.data["status"]["version"] != json!(self.version)
                || plane.data["status"]["initialization"]["controlPlaneInitialized"] != json!(true)
            {
                self.apply(&resource, &plane, true, status).await?;
            }
        }
        Ok(())
    }

    /// The Secret `<cluster>-kubeconfig` as the control-plane contract defines it.
    async fn kubeconfig_secret(&self, plane: &DynamicObject, cluster: &str) -> anyhow::Result<()> {
        let namespace = plane.metadata.namespace.clone().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let name = format!("{cluster}-kubeconfig");
        if secrets.get_opt(&name).await?.is_some() {
            return Ok(());
        }
        self.write_secret(&namespace, &name, cluster, &self.kubeconfig)
            .await
    }

    /// A Secret of Cluster API's kind (`cluster.x-k8s.io/secret`, labelled with its cluster)
    /// holding `value` under the key `value`.
    async fn write_secret(
        &self,
        namespace: &str,
        name: &str,
        cluster: &str,
        value: &[u8],
    ) -> anyhow::Result<()> {
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "type": "cluster.x-k8s.io/secret",
            "data": {"value": base64::engine::general_purpose::STANDARD.encode(value)},
        });
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        secrets
            .patch(name, &PatchParams::apply(MANAGER), &Patch::Apply(&secret))
            .await
            .with_context(|| format!("writing Secret {namespace}/{name}"))?;
        Ok(())
    }

    async fn bootstrap_configs(&self) -> anyhow::Result<()> {
        let (api, resource) = self.api(BOOTSTRAP, "BedBootstrapConfig");
        for config in api.list(&ListParams::default()).await?.items {
            if config.data["status"]["initialization"]["dataSecretCreated"] == json!(true) {
                continue;
            }
            let name = config.metadata.name.clone().unwrap_or_default();
            let namespace = config.metadata.namespace.clone().unwrap_or_default();
            let cluster = config
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("cluster.x-k8s.io/cluster-name"))
                .cloned()
                .unwrap_or_default();
            let booted = b"# the bed's nodes are booted already: nothing to run\n";
            self.write_secret(&namespace, &name, &cluster, booted)
                .await?;
            let status = json!({"status": {
                "dataSecretName": name,
                "initialization": {"dataSecretCreated": true},
            }});
            self.apply(&resource, &config, true, status).await?;
        }
        Ok(())
    }

    async fn machines(&self) -> anyhow::Result<()> {
        let (api, resource) = self.api(INFRASTRUCTURE, "BedMachine");
        let machines = api.list(&ListParams::default()).await?.items;
        let mut taken: BTreeSet<String> = machines.iter().filter_map(provider_id).collect();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut pool: Vec<(String, String)> = nodes
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|node| Some((node.metadata.name?, node.spec?.provider_id?)))
            .filter(|(_, id)| id.starts_with("inplace-testbed://"))
            .collect();
        pool.sort();
        for machine in &machines {
            if provider_id(machine).is_some() {
                if machine.data["status"]["initialization"]["provisioned"] != json!(true) {
                    let status = machine_status(true, "NodeTaken", "");
                    self.apply(&resource, machine, true, status).await?;
                }
                continue;
            }
            let Some((_, id)) = pool.iter().find(|(_, id)| !taken.contains(id)) else {
                let message = format!(
                    "no booted node of the bed is free: {} nodes, all taken by BedMachines",
                    pool.len()
                );
                if machine.data["status"]["conditions"][0]["message"] != json!(message) {
                    let status = machine_status(false, "NoFreeNode", &message);
                    self.apply(&resource, machine, true, status).await?;
                }
                continue;
            };
            let spec = json!({"spec": {"providerID": id}});
            self.apply(&resource, machine, false, spec).await?;
            taken.insert(id.clone());
        }
        Ok(())
    }
}

fn provider_id(machine: &DynamicObject) -> Option<String> {
    machine.data["spec"]["providerID"]
        .as_str()
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

/// A BedMachine's status: provisioned or not, with its `Ready` condition saying why.
fn machine_status(provisioned: bool, reason: &str, message: &str) -> Value {
    let mut status = json!({"conditions": [{
        "type": "Ready",
        "status": if provisioned { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string(),
    }]});
    if provisioned {
        status["initialization"] = json!({"provisioned": true});
    }
    json!({ "status": status })
}

/// The name of the Cluster that owns `object` (Cluster API's Cluster controller sets the
/// owner reference when it adopts its control plane).
fn owning_cluster(object: &DynamicObject) -> Option<String> {
    object
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|owner| owner.kind == "Cluster" && owner.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|owner| owner.name.clone())
}
