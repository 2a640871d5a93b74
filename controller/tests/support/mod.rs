//! The controller's test bed: a Kubernetes API ([`TestApi`]: the real kube-apiserver by
//! default, the API emulator where a case needs its fault injection) with the inplace CRDs
//! and the agent's RBAC and admission policy, the controller running against it in-process,
//! helpers to create nodes, releases and rollouts, simulated agents (`sim_agent`) and a
//! stand-in for the kubelets' part of a pod's deletion (`kubelet`).

// Test-bed code: a failed setup step should fail the test loudly.

pub mod kubelet;
pub mod kured;
pub mod prometheus;
pub use inplace_tests::sim_agent;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use inplace_controller::context::ReconcileSettings;
use inplace_controller::metrics::Metrics;
use inplace_controller::runtime::run::{Settings, run};
use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan};
use inplace_tests::fixtures::ReleaseFixture;
use inplace_tests::test_api::{TestApi, packaging};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Generous: the test machine is small and shared.
pub const WAIT: Duration = Duration::from_secs(180);

/// A running API with the controller.
pub struct Bed {
    /// The API server (real or emulated).
    pub api: Arc<TestApi>,
    /// An admin client.
    pub client: kube::Client,
    /// The controller's metrics.
    pub metrics: Arc<Metrics>,
    stop: Option<watch::Sender<bool>>,
    controller: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// The stand-in for the kubelets' part of pod deletions.
    pub kubelets: kubelet::PodDeletions,
}

/// Starts the default API (on the real side, this test's turn on the server its run shares)
/// with the CRDs and the agent's RBAC and admission policy; no controller.
pub async fn cluster() -> (Arc<TestApi>, kube::Client) {
    prepare(TestApi::start_shared().await.unwrap()).await
}

/// Puts the CRDs and the agent's objects (RBAC, admission policy) into `api`.
pub async fn prepare(api: TestApi) -> (Arc<TestApi>, kube::Client) {
    init_tracing();
    api.install_agent_objects().await.unwrap();
    let client = api.client().await.unwrap();
    (Arc::new(api), client)
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
            alert_recheck: Duration::from_secs(1),
            ..ReconcileSettings::default()
        },
    }
}

/// The user name of the controller's ServiceAccount in the shipped manifests.
pub const CONTROLLER_USER: &str = "system:serviceaccount:inplace-system:inplace-controller";

/// The groups every token of that ServiceAccount carries.
pub const CONTROLLER_GROUPS: [&str; 2] = [
    "system:serviceaccounts",
    "system:serviceaccounts:inplace-system",
];

/// Applies the shipped controller namespace and RBAC (with kubectl on the real server), and
/// returns a client
/// configuration acting as the controller's ServiceAccount.
pub async fn shipped_controller_identity(api: &TestApi) -> kube::Config {
    for manifest in ["controller/namespace.yaml", "controller/rbac.yaml"] {
        api.apply_manifests(&packaging(manifest)).await.unwrap();
    }
    match api {
        TestApi::Real(server) => {
            let kubeconfig = server.dir().join("inplace-controller.kubeconfig");
            server
                .write_kubeconfig(&kubeconfig, CONTROLLER_USER, &CONTROLLER_GROUPS)
                .unwrap();
            server.config_from(&kubeconfig).await.unwrap()
        }
        TestApi::Emulator(emulator) => {
            let user = inplace_api_emulator::User::new(
                "controller-token",
                CONTROLLER_USER,
                &CONTROLLER_GROUPS,
            );
            emulator.config_as(&user).await.unwrap()
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
    /// The default API (on the real side, this test's turn on the server its run shares:
    /// `ApiServer::start_shared`) + CRDs + the agent's objects + the controller as the admin.
    pub async fn start() -> Bed {
        Bed::start_with(test_settings()).await
    }

    /// The same on `api` (the emulator, for a case that needs its faults; a real server of
    /// the test's own, for a case that stops it).
    pub async fn start_on(api: TestApi) -> Bed {
        Bed::start_on_with(api, test_settings()).await
    }

    /// The default API with the controller run with `settings`.
    pub async fn start_with(settings: Settings) -> Bed {
        Bed::start_on_with(TestApi::start_shared().await.unwrap(), settings).await
    }

    /// `api` with the controller run with `settings`.
    pub async fn start_on_with(api: TestApi, settings: Settings) -> Bed {
        let (api, client) = prepare(api).await;
        let config = api.admin_config().await.unwrap();
        Bed::with_controller(api, client, config, settings)
    }

    /// The default API + CRDs + the shipped controller namespace and RBAC, and the
    /// controller running as its ServiceAccount: only what `rbac.yaml` grants works.
    pub async fn start_with_shipped_rbac() -> Bed {
        let (api, client) = cluster().await;
        let config = shipped_controller_identity(&api).await;
        Bed::with_controller(api, client, config, test_settings())
    }

    fn with_controller(
        api: Arc<TestApi>,
        client: kube::Client,
        config: kube::Config,
        settings: Settings,
    ) -> Bed {
        let (metrics, stop, controller) = start_controller(config, settings);
        Bed {
            kubelets: kubelet::PodDeletions::finish(client.clone()),
            api,
            client,
            metrics,
            stop: Some(stop),
            controller: Some(controller),
        }
    }

    /// The emulator's fault switches; panics on the real server.
    pub fn faults(&self) -> &inplace_api_emulator::Faults {
        self.api
            .emulator()
            .expect("a case with injected faults runs on the emulator")
            .faults()
    }

    /// Simulated agents on every node, each writing its plan's status as its node.
    pub fn fleet(&self, config: sim_agent::SimConfig) -> sim_agent::Fleet {
        fleet(&self.api, &self.client, config)
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

    /// The release `name`'s `Valid` condition, once the controller has set it.
    pub async fn release_validity(
        &self,
        name: &str,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        eventually("the release's Valid condition", || async {
            let status = self.releases().get(name).await.ok()?.status?;
            status.conditions.into_iter().find(|c| c.type_ == "Valid")
        })
        .await
    }

    /// The nodes whose plan records a grant (`inplace.dev/activation-granted`), by name.
    pub async fn granted(&self) -> Vec<String> {
        self.plans_where(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(inplace_controller::decision::GRANTED_ANNOTATION))
        })
        .await
    }

    /// The names of the plans for which `check` holds, sorted.
    pub async fn plans_where(&self, check: impl Fn(&NodeUpdatePlan) -> bool) -> Vec<String> {
        let mut names: Vec<String> = self
            .plans()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| check(p))
            .filter_map(|p| p.metadata.name)
            .collect();
        names.sort();
        names
    }

    /// Cordons or uncordons `node` as a person (or another tool) does.
    pub async fn set_cordon(&self, node: &str, cordoned: bool) {
        self.nodes()
            .patch(
                node,
                &Default::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": cordoned}})),
            )
            .await
            .unwrap();
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
    }
}

/// Simulated agents on every plan `client` sees, each writing its plan's status as its
/// node's own identity (`system:node:NAME`) through the agent's RBAC and admission policy.
pub fn fleet(
    api: &Arc<TestApi>,
    client: &kube::Client,
    config: sim_agent::SimConfig,
) -> sim_agent::Fleet {
    let api = api.clone();
    let node_client: sim_agent::NodeClientFn =
        Arc::new(move |node| Box::pin(node_client(api.clone(), node)));
    sim_agent::Fleet::start_as_nodes(client.clone(), node_client, config)
}

/// A client acting as `node`'s kubelet identity (its certificate is written by a short
/// subprocess, off the runtime's threads).
pub async fn node_client(api: Arc<TestApi>, node: String) -> anyhow::Result<kube::Client> {
    let Some(server) = api.real() else {
        return api.client_as_node(&node).await;
    };
    let for_thread = api.clone();
    let kubeconfig = tokio::task::spawn_blocking(move || {
        let server = for_thread.real().expect("checked above");
        server.node_kubeconfig(&node)
    })
    .await??;
    Ok(kube::Client::try_from(
        server.config_from(&kubeconfig).await?,
    )?)
}

/// Creates a node with labels, `Ready` as a kubelet reports it (the rollout's health gate
/// waits while an updated node is not).
pub async fn create_node(client: &kube::Client, name: &str, labels: &[(&str, &str)]) {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

/// Sets a node's `Ready` condition as its kubelet (or the node lifecycle controller) would.
pub async fn set_node_ready(client: &kube::Client, name: &str, status: &str, reason: &str) {
    Api::<Node>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [
                {"type": "Ready", "status": status, "reason": reason,
                 "message": format!("kubelet says {reason}")}]}})),
        )
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

/// A valid release; `tag` is its version and varies the content (and so the revision).
pub fn release(name: &str, tag: &str) -> ReleaseFixture {
    ReleaseFixture::kubelet(name, tag, "v1.31.2").kubernetes_sysext(
        &format!("https://extensions.example/kubernetes-{tag}.raw"),
        &"4f0c".repeat(16),
        None,
    )
}

/// Creates a release.
pub async fn create_release(client: &kube::Client, name: &str, tag: &str) {
    release(name, tag).create(client).await.unwrap();
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

/// The status of a rollout condition as stored now ("" when it has none).
pub async fn condition_status(bed: &Bed, rollout: &str, type_: &str) -> String {
    let r = bed.rollouts().get(rollout).await.unwrap();
    condition(&r, type_).map(|c| c.0).unwrap_or_default()
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
    // The real server refuses pods in a namespace until the serviceaccount controller made
    // its `default` ServiceAccount (moments after the server starts).
    eventually("the pod created", || async {
        match api.create(&Default::default(), &pod).await {
            Ok(_) => Some(()),
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("service account") => {
                None
            }
            Err(e) => panic!("creating pod {name}: {e}"),
        }
    })
    .await;
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

/// The owner reference of a pod a DaemonSet made. On the real server the DaemonSet exists
/// (its garbage collector deletes a pod whose owner does not); the emulator has no
/// DaemonSets and no such collection, so a made-up owner does there.
pub async fn daemonset_owner(bed: &Bed, name: &str) -> Value {
    use k8s_openapi::api::apps::v1::DaemonSet;
    if bed.api.real().is_none() {
        return json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
                      "uid": format!("{name}-uid"), "controller": true});
    }
    let daemonset: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }))
    .unwrap();
    let created = Api::<DaemonSet>::namespaced(bed.client.clone(), "default")
        .create(&PostParams::default(), &daemonset)
        .await
        .unwrap();
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
           "uid": created.metadata.uid, "controller": true})
}

/// The API server's answer to creating a rollout with `spec`: the refusal's message.
pub async fn refusal(client: &kube::Client, name: &str, spec: Value) -> Option<String> {
    let rollout: NodeRollout = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    match Api::<NodeRollout>::all(client.clone())
        .create(&PostParams::default(), &rollout)
        .await
    {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.message),
        Err(other) => panic!("{other}"),
    }
}

/// The error line of a `release from-…` run that failed, checked to carry `[kind]` and to
/// have printed no release.
pub fn failure(output: &std::process::Output, kind: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "succeeded; stderr: {stderr}");
    assert!(output.stdout.is_empty(), "printed a release on failure");
    assert!(stderr.contains(&format!("[{kind}] ")), "{stderr}");
    stderr
}

/// Runs `inplace-controller release COMMAND SOURCE --name kubernetes --version VERSION
/// EXTRA…` without blocking the runtime.
pub async fn release_command(
    command: &str,
    source: &str,
    version: &str,
    extra: &[&str],
) -> std::process::Output {
    release_command_with_env(command, source, version, extra, &[]).await
}

/// [`release_command`] with `envs` set (`DOCKER_CONFIG`, where a login is looked for).
pub async fn release_command_with_env(
    command: &str,
    source: &str,
    version: &str,
    extra: &[&str],
    envs: &[(&str, &std::path::Path)],
) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_inplace-controller"))
        .args(["release", command, source])
        .args(["--name", "kubernetes", "--version", version])
        .args(extra)
        .envs(envs.iter().copied())
        .output()
        .await
        .unwrap()
}
