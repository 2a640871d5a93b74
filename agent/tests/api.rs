//! The agent against a Kubernetes API, through the real kube client: it watches only its own
//! plan (field selector), writes only the status subresource as `system:node:<name>` with
//! nothing but the shipped RBAC and admission policy, and survives outages, 410 Gone and
//! conflicts. Systemd and downloads are faked (`common/mod.rs`).
//!
//! The API is the real kube-apiserver of the pinned release; the case that needs faults on
//! demand (an outage, a watch resumed into 410 Gone, a storm of 409s) runs on the emulator.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Bed, NODE};
use inplace_agent::{status, watch};
use inplace_api_emulator::{AuthzMode, EmulatorConfig, OutageKind};
use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::plans;
use inplace_tests::test_api::{TestApi, packaging};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

/// Generous: the machine running the tests may be loaded; nothing here measures speed.
const PATIENCE: Duration = Duration::from_secs(60);

struct Running {
    test_api: TestApi,
    admin: kube::Api<NodeUpdatePlan>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The run's shared real API server (this test's turn on it) and an agent (watch + status
/// writer + coordinator) for `NODE`, connected as the node's kubelet would be.
async fn start(bed: &Bed) -> Running {
    start_on(
        bed,
        TestApi::start_shared()
            .await
            .expect("the API server starts"),
    )
    .await
}

/// [`start`] against `test_api`: the CRDs and the agent's shipped RBAC and admission policy
/// applied, the agent's client built from the node's kubelet kubeconfig.
async fn start_on(bed: &Bed, test_api: TestApi) -> Running {
    test_api.install_agent_objects().await.unwrap();
    let admin: kube::Api<NodeUpdatePlan> = kube::Api::all(test_api.client().await.unwrap());

    // The agent's own client, from a kubeconfig file, as in production.
    let kubeconfig = bed.root().join("kubelet.conf");
    std::fs::write(&kubeconfig, test_api.node_kubeconfig_yaml(NODE).unwrap()).unwrap();
    let client = inplace_agent::kube_client::client(
        &inplace_agent::settings::KubeAuth::Kubeconfig(kubeconfig),
    )
    .await
    .unwrap();
    let plans: kube::Api<NodeUpdatePlan> = kube::Api::all(client);

    let (sink, status_rx) = status::channel(plans.clone(), NODE.to_owned());
    let writer = tokio::spawn(status::run_writer(
        plans.clone(),
        NODE.to_owned(),
        status_rx,
        Duration::from_millis(200),
    ));
    let (tx, rx) = tokio::sync::watch::channel(None);
    let watcher = tokio::spawn(watch::run(plans, NODE.to_owned(), tx));
    let mut agent = bed.agent_with(Arc::new(sink)).await;
    let coordinator = tokio::spawn(async move {
        agent.follow(rx).await.unwrap();
    });
    Running {
        test_api,
        admin,
        tasks: vec![writer, watcher, coordinator],
    }
}

async fn wait_for(admin: &kube::Api<NodeUpdatePlan>, name: &str, phase: Phase, revision: &str) {
    if let Err(unmet) = plans::wait_phase(admin, name, phase, revision, PATIENCE).await {
        panic!("{name} never reached {phase:?}: {unmet}");
    }
}

fn revision(plan: &NodeUpdatePlan) -> String {
    inplace_proto::revision_of(&plan.spec.content)
}

#[tokio::test]
async fn reports_through_the_status_subresource_only() {
    let bed = Bed::new();
    let run = start(&bed).await;
    let plan = bed.plan("OK v1", "kubectl v1", "Active");
    let created = run
        .admin
        .create(&PostParams::default(), &plan)
        .await
        .unwrap();
    wait_for(&run.admin, NODE, Phase::Succeeded, &revision(&plan)).await;
    let now = run.admin.get(NODE).await.unwrap();
    assert_eq!(now.spec, created.spec, "the agent never touches the spec");
    let status = now.status.unwrap();
    assert_eq!(status.current_revision, Some(revision(&plan)));
    assert_eq!(status.observed_generation, created.metadata.generation);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Succeeded")
    );
    assert_eq!(bed.link(), "OK v1");

    // Staged only, then the other node's plan is left alone.
    let mut other = bed.plan("OK v1", "kubectl v1", "Active");
    other.metadata.name = Some("worker-2".into());
    other.spec.node_name = "worker-2".into();
    run.admin
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    let staged = bed.plan("OK v2", "kubectl v2", "Staged");
    let patch = serde_json::json!({"spec": staged.spec});
    run.admin
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(&run.admin, NODE, Phase::Staged, &revision(&staged)).await;
    assert_eq!(
        bed.link(),
        "OK v1",
        "staging leaves the running revision alone"
    );
    assert!(run.admin.get("worker-2").await.unwrap().status.is_none());
}

/// On the emulator: the real server cannot be made to answer 409 or 410 at a chosen moment
/// (crash_matrix.rs kills the real one for an outage).
#[tokio::test]
async fn catches_up_after_an_outage_a_gone_watch_and_conflicts() {
    let bed = Bed::new();
    let emulator = TestApi::start_emulator(EmulatorConfig {
        authz: AuthzMode::Rbac,
        ..EmulatorConfig::default()
    })
    .await
    .unwrap();
    let run = start_on(&bed, emulator).await;
    let faults = run.test_api.emulator().unwrap().faults();
    let v1 = bed.plan("OK v1", "kubectl v1", "Active");
    run.admin.create(&PostParams::default(), &v1).await.unwrap();
    wait_for(&run.admin, NODE, Phase::Succeeded, &revision(&v1)).await;

    // The spec changes, and the server goes away right after.
    let v2 = bed.plan("OK v2", "kubectl v2", "Active");
    let patch = serde_json::json!({"spec": v2.spec});
    run.admin
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    faults.outage(Duration::from_millis(1500), OutageKind::ConnectionRefused);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    faults.end_outage();
    wait_for(&run.admin, NODE, Phase::Succeeded, &revision(&v2)).await;
    assert_eq!(bed.link(), "OK v2");

    // The next watch is told 410 Gone, and the next status writes conflict.
    faults.gone_next_watches(1);
    faults.cut_watches();
    let v3 = bed.plan("OK v3", "kubectl v3", "Active");
    let patch = serde_json::json!({"spec": v3.spec});
    run.admin
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    // Armed after our own write: the agent's status writes get them.
    faults.conflict_next_writes(2);
    wait_for(&run.admin, NODE, Phase::Succeeded, &revision(&v3)).await;
    assert_eq!(bed.link(), "OK v3");
}

#[tokio::test]
async fn deleted_plan_leaves_the_committed_revision() {
    let bed = Bed::new();
    let run = start(&bed).await;
    let v1 = bed.plan("OK v1", "kubectl v1", "Active");
    run.admin.create(&PostParams::default(), &v1).await.unwrap();
    wait_for(&run.admin, NODE, Phase::Succeeded, &revision(&v1)).await;
    run.admin
        .delete(NODE, &DeleteParams::default())
        .await
        .unwrap();
    // A new plan (new uid) for the same content is reported again from scratch.
    run.admin.create(&PostParams::default(), &v1).await.unwrap();
    wait_for(&run.admin, NODE, Phase::Succeeded, &revision(&v1)).await;
    assert_eq!(bed.link(), "OK v1");
}

#[tokio::test]
async fn works_with_the_shipped_rbac_and_admission_policy_only() {
    let bed = Bed::new();
    let run = start(&bed).await;
    let plan = bed.plan("OK v1", "kubectl v1", "Active");
    run.admin
        .create(&PostParams::default(), &plan)
        .await
        .unwrap();
    wait_for(&run.admin, NODE, Phase::Succeeded, &revision(&plan)).await;

    // The same identity may not write another node's plan status.
    let mut other = bed.plan("OK v1", "kubectl v1", "Active");
    other.metadata.name = Some("worker-2".into());
    other.spec.node_name = "worker-2".into();
    run.admin
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    assert!(run.admin.get("worker-2").await.unwrap().status.is_none());
    let node_client = run.test_api.client_as_node(NODE).await.unwrap();
    let as_node: kube::Api<NodeUpdatePlan> = kube::Api::all(node_client);
    let status = serde_json::json!({"status": {"phase": "Succeeded"}});
    // A ValidatingAdmissionPolicy takes effect asynchronously after it is created on the
    // real server (RBAC alone lets a node write any plan's status): retry until enforced.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let err = loop {
        match as_node
            .patch_status("worker-2", &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Ok(plan) => panic!("the admission policy never refused: {plan:?}"),
            Err(err) => break err,
        }
    };
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err}"
    );
}

#[tokio::test]
async fn real_probes_read_the_nodes_kubelet_version_and_ready() {
    let test_api = TestApi::start_shared().await.unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
        kube::Api::all(test_api.client().await.unwrap());
    for name in [NODE, "worker-2"] {
        let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let status = serde_json::json!({"status": {"nodeInfo": {
        "kubeletVersion": "v1.31.2", "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "",
        "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux",
        "osImage": "", "systemUUID": ""},
        "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
            "message": "container runtime network not ready",
            "lastHeartbeatTime": "2026-11-30T03:40:05Z"}]}});
    nodes
        .patch_status(NODE, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let client = test_api.client_as_node(NODE).await.unwrap();
    let probes =
        inplace_agent::health::RealProbes::new(Some(client.clone()), NODE, Duration::from_secs(5))
            .unwrap();
    use inplace_agent::health::Probes;
    // One read for both Node checks: the kubelet version and the Ready condition.
    let node = probes.node_status().await.unwrap();
    assert_eq!(node.kubelet_version.as_deref(), Some("v1.31.2"));
    assert_eq!(
        node.ready,
        Some(inplace_agent::health::ReadyCondition {
            status: "False".into(),
            reason: "KubeletNotReady".into(),
            message: "container runtime network not ready".into(),
            last_heartbeat: Some(std::time::UNIX_EPOCH + Duration::from_secs(1_796_010_005)),
        })
    );
    // The Node authorizer lets a kubelet identity read its own Node only.
    let other =
        inplace_agent::health::RealProbes::new(Some(client), "worker-2", Duration::from_secs(5))
            .unwrap();
    let err = other.node_status().await.unwrap_err();
    assert!(err.contains("forbidden"), "{err}");

    // HTTP checks: 2xx passes, anything else names the status.
    let http = ArtifactServer::start().await.unwrap();
    http.put_bytes("/healthz", b"ok".to_vec());
    assert!(probes.http_ok(&http.url("/healthz")).await.is_ok());
    let err = probes
        .http_ok(&http.url("/no/such/path"))
        .await
        .unwrap_err();
    assert!(err.contains("404"), "{err}");
}

/// The other way the agent authenticates (`[kube] server`, `token_file`, `ca_file`): a
/// ServiceAccount's token over https, trusting the cluster's CA from a PEM file. Only a real
/// server shows it: the emulator speaks plain http with its own tokens. The account is bound
/// to the shipped `inplace-agent` ClusterRole, so it reads plans like a node does.
#[tokio::test]
async fn a_token_file_and_a_ca_file_reach_the_real_server() {
    let server = inplace_tests::apiserver::ApiServer::start_shared()
        .await
        .unwrap();
    server.apply_crd_dir(&packaging("crds")).await.unwrap();
    let agent = packaging("agent");
    server
        .run_kubectl(&["apply", "-f", agent.to_str().unwrap()])
        .unwrap();
    server
        .run_kubectl(&["create", "serviceaccount", "agent", "-n", "default"])
        .unwrap();
    server
        .run_kubectl(&[
            "create",
            "clusterrolebinding",
            "agent-token",
            "--clusterrole=inplace-agent",
            "--serviceaccount=default:agent",
        ])
        .unwrap();
    let token = server
        .run_kubectl(&["create", "token", "agent", "-n", "default"])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token.trim()).unwrap();

    let bed = Bed::new();
    let plan = bed.plan("OK v1", "kubectl v1", "Active");
    let admin: kube::Api<NodeUpdatePlan> = kube::Api::all(server.client().await.unwrap());
    admin.create(&PostParams::default(), &plan).await.unwrap();

    let client =
        inplace_agent::kube_client::client(&inplace_agent::settings::KubeAuth::TokenFile {
            server: server.url().to_owned(),
            token_file,
            ca_file: Some(server.dir().join("pki/ca.crt")),
        })
        .await
        .unwrap();
    let plans: kube::Api<NodeUpdatePlan> = kube::Api::all(client);
    let read = plans.get(NODE).await.expect("the token reads the plan");
    assert_eq!(read.spec, plan.spec);
    // Without the CA the server's certificate is not trusted (no silent fallback).
    let untrusted =
        inplace_agent::kube_client::client(&inplace_agent::settings::KubeAuth::TokenFile {
            server: server.url().to_owned(),
            token_file: dir.path().join("token"),
            ca_file: None,
        })
        .await
        .unwrap();
    let err = kube::Api::<NodeUpdatePlan>::all(untrusted)
        .get(NODE)
        .await
        .unwrap_err();
    assert!(!matches!(err, kube::Error::Api(_)), "{err}");
}

/// `inplace.dev/retry` on the plan, read with the node's identity: a revision denied here
/// is staged again while the plan asks for `Staged`, and the token is reported in `status.retryHonoured` through the status subresource (the shipped RBAC and
/// admission policy only).
#[tokio::test]
async fn a_retry_token_on_the_plan_stages_a_denied_revision_again() {
    let bed = Bed::new();
    let run = start(&bed).await;
    let plan = bed.plan("OK v1", "kubectl v1", "Staged");
    let url = plan.spec.content.artifacts[0].url.clone();
    // The download does not match its sha256: the revision is denied.
    let good = bed
        .fetcher
        .objects
        .lock()
        .unwrap()
        .insert(url.clone(), b"not it".to_vec())
        .unwrap();
    run.admin
        .create(&PostParams::default(), &plan)
        .await
        .unwrap();
    let rev = revision(&plan);
    wait_for(&run.admin, NODE, Phase::Failed, &rev).await;
    let status = run.admin.get(NODE).await.unwrap().status.unwrap();
    assert_eq!(status.failed_revisions, vec![rev.clone()]);
    assert_eq!(status.retry_honoured, None);

    // The download is repaired; a person asks for a retry.
    bed.fetcher.objects.lock().unwrap().insert(url, good);
    let annotate = |token: &str| {
        serde_json::json!({"metadata": {"annotations": {
            inplace_proto::steering::RETRY_ANNOTATION: token
        }}})
    };
    run.admin
        .patch(NODE, &PatchParams::default(), &Patch::Merge(annotate("t1")))
        .await
        .unwrap();
    wait_for(&run.admin, NODE, Phase::Staged, &rev).await;
    let status = run.admin.get(NODE).await.unwrap().status.unwrap();
    assert_eq!(status.retry_honoured.as_deref(), Some("t1"));
    assert!(status.failed_revisions.is_empty(), "{status:?}");
}
