//! The controller's test bed: an API emulator with the inplace CRDs, the controller running
//! against it in-process, helpers to create nodes, releases and rollouts, and simulated
//! agents (`sim_agent`).

#![allow(dead_code)]
// Test-bed code: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used)]

pub mod sim_agent;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use inplace_api_emulator::{Emulator, EmulatorConfig, Handle};
use inplace_controller::context::ReconcileSettings;
use inplace_controller::metrics::Metrics;
use inplace_controller::run::{Settings, run};
use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Generous: the test machine is small and shared.
pub const WAIT: Duration = Duration::from_secs(180);

/// A running emulator with the controller.
pub struct Bed {
    /// The emulator.
    pub emulator: Handle,
    /// An admin client.
    pub client: kube::Client,
    /// The controller's metrics.
    pub metrics: Arc<Metrics>,
    stop: Option<watch::Sender<bool>>,
    controller: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

/// Where the committed CRDs are.
pub fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/crds")
}

/// Starts an emulator with the CRDs (no controller).
pub async fn emulator() -> (Handle, kube::Client) {
    let emulator = Emulator::start(EmulatorConfig::default()).await.unwrap();
    emulator.apply_crd_dir(&crd_dir()).await.unwrap();
    let client = emulator.client().await.unwrap();
    (emulator, client)
}

/// The admin's client configuration for `emulator`.
pub async fn admin_config(emulator: &Handle) -> kube::Config {
    let yaml = emulator.kubeconfig_yaml(&inplace_api_emulator::User::admin());
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap()
}

/// Starts the controller against `config`.
pub fn start_controller(
    config: kube::Config,
    settings: Settings,
) -> (
    Arc<Metrics>,
    watch::Sender<bool>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let metrics = Arc::new(Metrics::default());
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(run(config, settings, metrics.clone(), stop_rx));
    (metrics, stop, task)
}

/// Settings for tests: no HTTP server, no Lease, fast resync.
pub fn test_settings() -> Settings {
    Settings {
        metrics_addr: None,
        lease: None,
        reconcile: ReconcileSettings {
            resync: Duration::from_secs(10),
            ..ReconcileSettings::default()
        },
    }
}

/// The user name of the controller's ServiceAccount in the shipped manifests.
pub const CONTROLLER_USER: &str = "system:serviceaccount:inplace-system:inplace-controller";

/// Creates the cluster-wide RBAC objects of a shipped manifest (ClusterRoles and their
/// bindings: all the rollout controller needs; the leader-election Role is namespaced and
/// unused without a Lease).
pub async fn create_cluster_rbac(client: &kube::Client, manifest: &std::path::Path) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let text = std::fs::read_to_string(manifest).unwrap();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(doc).unwrap();
        match value["kind"].as_str() {
            Some("ClusterRole") => {
                let role: ClusterRole = serde_json::from_value(value).unwrap();
                Api::<ClusterRole>::all(client.clone())
                    .create(&PostParams::default(), &role)
                    .await
                    .unwrap();
            }
            Some("ClusterRoleBinding") => {
                let binding: ClusterRoleBinding = serde_json::from_value(value).unwrap();
                Api::<ClusterRoleBinding>::all(client.clone())
                    .create(&PostParams::default(), &binding)
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

impl Bed {
    /// Emulator + CRDs + controller.
    pub async fn start() -> Bed {
        init_tracing();
        let (emulator, client) = emulator().await;
        let config = admin_config(&emulator).await;
        Bed::with_controller(emulator, client, config)
    }

    /// Emulator with RBAC authorization + CRDs + the shipped controller ClusterRole, and the
    /// controller running as its ServiceAccount: only what `rbac.yaml` grants works.
    pub async fn start_with_shipped_rbac() -> Bed {
        init_tracing();
        let emulator = Emulator::start(EmulatorConfig {
            authz: inplace_api_emulator::AuthzMode::Rbac,
            ..EmulatorConfig::default()
        })
        .await
        .unwrap();
        emulator.apply_crd_dir(&crd_dir()).await.unwrap();
        let client = emulator.client().await.unwrap();
        let rbac = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../packaging/kubernetes/controller/rbac.yaml");
        create_cluster_rbac(&client, &rbac).await;
        let user = inplace_api_emulator::User::new("controller-token", CONTROLLER_USER, &[]);
        let config = emulator.config_as(&user).await.unwrap();
        Bed::with_controller(emulator, client, config)
    }

    fn with_controller(emulator: Handle, client: kube::Client, config: kube::Config) -> Bed {
        let (metrics, stop, controller) = start_controller(config, test_settings());
        Bed {
            emulator,
            client,
            metrics,
            stop: Some(stop),
            controller: Some(controller),
        }
    }

    /// Stops the controller gracefully and waits for it.
    pub async fn stop_controller(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(task) = self.controller.take() {
            let result = tokio::time::timeout(WAIT, task).await;
            assert!(result.is_ok(), "the controller did not stop");
        }
    }

    /// The nodes API.
    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// The plans API.
    pub fn plans(&self) -> Api<NodeUpdatePlan> {
        Api::all(self.client.clone())
    }

    /// The rollouts API.
    pub fn rollouts(&self) -> Api<NodeRollout> {
        Api::all(self.client.clone())
    }

    /// The releases API.
    pub fn releases(&self) -> Api<NodeRelease> {
        Api::all(self.client.clone())
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
    }
}

/// Creates a node with labels.
pub async fn create_node(client: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

/// Deletes a node.
pub async fn delete_node(client: &kube::Client, name: &str) {
    Api::<Node>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// A valid release body; `tag` varies the content (and so the revision).
pub fn release_json(name: &str, tag: &str) -> Value {
    json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
        "metadata": {"name": name},
        "spec": {
            "version": tag,
            "kubernetesVersion": "v1.31.2",
            "artifacts": [{
                "name": "kubernetes", "type": "Sysext",
                "url": format!("https://extensions.example/kubernetes-{tag}.raw"),
                "sha256": "4f0c".repeat(16),
            }],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"units": ["kubelet.service"], "window": "1s", "timeout": "1m"},
        },
    })
}

/// Creates a release.
pub async fn create_release(client: &kube::Client, name: &str, tag: &str) {
    let release: NodeRelease = serde_json::from_value(release_json(name, tag)).unwrap();
    Api::<NodeRelease>::all(client.clone())
        .create(&PostParams::default(), &release)
        .await
        .unwrap();
}

/// Creates a rollout from its spec.
pub async fn create_rollout(client: &kube::Client, name: &str, spec: Value) {
    let rollout: NodeRollout = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    Api::<NodeRollout>::all(client.clone())
        .create(&PostParams::default(), &rollout)
        .await
        .unwrap();
}

/// Merge-patches a rollout's spec.
pub async fn patch_rollout(client: &kube::Client, name: &str, spec: Value) {
    Api::<NodeRollout>::all(client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

/// Polls `check` until it returns Some, or panics after [`WAIT`] with `what`.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The rollout, once `check` holds for it.
pub async fn rollout_when(
    client: &kube::Client,
    name: &str,
    what: &str,
    check: impl Fn(&NodeRollout) -> bool,
) -> NodeRollout {
    let api: Api<NodeRollout> = Api::all(client.clone());
    let mut last = None;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(rollout) = api.get(name).await {
            if check(&rollout) {
                return rollout;
            }
            last = Some(rollout);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for rollout {name}: {what}; last seen: {:#?}",
            last.map(|r| r.status)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A rollout condition's (status, reason, message).
pub fn condition(rollout: &NodeRollout, type_: &str) -> Option<(String, String, String)> {
    rollout
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Whether a rollout condition has this status and reason.
pub fn has_condition(rollout: &NodeRollout, type_: &str, status: &str, reason: &str) -> bool {
    condition(rollout, type_).is_some_and(|(s, r, _)| s == status && r == reason)
}

/// Events recorded for an object name (events.k8s.io/v1 `regarding.name`), as
/// (reason, note) pairs.
pub async fn events_for(client: &kube::Client, name: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let list = api.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// A pod body on `node` with `labels`; `extra_meta` is merged into its metadata.
pub fn pod(
    name: &str,
    node: &str,
    labels: serde_json::Value,
    extra_meta: serde_json::Value,
) -> serde_json::Value {
    let mut metadata = json!({"name": name, "namespace": "default", "labels": labels});
    if let (Some(m), Some(e)) = (metadata.as_object_mut(), extra_meta.as_object()) {
        for (k, v) in e {
            m.insert(k.clone(), v.clone());
        }
    }
    json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    })
}

/// Creates a pod and reports it Running and Ready, as its kubelet would.
pub async fn create_running_pod(client: &kube::Client, body: serde_json::Value) {
    use k8s_openapi::api::core::v1::Pod;
    let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(body).unwrap();
    let name = pod.metadata.name.clone().unwrap();
    api.create(&Default::default(), &pod).await.unwrap();
    api.patch_status(
        &name,
        &Default::default(),
        &kube::api::Patch::Merge(json!({"status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
        }})),
    )
    .await
    .unwrap();
}
