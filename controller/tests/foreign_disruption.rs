//! Others' disruption against `maxUnavailable` on the real kube-apiserver, with simulated
//! agents (`support::sim_agent`): a node a person cordoned occupies the only slot, so no
//! activation starts until it is uncordoned (docs/usage/standalone-rollouts.md § Sharing
//! the fleet).
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use kube::api::Patch;
use serde_json::json;
use support::sim_agent::SimConfig;
use support::*;

async fn set_cordon(bed: &Bed, node: &str, cordoned: bool) {
    bed.nodes()
        .patch(
            node,
            &Default::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": cordoned}})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_a_person_cordoned_takes_the_slot_until_uncordoned() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    for name in ["worker-1", "worker-2"] {
        create_node(&bed.client, name, &[]).await;
    }
    set_cordon(&bed, "worker-2", true).await;
    create_release(&bed.client, "rel", "v1").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1}),
    )
    .await;
    let rollout = rollout_when(
        &bed.client,
        "ro",
        "both staged, the slot used by worker-2",
        |r| {
            r.status.as_ref().is_some_and(|s| s.nodes.staged == 2)
                && condition(r, "Progressing")
                    .is_some_and(|(_, _, m)| m.contains("1 slot used by others: worker-2 cordoned"))
        },
    )
    .await;
    let status = rollout.status.unwrap();
    assert_eq!(status.foreign_disruptions.len(), 1);
    assert_eq!(status.foreign_disruptions[0].node, "worker-2");
    assert_eq!(status.foreign_disruptions[0].why, "cordoned");
    // A few rounds later still nothing is granted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        bed.granted().await.is_empty(),
        "no grant while worker-2 is cordoned"
    );

    set_cordon(&bed, "worker-2", false).await;
    let done = rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert!(done.status.unwrap().foreign_disruptions.is_empty());
    assert_eq!(bed.granted().await, ["worker-1", "worker-2"]);
}
