//! CordonAndEvict against a workload cluster (the real kube-apiserver): cordon once, pass
//! after pass, timeout, uncordon only what it cordoned.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use inplace_capi::drain::{CORDONED_ANNOTATION, CordonAndEvict, DRAIN_STARTED_ANNOTATION};
use inplace_capi::{DrainError, DrainProgress, DrainStatus, Drainer, Evictions};
use inplace_drain::cordon::LEGACY_CAPI_CORDONED_ANNOTATION;
use inplace_tests::test_api::TestApi;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;

/// Passes that report `pods_per_call[n]` pods left on call `n` (then none); counts calls.
struct Passes {
    pods_per_call: Vec<usize>,
    calls: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Evictions for Passes {
    async fn pass(&self, _client: &kube::Client, _node: &str) -> Result<DrainProgress, DrainError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let remaining = self.pods_per_call.get(call).copied().unwrap_or(0);
        Ok(DrainProgress {
            remaining,
            blocked: if remaining > 0 {
                vec![
                    "shop/web-1: Cannot evict pod as it would violate the pod's disruption budget"
                        .into(),
                ]
            } else {
                Vec::new()
            },
        })
    }
}

fn pass(pods_per_call: Vec<usize>, calls: Arc<AtomicUsize>) -> Arc<dyn Evictions> {
    Arc::new(Passes {
        pods_per_call,
        calls,
    })
}

async fn node(api: &Api<Node>, name: &str, unschedulable: bool) {
    api.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"unschedulable": unschedulable}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
}

fn cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn has(node: &Node, key: &str) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

#[tokio::test]
async fn cordons_evicts_until_empty_then_uncordons() {
    let workload = TestApi::start().await.unwrap();
    let client = workload.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    node(&nodes, "n1", false).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let drainer =
        CordonAndEvict::with_evictions(pass(vec![2, 1], calls.clone()), Duration::from_secs(600));

    let first = drainer.drain(&client, "n1").await;
    assert_eq!(
        first,
        DrainStatus::InProgress(
            "2 pods left; blocked: shop/web-1: Cannot evict pod as it would violate the pod's disruption budget".into()
        )
    );
    let n1 = nodes.get("n1").await.unwrap();
    assert!(cordoned(&n1));
    assert!(has(&n1, DRAIN_STARTED_ANNOTATION) && has(&n1, CORDONED_ANNOTATION));
    let started = n1.metadata.annotations.as_ref().unwrap()[DRAIN_STARTED_ANNOTATION].clone();

    assert!(
        matches!(drainer.drain(&client, "n1").await, DrainStatus::InProgress(m) if m.starts_with("1 pods left"))
    );
    assert_eq!(drainer.drain(&client, "n1").await, DrainStatus::Drained);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // The start time was written once.
    let n1 = nodes.get("n1").await.unwrap();
    assert_eq!(
        n1.metadata.annotations.as_ref().unwrap()[DRAIN_STARTED_ANNOTATION],
        started
    );

    drainer.uncordon(&client, "n1").await.unwrap();
    let n1 = nodes.get("n1").await.unwrap();
    assert!(!cordoned(&n1));
    assert!(!has(&n1, DRAIN_STARTED_ANNOTATION) && !has(&n1, CORDONED_ANNOTATION));
    // Idempotent.
    drainer.uncordon(&client, "n1").await.unwrap();
}

#[tokio::test]
async fn a_node_cordoned_by_someone_else_stays_cordoned() {
    let workload = TestApi::start().await.unwrap();
    let client = workload.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    node(&nodes, "n2", true).await;
    let drainer =
        CordonAndEvict::with_evictions(pass(vec![], Arc::default()), Duration::from_secs(600));
    assert_eq!(drainer.drain(&client, "n2").await, DrainStatus::Drained);
    assert!(!has(&nodes.get("n2").await.unwrap(), CORDONED_ANNOTATION));
    drainer.uncordon(&client, "n2").await.unwrap();
    let n2 = nodes.get("n2").await.unwrap();
    assert!(cordoned(&n2), "left cordoned as found");
    assert!(!has(&n2, DRAIN_STARTED_ANNOTATION));
}

#[tokio::test]
async fn a_drain_past_its_timeout_fails_with_what_blocks_it() {
    let workload = TestApi::start().await.unwrap();
    let client = workload.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    node(&nodes, "n3", false).await;
    let drainer =
        CordonAndEvict::with_evictions(pass(vec![1, 1, 1], Arc::default()), Duration::ZERO);
    let status = drainer.drain(&client, "n3").await;
    let DrainStatus::Failed(message) = status else {
        panic!("{status:?}")
    };
    assert!(
        message.starts_with("not drained within 0s: 1 pods left; blocked: shop/web-1"),
        "{message}"
    );
    assert!(
        matches!(drainer.drain(&client, "missing").await, DrainStatus::InProgress(m) if m.contains("reading the node"))
    );
}

#[tokio::test]
async fn a_node_cordoned_by_an_older_extension_is_still_uncordoned() {
    // Before the one drain, the extension recorded its cordon as inplace.dev/capi-cordoned.
    let workload = TestApi::start().await.unwrap();
    let client = workload.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "n4", "annotations": {
                    DRAIN_STARTED_ANNOTATION: "2026-11-20T08:00:00Z",
                    LEGACY_CAPI_CORDONED_ANNOTATION: "true",
                }},
                "spec": {"unschedulable": true},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let drainer =
        CordonAndEvict::with_evictions(pass(vec![], Arc::default()), Duration::from_secs(600));
    drainer.uncordon(&client, "n4").await.unwrap();
    let n4 = nodes.get("n4").await.unwrap();
    assert!(!cordoned(&n4));
    assert!(!has(&n4, LEGACY_CAPI_CORDONED_ANNOTATION) && !has(&n4, DRAIN_STARTED_ANNOTATION));
}
