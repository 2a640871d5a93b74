//! The shipped API objects against the real kube-apiserver (Node,RBAC authorization,
//! NodeRestriction, ValidatingAdmissionPolicy) of the pinned release: what the emulator
//! cannot prove because it is our own reading of the server.

// Test code: a failed setup step should fail the test loudly.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan, revision_of};
use inplace_tests::apiserver::ApiServer;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes")
}

/// A server with the CRDs, the agent's RBAC and its admission policy applied.
async fn server_with_agent_objects() -> ApiServer {
    let server = ApiServer::start()
        .await
        .expect("the real API server starts");
    server
        .apply_crd_dir(&packaging().join("crds"))
        .await
        .expect("the CRDs are accepted and become Established");
    let agent = packaging().join("agent");
    server
        .run_kubectl(&["apply", "-f", agent.to_str().unwrap()])
        .expect("the agent's RBAC and admission policy apply");
    server
}

fn plan(node: &str) -> NodeUpdatePlan {
    serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan",
        "metadata": {"name": node},
        "spec": {
            "nodeName": node, "desiredState": "Staged",
            "artifacts": [{"name": "kubernetes", "type": "Sysext", "url": "https://x.example/k.raw", "sha256": "a".repeat(64)}],
        }
    }))
    .unwrap()
}

fn release(artifacts: serde_json::Value) -> NodeRelease {
    serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
        "metadata": {"name": "v1"},
        "spec": {"version": "v1", "artifacts": artifacts},
    }))
    .unwrap()
}

fn sysext(name: &str, digit: &str) -> serde_json::Value {
    json!({"name": name, "type": "Sysext", "url": format!("https://x.example/{name}.raw"), "sha256": digit.repeat(64)})
}

/// The API's refusal of a request: (HTTP code, reason, message). Panics on success or on an
/// error that did not come from the server.
fn refusal<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String, String) {
    match result {
        Err(kube::Error::Api(status)) => {
            (status.code, status.reason.clone(), status.message.clone())
        }
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

fn status_patch() -> Patch<serde_json::Value> {
    Patch::Merge(json!({"status": {"observedGeneration": 1}}))
}

#[tokio::test]
async fn the_shipped_manifests_apply_with_the_real_kubectl() {
    let server = ApiServer::start().await.unwrap();
    let version = server.run_kubectl(&["version", "-o", "json"]).unwrap();
    let version: serde_json::Value = serde_json::from_str(&version).unwrap();
    let server_version = version["serverVersion"]["gitVersion"].as_str().unwrap();
    assert_eq!(
        server_version,
        version["clientVersion"]["gitVersion"].as_str().unwrap(),
        "kubectl is of the server's release"
    );
    assert!(server_version.starts_with("v1."), "{server_version}");

    let all = packaging();
    server
        .run_kubectl(&["apply", "-k", all.to_str().unwrap()])
        .expect("kubectl apply -k packaging/kubernetes");
    // The Cluster API extension's NetworkPolicy is valid for the server (the rest of
    // packaging/kubernetes/capi needs cert-manager's and Cluster API's CRDs).
    let policy = all.join("capi/networkpolicy.yaml");
    server
        .run_kubectl(&["apply", "-f", policy.to_str().unwrap()])
        .expect("kubectl apply -f packaging/kubernetes/capi/networkpolicy.yaml");
    let crds = all.join("crds");
    server
        .run_kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=120s",
            "-f",
            crds.to_str().unwrap(),
        ])
        .unwrap();
    // The everyday verbs docs/usage/cluster-api.md needs (the emulator refused them: protobuf).
    server
        .run_kubectl(&["create", "namespace", "workload"])
        .unwrap();
    server
        .run_kubectl(&[
            "-n",
            "workload",
            "create",
            "secret",
            "generic",
            "kc",
            "--from-literal=value=x",
        ])
        .unwrap();
    let examples = all.join("examples");
    server
        .run_kubectl(&["apply", "-f", examples.to_str().unwrap()])
        .expect("the example objects are valid");
}

#[tokio::test]
async fn a_node_identity_writes_only_the_status_of_its_own_plan() {
    let server = server_with_agent_objects().await;
    let admin: Api<NodeUpdatePlan> = Api::all(server.client().await.unwrap());
    for node in ["worker-1", "worker-2"] {
        admin
            .create(&PostParams::default(), &plan(node))
            .await
            .unwrap();
    }
    let node_client = server.client_as_node("worker-1").await.unwrap();
    let as_node: Api<NodeUpdatePlan> = Api::all(node_client.clone());
    let params = PatchParams::default();

    as_node
        .get("worker-1")
        .await
        .expect("a node reads its plan");
    as_node
        .patch_status("worker-1", &params, &status_patch())
        .await
        .expect("a node writes its own plan's status");

    // A ValidatingAdmissionPolicy takes effect asynchronously after it is created: retry
    // until the server enforces it (bounded; no duration is asserted).
    let deadline = Instant::now() + Duration::from_secs(120);
    let (code, _, message) = loop {
        match as_node
            .patch_status("worker-2", &params, &status_patch())
            .await
        {
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            result => break refusal(result),
        }
    };
    assert_eq!(code, 403);
    assert!(
        message.contains("inplace-node-plan-restriction")
            && message
                .contains("node worker-1 may only write the plan named after it, not worker-2"),
        "{message}"
    );

    // RBAC refuses before any admission policy runs: the message is the authorizer's.
    let (code, reason, message) = refusal(
        as_node
            .patch(
                "worker-1",
                &params,
                &Patch::Merge(json!({"spec": {"desiredState": "Active"}})),
            )
            .await,
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert!(
        message.contains(r#"User "system:node:worker-1" cannot patch resource "nodeupdateplans""#),
        "{message}"
    );
    let (code, _, message) = refusal(
        Api::<NodeRelease>::all(node_client.clone())
            .create(
                &PostParams::default(),
                &release(json!([sysext("kubernetes", "a")])),
            )
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("cannot create resource \"nodereleases\""),
        "{message}"
    );
    let (code, _, message) = refusal(
        Api::<NodeRollout>::all(node_client.clone())
            .list(&Default::default())
            .await,
    );
    assert_eq!(code, 403, "{message}");
    let (code, _, message) = refusal(as_node.delete("worker-2", &Default::default()).await);
    assert_eq!(code, 403, "{message}");
}

/// RBAC grants the agent's rights to the group `system:nodes`; the admission policy must bind
/// every member of that group, not only users named `system:node:*`. (A member with another
/// user name wrote any plan's status: the policy matched on the user name alone.)
#[tokio::test]
async fn a_member_of_system_nodes_that_is_not_a_node_writes_no_plan() {
    let server = server_with_agent_objects().await;
    let admin: Api<NodeUpdatePlan> = Api::all(server.client().await.unwrap());
    admin
        .create(&PostParams::default(), &plan("worker-1"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("impostor.kubeconfig");
    server
        .write_kubeconfig(&kubeconfig, "impostor", &["system:nodes"])
        .unwrap();
    let config = server.config_from(&kubeconfig).await.unwrap();
    let as_impostor: Api<NodeUpdatePlan> = Api::all(kube::Client::try_from(config).unwrap());
    as_impostor
        .get("worker-1")
        .await
        .expect("the group's RBAC lets it read plans");

    // The policy takes effect asynchronously after it is created (bounded retry).
    let deadline = Instant::now() + Duration::from_secs(120);
    let (code, _, message) = loop {
        match as_impostor
            .patch_status("worker-1", &PatchParams::default(), &status_patch())
            .await
        {
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            result => break refusal(result),
        }
    };
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("inplace-node-plan-restriction")
            && message.contains("impostor is in group system:nodes but is not a node identity"),
        "{message}"
    );
}

/// The agent's `nodeKubeletVersion` and `nodeReady` health checks read the node's own Node
/// object. The shipped RBAC grants nothing on nodes: the Node authorizer answers for a
/// kubelet's identity.
#[tokio::test]
async fn a_node_identity_reads_its_node_through_the_node_authorizer() {
    let server = server_with_agent_objects().await;
    let admin: Api<Node> = Api::all(server.client().await.unwrap());
    for name in ["worker-1", "worker-2"] {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        admin.create(&PostParams::default(), &node).await.unwrap();
    }
    let as_node: Api<Node> = Api::all(server.client_as_node("worker-1").await.unwrap());
    as_node
        .get("worker-1")
        .await
        .expect("a kubelet identity reads its own Node");
    // What the docs must say: since Kubernetes 1.32 (AuthorizeNodeWithSelectors) the Node
    // authorizer lets a kubelet read only its own Node, and NodeRestriction lets it change
    // only its own.
    let (code, _, message) = refusal(as_node.get("worker-2").await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("node 'worker-1' cannot read 'worker-2', only its own Node object"),
        "{message}"
    );
    let (code, _, message) = refusal(
        as_node
            .patch(
                "worker-2",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
            )
            .await,
    );
    assert_eq!(code, 403, "{message}");
}

/// `spec.artifacts` is a map list: the real server's `self == oldSelf` ignores its order, so
/// a reordered release is accepted as unchanged, and its revision must not change.
#[tokio::test]
async fn a_reordered_release_is_unchanged_for_the_server_and_keeps_its_revision() {
    let server = server_with_agent_objects().await;
    let api: Api<NodeRelease> = Api::all(server.client().await.unwrap());
    let created = api
        .create(
            &PostParams::default(),
            &release(json!([
                sysext("kubernetes", "a"),
                sysext("containerd", "b")
            ])),
        )
        .await
        .unwrap();
    let reordered =
        json!({"spec": {"artifacts": [sysext("containerd", "b"), sysext("kubernetes", "a")]}});
    let updated = api
        .patch("v1", &PatchParams::default(), &Patch::Merge(reordered))
        .await
        .expect("the server takes a reordered artifact list as the same release");
    assert_ne!(
        created.spec.content.artifacts,
        updated.spec.content.artifacts
    );
    assert_eq!(
        revision_of(&created.spec.content),
        revision_of(&updated.spec.content)
    );

    let changed =
        json!({"spec": {"artifacts": [sysext("containerd", "c"), sysext("kubernetes", "a")]}});
    let (code, _, message) = refusal(
        api.patch("v1", &PatchParams::default(), &Patch::Merge(changed))
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("a NodeRelease is immutable"), "{message}");
}

/// A watch from a resourceVersion that etcd has compacted gets `410 Gone` from the real
/// server (not from our emulator's history window), and kube-runtime's watcher — what the
/// agent and the controller use — relists and goes on.
#[tokio::test]
async fn a_compacted_resource_version_is_gone_and_the_watcher_relists() {
    // No watch cache: a watch is served by etcd, so compaction decides what is too old.
    let server = ApiServer::start_with(&["--watch-cache=false", "--etcd-compaction-interval=2s"])
        .await
        .unwrap();
    server
        .apply_crd_dir(&packaging().join("crds"))
        .await
        .unwrap();
    let api: Api<NodeUpdatePlan> = Api::all(server.client().await.unwrap());
    let created = api
        .create(&PostParams::default(), &plan("worker-1"))
        .await
        .unwrap();
    let old = created.metadata.resource_version.clone().unwrap();
    for generation in 1..=3 {
        let patch = json!({"status": {"observedGeneration": generation}});
        api.patch_status("worker-1", &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }
    // Compaction runs on the server's interval: watch until the old version is refused.
    let deadline = Instant::now() + Duration::from_secs(120);
    let gone = loop {
        let params = kube::api::WatchParams::default().fields("metadata.name=worker-1");
        let mut events = Box::pin(api.watch(&params, &old).await.unwrap());
        let first = futures::StreamExt::next(&mut events).await;
        match first {
            Some(Ok(kube::api::WatchEvent::Error(status))) if status.code == 410 => break status,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(500)).await,
            other => panic!("no 410 Gone for a compacted resourceVersion: {other:?}"),
        }
    };
    assert!(gone.message.contains("too old"), "{gone:?}");

    let mut watcher = Box::pin(kube::runtime::watcher::watcher(
        api.clone(),
        kube::runtime::watcher::Config::default().fields("metadata.name=worker-1"),
    ));
    let latest = latest_plan(&mut watcher).await;
    assert_eq!(latest.status.and_then(|s| s.observed_generation), Some(3));
}

/// The watcher's next Apply/InitApply object.
async fn latest_plan(
    watcher: &mut (
             impl futures::Stream<
        Item = Result<kube::runtime::watcher::Event<NodeUpdatePlan>, kube::runtime::watcher::Error>,
    > + Unpin
         ),
) -> NodeUpdatePlan {
    use kube::runtime::watcher::Event;
    loop {
        let event =
            tokio::time::timeout(Duration::from_secs(180), futures::StreamExt::next(watcher))
                .await
                .expect("the watcher delivers")
                .expect("the stream goes on");
        if let Ok(Event::Apply(plan) | Event::InitApply(plan)) = event {
            return plan;
        }
    }
}

/// kube-apiserver killed mid-watch and started again (etcd keeps the data): the watcher
/// backs off through the outage and delivers the writes made after it.
#[tokio::test]
async fn a_watch_survives_an_api_server_restart() {
    let server = server_with_agent_objects().await;
    let api: Api<NodeUpdatePlan> = Api::all(server.client().await.unwrap());
    api.create(&PostParams::default(), &plan("worker-1"))
        .await
        .unwrap();
    let node_api: Api<NodeUpdatePlan> = Api::all(server.client_as_node("worker-1").await.unwrap());
    let mut watcher = Box::pin(kube::runtime::watcher::watcher(
        node_api,
        kube::runtime::watcher::Config::default().fields("metadata.name=worker-1"),
    ));
    latest_plan(&mut watcher).await;

    server.kill_apiserver().unwrap();
    let down = api.get("worker-1").await;
    assert!(down.is_err(), "the API is down: {down:?}");
    server.resume().unwrap();

    let deadline = Instant::now() + Duration::from_secs(180);
    let patch = json!({"spec": {"desiredState": "Active"}});
    while api
        .patch("worker-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "kube-apiserver did not come back"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    loop {
        let plan = latest_plan(&mut watcher).await;
        if plan.spec.desired_state == inplace_proto::DesiredState::Active {
            break;
        }
    }
}

/// A port found free and taken by another process before kube-apiserver binds it (tests
/// start many servers at once) makes the server move to another port, not fail: the race a
/// CI run of e38ebd8 lost ("bind: address already in use"), here made on purpose.
#[tokio::test]
async fn a_port_taken_before_the_api_server_binds_it_is_traded_for_another() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let server = ApiServer::start_trying_port_first(port).await.unwrap();
    assert_ne!(server.url(), format!("https://127.0.0.1:{port}"));
    let nodes: Api<Node> = Api::all(server.client().await.unwrap());
    nodes.list(&Default::default()).await.unwrap();
    let log = std::fs::read_to_string(server.dir().join("kube-apiserver.log")).unwrap();
    assert!(log.contains("address already in use"), "{log}");
}

/// An agent update (`spec.agent`) travels alone: the server takes a release with the agent
/// image and nothing else, and refuses one that adds artifacts or restarted units (the
/// rules the flattened content brings, kept beside the release's `self == oldSelf`).
#[tokio::test]
async fn an_agent_update_travels_alone_and_the_server_says_so() {
    let server = server_with_agent_objects().await;
    let api: Api<NodeRelease> = Api::all(server.client().await.unwrap());
    let agent = json!({"version": "0.4.0", "url": "https://x.example/inplace-agent-0.4.0.raw",
        "sha256": "c".repeat(64), "signatureUrl": "https://x.example/inplace-agent-0.4.0.raw.minisig"});
    let agent_release = |name: &str, extra: serde_json::Value| -> NodeRelease {
        let mut spec = json!({"version": "agent-0.4.0", "agent": agent});
        for (key, value) in extra.as_object().unwrap() {
            spec[key] = value.clone();
        }
        serde_json::from_value(json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap()
    };
    let created = api
        .create(&PostParams::default(), &agent_release("agent", json!({})))
        .await
        .expect("an agent image alone is a release");
    created
        .validate()
        .expect("and valid for the controller too");

    let refusals = [
        (
            json!({"artifacts": [sysext("kubernetes", "a")]}),
            "spec.artifacts",
        ),
        (
            json!({"activation": {"restartUnits": ["kubelet.service"]}}),
            "spec.activation.restartUnits",
        ),
        (
            json!({"healthChecks": {"units": ["kubelet.service"]}}),
            "spec.healthChecks",
        ),
    ];
    for (extra, field) in refusals {
        let (code, _, message) = refusal(
            api.create(&PostParams::default(), &agent_release("mixed", extra))
                .await,
        );
        assert_eq!(code, 422, "{message}");
        assert!(message.contains(field), "{field} not named: {message}");
    }
    let (code, _, message) = refusal(
        api.create(&PostParams::default(), &release(json!([])))
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("at least one artifact is required"),
        "{message}"
    );
    // The content's rules did not push out the release's own.
    let (code, _, message) = refusal(
        api.patch(
            "agent",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"agent": {"version": "0.4.1"}}})),
        )
        .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("a NodeRelease is immutable"), "{message}");
}

/// A release for x86-64 and arm64 nodes: docs/usage/standalone-rollouts.md § For x86-64 and
/// arm64 nodes as written is accepted, and the schema refuses what the controller's
/// validation refuses: builds for other architectures without the first one's, a build
/// repeating it, the same architecture twice, and an architecture Kubernetes has no name for.
#[tokio::test]
async fn a_release_for_several_architectures_is_accepted_as_documented_and_bad_forms_refused() {
    let server = server_with_agent_objects().await;
    let api: Api<NodeRelease> = Api::all(server.client().await.unwrap());
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/standalone-rollouts.md");
    let block =
        inplace_tests::docs::fenced_block(&page, "### For x86-64 and arm64 nodes", "yaml").unwrap();
    let documented: NodeRelease = serde_yaml::from_str(&block).unwrap();
    let created = api
        .create(&PostParams::default(), &documented)
        .await
        .expect("the documented release is accepted");
    created
        .validate()
        .expect("and valid for the controller too");

    let arm64 = json!({"architecture": "arm64", "url": "https://x.example/k-arm64.raw", "sha256": "b".repeat(64)});
    // Sent as JSON: the typed client could not even write `x86_64`.
    let raw: Api<DynamicObject> = Api::all_with(
        server.client().await.unwrap(),
        &ApiResource::erase::<NodeRelease>(&()),
    );
    let with = |extra: serde_json::Value| -> DynamicObject {
        let mut artifact = sysext("kubernetes", "a");
        for (key, value) in extra.as_object().unwrap() {
            artifact[key] = value.clone();
        }
        serde_json::from_value(json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
            "metadata": {"name": "v1"},
            "spec": {"version": "v1", "artifacts": [artifact]},
        }))
        .unwrap()
    };
    let refusals = [
        (
            json!({"otherArchitectures": [arm64]}),
            "spec.artifacts[0].architecture",
            "otherArchitectures needs architecture",
        ),
        (
            json!({"architecture": "arm64", "otherArchitectures": [arm64]}),
            "spec.artifacts[0].otherArchitectures",
            "repeats the artifact's own architecture",
        ),
        (
            json!({"architecture": "amd64", "otherArchitectures": [arm64, arm64]}),
            "spec.artifacts[0].otherArchitectures[1]",
            "Duplicate value",
        ),
        (
            json!({"architecture": "x86_64"}),
            "spec.artifacts[0].architecture",
            "Unsupported value",
        ),
    ];
    for (extra, field, why) in refusals {
        let (code, _, message) = refusal(raw.create(&PostParams::default(), &with(extra)).await);
        assert_eq!(code, 422, "{message}");
        assert!(
            message.contains(field) && message.contains(why),
            "{field} / {why}: {message}"
        );
    }
}

/// `scripts/demo.sh` passes `target/kube/bin`, relative to the repository root: the
/// control plane must land there, not below `tests/kube/` where the script builds it (a
/// fresh `make demo` then found no kube-testbed on its PATH).
#[test]
fn the_kube_build_script_puts_the_binaries_where_a_relative_out_dir_says() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let work = tempfile::tempdir().unwrap();
    let built = std::process::Command::new(repo.join("tests/kube/build.sh"))
        .arg("relative/bin")
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    for name in ["kube-testbed", "kubectl"] {
        let path = work.path().join("relative/bin").join(name);
        assert!(path.exists(), "{} missing", path.display());
    }
    assert!(!repo.join("tests/kube/relative").exists());
}
