//! An agent update (`spec.agent`, issue 23) rolled out like any release, against the real
//! kube-apiserver with simulated agents writing their plan's status as the node: the
//! controller copies the agent image into every plan under the release's revision, and a
//! broken agent release halts at `maxFailures` after its first node.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::time::Duration;

use inplace_proto::{DesiredState, NodeRelease, revision_of};
use kube::api::PostParams;
use serde_json::json;
use support::sim_agent::{Failure, SimConfig};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_agent_release_to_three_nodes_halts_after_the_first_with_max_failures_zero() {
    let bed = Bed::start().await;
    let nodes = ["worker-1", "worker-2", "worker-3"];
    let mut config = SimConfig::default();
    // Every node's new agent fails to confirm itself: the guard restores the old agent,
    // which reports RolledBack with the guard's reason.
    for name in nodes {
        config
            .failures
            .insert(name.into(), Failure::rolled_back("AgentNotConfirmed"));
    }
    let fleet = bed.fleet(config);
    for name in nodes {
        create_node(&bed.client, name, &[]).await;
    }
    let release: NodeRelease = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
        "metadata": {"name": "agent-0.2.0"},
        "spec": {"version": "agent-0.2.0", "agent": {
            "version": "0.2.0",
            "url": "https://extensions.example/inplace-agent-0.2.0.raw",
            "sha256": "a9e1".repeat(16),
            "signatureUrl": "https://extensions.example/inplace-agent-0.2.0.raw.minisig",
        }},
    }))
    .unwrap();
    let release = bed
        .releases()
        .create(&PostParams::default(), &release)
        .await
        .unwrap();
    create_rollout(
        &bed.client,
        "agent",
        json!({"release": "agent-0.2.0", "maxUnavailable": 1, "maxFailures": 0}),
    )
    .await;

    let rollout = rollout_when(&bed.client, "agent", "Halted=True", |r| {
        has_condition(r, "Halted", "True", "TooManyFailures")
    })
    .await;
    let status = rollout.status.unwrap();
    assert_eq!(status.failed_nodes.len(), 1, "{:?}", status.failed_nodes);
    assert_eq!(status.failed_nodes[0].reason, "AgentNotConfirmed");

    // Halted: no second node is activated, however long we wait.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let activated = fleet.stats.activation_order.lock().unwrap().clone();
    assert_eq!(activated.len(), 1, "{activated:?}");
    let revision = revision_of(&release.spec.content);
    for name in nodes {
        let plan = bed.plans().get(name).await.unwrap();
        assert_eq!(
            plan.spec.content.agent, release.spec.content.agent,
            "{name}"
        );
        assert!(plan.spec.content.artifacts.is_empty(), "{name}");
        assert_eq!(
            plan.spec.revision.as_deref(),
            Some(revision.as_str()),
            "{name}"
        );
        let expected = if activated.iter().any(|a| a == name) {
            DesiredState::Active
        } else {
            DesiredState::Staged
        };
        assert_eq!(plan.spec.desired_state, expected, "{name}");
    }
}
