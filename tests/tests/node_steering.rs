//! A node's own identity and the `inplace.dev/*` keys of its Node, on the real
//! kube-apiserver with the agent's shipped objects (`packaging/kubernetes/agent`).
//! NodeRestriction lets a kubelet change the labels and annotations of its own Node, so
//! without a policy a compromised node could hold itself (`inplace.dev/hold`), skip
//! (`inplace.dev/skip`) or retry its updates; the shipped `inplace-node-steering` policy
//! refuses every change of an `inplace.dev/` label or annotation made by a node identity,
//! and lets everything else a kubelet does to its Node through.

// Test code: a failed setup step should fail the test loudly.

use inplace_tests::apiserver::ApiServer;
use inplace_tests::test_api::TestApi;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn merge(metadata: Value) -> Patch<Value> {
    Patch::Merge(json!({ "metadata": metadata }))
}

#[tokio::test]
async fn a_node_cannot_steer_its_own_updates_through_its_node_object() {
    // The real server only: what is proved is the server's NodeRestriction and admission.
    let api = TestApi::Real(ApiServer::start().await.unwrap());
    api.install_agent_objects().await.unwrap();
    let admin: Api<Node> = Api::all(api.client().await.unwrap());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "worker-1",
        "annotations": {"inplace.dev/hold": "true"}}}))
    .unwrap();
    admin.create(&PostParams::default(), &node).await.unwrap();
    let as_node: Api<Node> = Api::all(api.client_as_node("worker-1").await.unwrap());
    let params = PatchParams::default();
    // A ValidatingAdmissionPolicy takes effect asynchronously after it is created: probe
    // with a value that changes each time until the server enforces it (bounded; no
    // duration is asserted), then put the Node back as it was.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    for attempt in 0.. {
        let probe = json!({"annotations": {"inplace.dev/probe": attempt.to_string()}});
        match as_node.patch("worker-1", &params, &merge(probe)).await {
            Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await
            }
            _ => break,
        }
    }
    admin
        .patch(
            "worker-1",
            &params,
            &merge(json!({"annotations": {"inplace.dev/probe": null, "inplace.dev/hold": "true"}})),
        )
        .await
        .unwrap();

    for (what, change) in [
        (
            "its hold removed",
            json!({"annotations": {"inplace.dev/hold": null}}),
        ),
        (
            "skip added",
            json!({"annotations": {"inplace.dev/skip": "true"}}),
        ),
        (
            "a retry token",
            json!({"annotations": {"inplace.dev/retry": "t1"}}),
        ),
        (
            "an inplace.dev label",
            json!({"labels": {"inplace.dev/x": "y"}}),
        ),
    ] {
        let refused = as_node.patch("worker-1", &params, &merge(change)).await;
        match refused {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 403, "{what}: {status:?}");
                assert!(
                    status.message.contains("inplace-node-steering")
                        && status.message.contains("inplace.dev/"),
                    "{what}: {}",
                    status.message
                );
            }
            other => panic!("{what}: the node's own identity was let through: {other:?}"),
        }
    }

    // What a kubelet does to its own Node goes on: other labels and annotations.
    as_node
        .patch(
            "worker-1",
            &params,
            &merge(json!({"labels": {"example.com/role": "web"},
                          "annotations": {"node.alpha.kubernetes.io/ttl": "0"}})),
        )
        .await
        .expect("a kubelet's own label and annotation changes pass");
    // And an administrator still steers.
    admin
        .patch(
            "worker-1",
            &params,
            &merge(json!({"annotations": {"inplace.dev/hold": null, "inplace.dev/skip": "true"}})),
        )
        .await
        .expect("an administrator holds and skips nodes");
    let annotations = admin
        .get("worker-1")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default();
    assert_eq!(
        annotations.get("inplace.dev/skip").map(String::as_str),
        Some("true")
    );
    assert!(!annotations.contains_key("inplace.dev/hold"));
}
