//! The test bed: the management and the workload cluster (one real kube-apiserver holding
//! both, a self-hosted management cluster; or two, the workload's the emulator where a case
//! injects faults into it; see [`Topology`]), the hook server
//! over real HTTPS with a self-signed certificate, a reqwest client that trusts it, Cluster
//! API request builders from the golden files (what Cluster API's own client sent), and a simulated agent for the workload cluster.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use inplace_capi::{Config, Drainer, Extension, NoDrain, Server};
use inplace_proto::NodeUpdatePlan;
use inplace_tests::fixtures::ReleaseFixture;
use inplace_tests::sim_agent::{Failure, SimConfig, Stepper};
use inplace_tests::test_api::{TestApi, packaging};
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::oneshot;

pub const NAMESPACE: &str = "tenant-a";
pub const CLUSTER: &str = "c1";
pub const HOOKS: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1";

/// The NodeReleases of the management cluster: v1.32.0 has none, and v1.33.0 is there so
/// that a skipped minor version is refused for the skip, not for a missing release.
pub const RELEASES: [(&str, &str); 4] = [
    ("kubernetes-v1.31.1", "v1.31.1"),
    ("kubernetes-v1.31.2", "v1.31.2"),
    ("kubernetes-v1.31.3", "v1.31.3"),
    ("kubernetes-v1.33.0", "v1.33.0"),
];

/// The one release of [`RELEASES`] that says it updates control-plane nodes
/// (`updatesControlPlane`): hookcheck's CanUpdateMachine cases are KubeadmControlPlane's
/// Machines, and their version bump (v1.31.2 -> v1.31.3) is claimed with it; v1.31.2 is the
/// version a control-plane Machine is refused.
pub const CONTROL_PLANE_RELEASE: &str = "kubernetes-v1.31.3";

/// Where the golden files are: what Cluster API's own client sent and accepted, recorded by
/// `hookcheck` (tests/capi; regenerate with `make capi-golden`).
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// One golden file, `<exchange>.request` or `<exchange>.response` (without `.json`).
pub fn golden(name: &str) -> Value {
    let path = golden_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The objects of Cluster API's UpdateMachine request: `machine`, `infrastructureMachine`
/// (a VSphereMachine) or `bootstrapConfig` (a KubeadmConfig).
pub fn update_machine_object(which: &str) -> Value {
    golden("update-machine.request")["desired"][which].clone()
}

/// The objects of Cluster API's CanUpdateMachineSet request (current side): `machineSet`,
/// `infrastructureMachineTemplate` or `bootstrapConfigTemplate`.
pub fn machine_set_object(which: &str) -> Value {
    golden("can-update-machineset-patch-version.request")["current"][which].clone()
}

/// A self-signed certificate for `localhost` and 127.0.0.1, as PEM (cert, key).
pub fn self_signed(common_name: &str) -> (String, String) {
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub fn https_client(ca_pem: &str) -> reqwest::Client {
    install_crypto_provider();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// A valid release `name` for `kubernetes_version`: the kubelet's system extension, checked
/// by the Node's kubelet version.
pub fn release_fixture(name: &str, kubernetes_version: &str) -> ReleaseFixture {
    let url =
        format!("https://extensions.example/kubernetes/kubernetes-{kubernetes_version}-x86-64.raw");
    ReleaseFixture::kubelet(name, kubernetes_version, kubernetes_version)
        .kubernetes_sysext(&url, &"4f0c9a1b".repeat(8), Some(97_517_568))
        .node_kubelet_version()
        .checked_for("30s", "5m")
}

/// The admin's kubeconfig of `api`, as Cluster API's `<cluster>-kubeconfig` Secret holds it.
pub fn admin_kubeconfig_yaml(api: &TestApi) -> String {
    let file = tempfile::NamedTempFile::new().unwrap();
    api.write_admin_kubeconfig(file.path()).unwrap();
    std::fs::read_to_string(file.path()).unwrap()
}

/// `api`'s admin kubeconfig with the credential swapped for a token the server does not know
/// (a revoked one): the server answers 401.
pub fn refused_kubeconfig_yaml(api: &TestApi) -> String {
    let mut kubeconfig: serde_yaml::Value =
        serde_yaml::from_str(&admin_kubeconfig_yaml(api)).unwrap();
    for user in kubeconfig["users"].as_sequence_mut().unwrap() {
        user["user"] = serde_yaml::from_str("{token: revoked-token}").unwrap();
    }
    serde_yaml::to_string(&kubeconfig).unwrap()
}

/// The workload cluster's nodes (a `fail-*` node's simulated agent rolls back).
pub const NODES: [&str; 3] = ["node-1", "node-2", "fail-node"];

/// Where the management cluster's objects live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// In the workload cluster itself, as Cluster API runs after `clusterctl move` into the
    /// cluster it manages: one kube-apiserver for both, the test's turn on the one its run
    /// shares (the extension still reaches the workload cluster through the Cluster's
    /// kubeconfig Secret). With a server of its own for both, this crate's tests took 150
    /// machine CPU-s where they took 229 with two (docs/development/testing.md).
    SelfHosted,
    /// A management cluster of its own, without the plans' CRD: a plan the extension wrote
    /// through the wrong client would fail there. For the cases about the two clusters.
    Separate,
}

pub struct Bed {
    pub management: Arc<TestApi>,
    pub workload: Arc<TestApi>,
    pub workload_client: kube::Client,
    pub management_client: kube::Client,
    pub addr: std::net::SocketAddr,
    pub http: reqwest::Client,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    _dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Bed {
    /// A self-hosted management cluster, no drain, UpdateMachine's 30 s retry.
    pub async fn start() -> Bed {
        Bed::start_with(Topology::SelfHosted, false, Arc::new(NoDrain), 30).await
    }

    pub async fn start_with(
        topology: Topology,
        drain: bool,
        drainer: Arc<dyn Drainer>,
        update_machine_timeout_seconds: i32,
    ) -> Bed {
        let (workload, management) = match topology {
            Topology::SelfHosted => {
                let cluster = Arc::new(TestApi::start_shared().await.unwrap());
                (cluster.clone(), cluster)
            }
            Topology::Separate => {
                // The two clusters' servers start side by side: a test of these suites spent
                // half its time waiting for one kube-apiserver and then for the other.
                let (workload, management) = tokio::join!(TestApi::start(), TestApi::start());
                (Arc::new(workload.unwrap()), Arc::new(management.unwrap()))
            }
        };
        Bed::start_between(
            workload,
            management,
            drain,
            drainer,
            update_machine_timeout_seconds,
        )
        .await
    }

    /// The bed with `workload` as the workload cluster (the emulator, for a case that
    /// injects faults into it); the management cluster is the default server.
    pub async fn start_on(
        workload: TestApi,
        drain: bool,
        drainer: Arc<dyn Drainer>,
        update_machine_timeout_seconds: i32,
    ) -> Bed {
        let management = TestApi::start().await.unwrap();
        Bed::start_between(
            Arc::new(workload),
            Arc::new(management),
            drain,
            drainer,
            update_machine_timeout_seconds,
        )
        .await
    }

    async fn start_between(
        workload: Arc<TestApi>,
        management: Arc<TestApi>,
        drain: bool,
        drainer: Arc<dyn Drainer>,
        update_machine_timeout_seconds: i32,
    ) -> Bed {
        install_crypto_provider();
        let management_crds = async {
            let crds = packaging("crds");
            management
                .apply_crd_file(&crds.join("nodereleases.yaml"))
                .await
                .unwrap();
            for file in inplace_tests::capi::crd_files().unwrap() {
                management.apply_crd_file(&file).await.unwrap();
            }
        };
        // The workload cluster holds what every node's agent needs (the plans' CRD, the
        // agent's RBAC and admission policy): the simulated agents write as their nodes.
        let agent_objects = async { workload.install_agent_objects().await.unwrap() };
        tokio::join!(management_crds, agent_objects);
        let management_client = management.client().await.unwrap();
        let workload_client = workload.client().await.unwrap();

        // Management cluster: the namespace, the Cluster's kubeconfig Secret, releases.
        let namespaces: Api<Namespace> = Api::all(management_client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap(),
            )
            .await
            .unwrap();
        put_kubeconfig_secret(
            &management_client,
            CLUSTER,
            &admin_kubeconfig_yaml(&workload),
        )
        .await;
        create_cluster(&management_client, CLUSTER).await;
        for (name, version) in RELEASES {
            let release = release_fixture(name, version);
            let release = if name == CONTROL_PLANE_RELEASE {
                release.updates_control_plane()
            } else {
                release
            };
            release.create(&management_client).await.unwrap();
        }

        // Workload cluster: the nodes.
        let nodes: Api<Node> = Api::all(workload_client.clone());
        for name in NODES {
            nodes
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
                )
                .await
                .unwrap();
        }

        // The hook server, on real HTTPS.
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed("inplace-capi test");
        let cert_file = dir.path().join("tls.crt");
        let key_file = dir.path().join("tls.key");
        std::fs::write(&cert_file, &cert).unwrap();
        std::fs::write(&key_file, &key).unwrap();
        let mut config = Config::new(
            "127.0.0.1:0".parse().unwrap(),
            cert_file.clone(),
            key_file.clone(),
        );
        config.drain = drain;
        config.update_machine_timeout_seconds = update_machine_timeout_seconds;
        config.validate().unwrap();
        let extension: Arc<Extension> = Arc::new(inplace_capi::extension(
            &config,
            management_client.clone(),
            drainer,
        ));
        let server = Server::bind(
            config.listen,
            &cert_file,
            &key_file,
            extension,
            update_machine_timeout_seconds,
        )
        .await
        .unwrap();
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(server.serve(async {
            let _ = stopped.await;
        }));
        Bed {
            http: https_client(&cert),
            management,
            workload,
            workload_client,
            management_client,
            addr,
            cert_file,
            key_file,
            _dir: dir,
            stop: Some(stop),
            server: Some(server),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }

    /// POSTs `body` to a hook path; the HTTP status and the JSON answer.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    /// Calls UpdateMachine for `machine` as Cluster API does: with the Machine stored in the
    /// management cluster as `machine` says, marked as being updated in place.
    pub async fn update_machine(&self, machine: &Value) -> Value {
        self.store_machine(machine).await;
        self.post_update_machine(machine).await
    }

    /// Stores `machine` (its spec, labels, annotations and status) in the management cluster,
    /// as Cluster API's controllers leave it when they call UpdateMachine.
    pub async fn store_machine(&self, machine: &Value) {
        let machines = capi_objects(&self.management_client, "machines");
        let name = machine["metadata"]["name"].as_str().unwrap();
        let stored = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": machine["metadata"]["namespace"],
                         "labels": machine["metadata"]["labels"],
                         "annotations": machine["metadata"]["annotations"]},
            "spec": machine["spec"],
        });
        let params = PatchParams::apply("capi-test").force();
        machines
            .patch(name, &params, &Patch::Apply(&stored))
            .await
            .unwrap();
        if let Some(status) = machine.get("status") {
            let status = json!({ "status": status });
            machines
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .unwrap();
        }
    }

    /// Calls UpdateMachine with `machine` as the request's desired Machine, whatever the
    /// management cluster holds (a forged request when it holds nothing like it).
    pub async fn post_update_machine(&self, machine: &Value) -> Value {
        let (status, answer) = self
            .post(
                &format!("{HOOKS}/updatemachine/update-machine"),
                &update_machine_request(machine),
            )
            .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            answer["apiVersion"],
            "hooks.runtime.cluster.x-k8s.io/v1alpha1"
        );
        assert_eq!(answer["kind"], "UpdateMachineResponse");
        assert!(answer["retryAfterSeconds"].is_i64(), "{answer}");
        answer
    }

    pub fn plans(&self) -> Api<NodeUpdatePlan> {
        Api::all(self.workload_client.clone())
    }

    pub async fn plan_count(&self) -> usize {
        self.plans()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap();
        }
    }
}

/// A Cluster `name` in the test namespace of the management cluster.
pub async fn create_cluster(management: &kube::Client, name: &str) {
    capi_objects(management, "clusters")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

/// Cluster API objects (`cluster.x-k8s.io/v1beta2`, `plural`) in the test namespace.
pub fn capi_objects(management: &kube::Client, plural: &str) -> Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: String::new(),
        plural: plural.into(),
    };
    Api::namespaced_with(management.clone(), NAMESPACE, &resource)
}

pub async fn put_kubeconfig_secret(management: &kube::Client, cluster: &str, kubeconfig: &str) {
    let secrets: Api<Secret> = Api::namespaced(management.clone(), NAMESPACE);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("{cluster}-kubeconfig"), "namespace": NAMESPACE,
                     "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": kubeconfig},
    }))
    .unwrap();
    let bytes = serde_json::to_value(&secret).unwrap();
    secrets
        .patch(
            &format!("{cluster}-kubeconfig"),
            &PatchParams::apply("test").force(),
            &Patch::Apply(&bytes),
        )
        .await
        .unwrap();
}

/// The Machine Cluster API sends to UpdateMachine, at `version`, with the status the
/// management cluster holds: on `node` (None: no nodeRef).
pub fn machine(version: &str, node: Option<&str>) -> Value {
    let mut machine = update_machine_object("machine");
    machine["spec"]["version"] = json!(version);
    if let Some(node) = node {
        machine["status"] = json!({"nodeRef": {"name": node}});
    }
    machine
}

/// What Cluster API sends to CanUpdateMachine: spec-only objects (status stripped).
pub fn can_update_machine_request(
    current: &Value,
    desired: &Value,
    infra_current: &Value,
    infra_desired: &Value,
) -> Value {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("status");
        }
        v
    };
    json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "CanUpdateMachineRequest",
        "settings": {},
        "current": {"machine": strip(current), "infrastructureMachine": strip(infra_current), "bootstrapConfig": update_machine_object("bootstrapConfig")},
        "desired": {"machine": strip(desired), "infrastructureMachine": strip(infra_desired), "bootstrapConfig": update_machine_object("bootstrapConfig")},
    })
}

pub fn update_machine_request(machine: &Value) -> Value {
    json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "UpdateMachineRequest",
        "desired": {"machine": machine, "infrastructureMachine": update_machine_object("infrastructureMachine"), "bootstrapConfig": update_machine_object("bootstrapConfig")},
    })
}

/// Simulated agents for the workload cluster's nodes, moved one phase per `step()`: each
/// reads and writes only its own plan, as its node's identity (`system:node:NAME`), through
/// the shipped RBAC and admission policy. The nodes run `rev-old` before; `fail-node` fails
/// its health check and rolls back.
pub async fn sim_agents(bed: &Bed) -> Stepper {
    let mut nodes = Vec::new();
    for node in NODES {
        nodes.push((
            node.to_owned(),
            bed.workload.client_as_node(node).await.unwrap(),
        ));
    }
    let failure = Failure {
        message: "kubelet.service failed its health check (exited with status 1); rolled back"
            .into(),
        ..Failure::rolled_back("HealthCheckFailed")
    };
    let config = SimConfig {
        failures: [("fail-node".to_owned(), failure)].into(),
        running_before: Some("rev-old".into()),
        ..SimConfig::default()
    };
    Stepper::new(nodes, config)
}
