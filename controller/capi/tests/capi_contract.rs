//! The extension against Cluster API itself: `hookcheck` (tests/capi, Go, Cluster API's own
//! types at the pinned release; its ExtensionConfig, Machine, MachineSet and KubeadmConfig
//! objects stored in the management cluster under Cluster API's own CRDs) discovers the extension and calls every handler exactly as
//! Cluster API's runtime client does, applies the returned patches as Cluster API does and
//! checks its conclusions, then drives UpdateMachine to done while a simulated agent
//! finishes the plan and a simulated kubelet lets evicted pods go, with drain on. Every
//! exchange it records must equal the golden files the Rust suites are built on
//! (`tests/golden`); `make capi-golden` rewrites them.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use inplace_capi::CordonAndEvict;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::discovery::{Scope, pinned_kind};
use serde_json::{Value, json};

/// The harness's ExtensionConfig, KubeadmConfig, KubeadmConfigTemplate and MachineSet,
/// created in the management cluster: Cluster API's own CRDs must accept them.
async fn store_hook_objects(bed: &Bed, harness: &Path, url: &str) {
    for file in inplace_tests::capi::hook_object_crd_files().unwrap() {
        bed.management.apply_crd_file(&file).await.unwrap();
    }
    let output = tokio::process::Command::new(harness)
        .args(["-print-objects", "-url", url, "-ca"])
        .arg(&bed.cert_file)
        .args(["-namespace", NAMESPACE, "-cluster", CLUSTER])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let objects: Vec<DynamicObject> = serde_json::from_slice(&output.stdout).unwrap();
    for object in objects {
        let types = object.types.clone().unwrap();
        let gvk = GroupVersionKind::try_from(&types).unwrap();
        let (resource, capabilities) = pinned_kind(&bed.management_client, &gvk).await.unwrap();
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Cluster => Api::all_with(bed.management_client.clone(), &resource),
            Scope::Namespaced => {
                Api::namespaced_with(bed.management_client.clone(), NAMESPACE, &resource)
            }
        };
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("Cluster API's CRD refuses {}: {e}", types.kind));
    }
}

/// A pod of a workload on the node, for the drain to evict.
async fn put_pod(bed: &Bed, node: &str) {
    let pods: Api<Pod> = Api::namespaced(bed.workload_client.clone(), "default");
    let pod = json!({"metadata": {"name": "web-1", "namespace": "default"},
                     "spec": {"nodeName": node, "containers": [{"name": "web", "image": "web:1"}]}});
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
}

/// What a kubelet does for evicted pods: removes them once they are marked for deletion.
async fn let_evicted_pods_go(bed: &Bed) {
    let pods: Api<Pod> = Api::all(bed.workload_client.clone());
    for pod in pods.list(&ListParams::default()).await.unwrap().items {
        if pod.metadata.deletion_timestamp.is_some() {
            let ns: Api<Pod> = Api::namespaced(
                bed.workload_client.clone(),
                pod.metadata.namespace.as_deref().unwrap(),
            );
            let _ = ns
                .delete(
                    pod.metadata.name.as_deref().unwrap(),
                    &DeleteParams::default().grace_period(0),
                )
                .await;
        }
    }
}

async fn unschedulable(bed: &Bed, node: &str) -> bool {
    let nodes: Api<Node> = Api::all(bed.workload_client.clone());
    let node = nodes.get(node).await.unwrap();
    node.spec.and_then(|s| s.unschedulable).unwrap_or(false)
}

/// The Machine the harness asks UpdateMachine for, as Cluster API leaves it in the
/// management cluster during an in-place update.
async fn machine_from_harness(harness: &std::path::Path) -> Value {
    let output = tokio::process::Command::new(harness)
        .args([
            "-print-machine",
            "-namespace",
            NAMESPACE,
            "-cluster",
            CLUSTER,
        ])
        .args(["-node", "node-1"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test]
async fn cluster_api_s_own_client_and_types_accept_every_answer() {
    let harness = inplace_tests::capi::hookcheck().unwrap();
    let drainer = Arc::new(CordonAndEvict::new(
        Duration::from_secs(60),
        inplace_proto::OnDrainTimeout::Halt,
    ));
    let bed = Bed::start_with(Topology::Separate, true, drainer, 30).await;
    let recorded = tempfile::tempdir().unwrap();
    put_pod(&bed, "node-1").await;
    bed.store_machine(&machine_from_harness(&harness).await)
        .await;
    let url = format!("https://localhost:{}", bed.addr.port());
    store_hook_objects(&bed, &harness, &url).await;

    let mut run = tokio::process::Command::new(&harness)
        .args(["-url", &url])
        .arg("-ca")
        .arg(&bed.cert_file)
        .args([
            "-namespace",
            NAMESPACE,
            "-cluster",
            CLUSTER,
            "-node",
            "node-1",
        ])
        .args(["-until-done", "-poll", "200ms", "-deadline", "90s"])
        .arg("-golden")
        .arg(recorded.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let agent = sim_agents(&bed).await;
    let mut seen_cordoned = false;
    let status = loop {
        if let Some(status) = run.try_wait().unwrap() {
            break status;
        }
        seen_cordoned |= unschedulable(&bed, "node-1").await;
        let_evicted_pods_go(&bed).await;
        agent.step().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let output = run.wait_with_output().await.unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{said}");
    assert!(status.success(), "hookcheck failed:\n{said}");
    assert!(said.contains("ok   update-machine: done"), "{said}");
    assert!(seen_cordoned, "the node was never cordoned:\n{said}");
    assert!(!unschedulable(&bed, "node-1").await, "left cordoned");
    let pods: Api<Pod> = Api::all(bed.workload_client.clone());
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "the pod was not evicted"
    );
    bed.stop().await;
    check_golden(recorded.path());
}

/// Set to `write` (by `make capi-golden`) to rewrite the golden files from this run.
const GOLDEN_ENV: &str = "INPLACE_CAPI_GOLDEN";

/// Fails when what Cluster API's client exchanged differs from the golden files (or, with
/// `INPLACE_CAPI_GOLDEN=write`, makes the golden files what it exchanged).
fn check_golden(recorded: &Path) {
    let names = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let golden = golden_dir();
    if std::env::var(GOLDEN_ENV).as_deref() == Ok("write") {
        std::fs::create_dir_all(&golden).unwrap();
        for stale in names(&golden) {
            std::fs::remove_file(golden.join(stale)).unwrap();
        }
        for name in names(recorded) {
            std::fs::copy(recorded.join(&name), golden.join(&name)).unwrap();
        }
        return;
    }
    let (seen, kept) = (names(recorded), names(&golden));
    assert_eq!(
        seen, kept,
        "the exchanges differ from the golden files: run `make capi-golden`"
    );
    for name in seen {
        let read = |dir: &Path| std::fs::read_to_string(dir.join(&name)).unwrap();
        assert!(
            read(recorded) == read(&golden),
            "{name} differs from the golden file (run `make capi-golden` and review the diff):\n{}",
            read(recorded)
        );
    }
}
