//! CordonAndEvict against a workload cluster (the real kube-apiserver): cordon once, pass
//! after pass, timeout (`Halt` or `Force`), uncordon only what it cordoned.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use inplace_capi::drain::{CORDONED_ANNOTATION, CordonAndEvict, DRAIN_STARTED_ANNOTATION};
use inplace_capi::{DrainError, DrainProgress, DrainStatus, Drainer, Evictions};
use inplace_drain::DrainOptions;
use inplace_drain::cordon::LEGACY_CAPI_CORDONED_ANNOTATION;
use inplace_proto::OnDrainTimeout::{Force, Halt};
use inplace_tests::test_api::TestApi;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use serde_json::json;

/// Passes that report `pods_per_call[n]` pods left on call `n` (then none); records whether
/// each call was asked to force.
#[derive(Default)]
struct Passes {
    pods_per_call: Vec<usize>,
    forced: Mutex<Vec<bool>>,
}

#[async_trait::async_trait]
impl Evictions for Passes {
    async fn pass(
        &self,
        _client: &kube::Client,
        _node: &str,
        options: &DrainOptions,
    ) -> Result<DrainProgress, DrainError> {
        let mut forced = self.forced.lock().unwrap();
        let remaining = self.pods_per_call.get(forced.len()).copied().unwrap_or(0);
        forced.push(options.force);
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

impl Passes {
    fn forced(&self) -> Vec<bool> {
        self.forced.lock().unwrap().clone()
    }
}

fn passes(pods_per_call: Vec<usize>) -> Arc<Passes> {
    Arc::new(Passes {
        pods_per_call,
        ..Passes::default()
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
    let workload = TestApi::start_shared().await.unwrap();
    let client = workload.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    node(&nodes, "n1", false).await;
    let passes = passes(vec![2, 1]);
    let drainer = CordonAndEvict::with_evictions(passes.clone(), Duration::from_secs(600), Halt);

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
    assert_eq!(passes.forced(), [false; 3], "three passes, none forced");
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
    let workload = TestApi::start_shared().await.unwrap();
    let client = workload.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    node(&nodes, "n2", true).await;
    let drainer = CordonAndEvict::with_evictions(passes(vec![]), Duration::from_secs(600), Halt);
    assert_eq!(drainer.drain(&client, "n2").await, DrainStatus::Drained);
    assert!(!has(&nodes.get("n2").await.unwrap(), CORDONED_ANNOTATION));
    drainer.uncordon(&client, "n2").await.unwrap();
    let n2 = nodes.get("n2").await.unwrap();
    assert!(cordoned(&n2), "left cordoned as found");
    assert!(!has(&n2, DRAIN_STARTED_ANNOTATION));
}

#[tokio::test]
async fn a_drain_past_its_timeout_fails_with_what_blocks_it() {
    let workload = TestApi::start_shared().await.unwrap();
    let client = workload.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    node(&nodes, "n3", false).await;
    let drainer = CordonAndEvict::with_evictions(passes(vec![1, 1, 1]), Duration::ZERO, Halt);
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

/// A node whose drain started `seconds_ago` (the extension's own annotation, as after a
/// restart), cordoned by it.
async fn node_draining_since(api: &Api<Node>, name: &str, seconds_ago: i64) {
    let started = Timestamp::now() - SignedDuration::from_secs(seconds_ago);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {
                DRAIN_STARTED_ANNOTATION: started.to_string(),
                CORDONED_ANNOTATION: "true",
            }},
            "spec": {"unschedulable": true},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn force_deletes_what_is_left_after_the_timeout_and_fails_one_timeout_later() {
    let workload = TestApi::start_shared().await.unwrap();
    let client = workload.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let timeout = Duration::from_secs(60);

    // Within the timeout: evictions, not forced.
    node_draining_since(&nodes, "f1", 10).await;
    let evicting = passes(vec![1]);
    let drainer = CordonAndEvict::with_evictions(evicting.clone(), timeout, Force);
    assert!(
        matches!(drainer.drain(&client, "f1").await, DrainStatus::InProgress(m) if m.starts_with("1 pods left"))
    );
    assert_eq!(evicting.forced(), [false]);

    // Past it: the pass deletes, the update waits for the pods to go, then goes on.
    node_draining_since(&nodes, "f2", 90).await;
    let forcing = passes(vec![1, 0]);
    let drainer = CordonAndEvict::with_evictions(forcing.clone(), timeout, Force);
    let status = drainer.drain(&client, "f2").await;
    let DrainStatus::InProgress(message) = status else {
        panic!("{status:?}")
    };
    assert!(
        message.starts_with(
            "not drained within 60s: 1 pods left, deleted without eviction (drain-on-timeout Force)"
        ),
        "{message}"
    );
    assert_eq!(drainer.drain(&client, "f2").await, DrainStatus::Drained);
    assert_eq!(forcing.forced(), [true, true]);

    // Past twice the timeout: failed, naming what is left.
    node_draining_since(&nodes, "f3", 130).await;
    let drainer = CordonAndEvict::with_evictions(passes(vec![2]), timeout, Force);
    let status = drainer.drain(&client, "f3").await;
    let DrainStatus::Failed(message) = status else {
        panic!("{status:?}")
    };
    assert!(
        message.starts_with(
            "not drained within 60s, nor 60s after its remaining pods were deleted: 2 pods left"
        ),
        "{message}"
    );
}

#[tokio::test]
async fn a_node_cordoned_by_an_older_extension_is_still_uncordoned() {
    // Before the one drain, the extension recorded its cordon as inplace.dev/capi-cordoned.
    let workload = TestApi::start_shared().await.unwrap();
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
    let drainer = CordonAndEvict::with_evictions(passes(vec![]), Duration::from_secs(600), Halt);
    drainer.uncordon(&client, "n4").await.unwrap();
    let n4 = nodes.get("n4").await.unwrap();
    assert!(!cordoned(&n4));
    assert!(!has(&n4, LEGACY_CAPI_CORDONED_ANNOTATION) && !has(&n4, DRAIN_STARTED_ANNOTATION));
}
