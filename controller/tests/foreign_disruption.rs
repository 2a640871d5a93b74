//! Sharing the fleet on the real kube-apiserver, with simulated agents
//! (`support::sim_agent`): a node a person cordoned occupies the only slot, so no
//! activation starts until it is uncordoned; and a node activating carries the cluster
//! autoscaler's scale-down-disabled annotation, removed once it is done — unless someone
//! else set it; a node Flatcar's update operator reboots takes the slot too
//! (docs/usage/standalone-rollouts.md § Sharing the fleet).
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use inplace_controller::decision::{SCALE_DOWN_DISABLED_ANNOTATION, SCALE_DOWN_MARK_ANNOTATION};
use kube::api::Patch;
use serde_json::json;
use support::sim_agent::SimConfig;
use support::*;

/// The node's scale-down annotation and inplace's mark of it, as `(autoscaler's, mark)`.
async fn scale_down(bed: &Bed, node: &str) -> (Option<String>, Option<String>) {
    let node = bed.nodes().get(node).await.unwrap();
    let annotations: BTreeMap<String, String> = node.metadata.annotations.unwrap_or_default();
    (
        annotations.get(SCALE_DOWN_DISABLED_ANNOTATION).cloned(),
        annotations.get(SCALE_DOWN_MARK_ANNOTATION).cloned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_a_person_cordoned_takes_the_slot_and_activating_nodes_keep_the_autoscaler_off() {
    let bed = Bed::start().await;
    let mut config = SimConfig::default();
    config
        .slow
        .insert("worker-1".into(), Duration::from_secs(3));
    let _fleet = bed.fleet(config);
    for name in ["worker-1", "worker-2", "worker-3"] {
        create_node(&bed.client, name, &[]).await;
    }
    bed.set_cordon("worker-2", true).await;
    // Someone else keeps the autoscaler off worker-3: inplace leaves that alone.
    bed.nodes()
        .patch(
            "worker-3",
            &Default::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {SCALE_DOWN_DISABLED_ANNOTATION: "true"}}}),
            ),
        )
        .await
        .unwrap();
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
        "all staged, the slot used by worker-2",
        |r| {
            r.status.as_ref().is_some_and(|s| s.nodes.staged == 3)
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

    assert_eq!(scale_down(&bed, "worker-1").await, (None, None));

    bed.set_cordon("worker-2", false).await;
    eventually(
        "worker-1 activating with the autoscaler kept off",
        || async {
            let activating = bed.rollouts().get("ro").await.ok()?.status?.active_nodes;
            let marked = scale_down(&bed, "worker-1").await
                == (Some("true".to_owned()), Some("true".to_owned()));
            (activating == ["worker-1"] && marked).then_some(())
        },
    )
    .await;
    let done = rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert!(done.status.unwrap().foreign_disruptions.is_empty());
    assert_eq!(bed.granted().await, ["worker-1", "worker-2", "worker-3"]);
    for node in ["worker-1", "worker-2"] {
        eventually(&format!("{node}'s annotation removed"), || async {
            (scale_down(&bed, node).await == (None, None)).then_some(())
        })
        .await;
    }
    assert_eq!(
        scale_down(&bed, "worker-3").await,
        (Some("true".to_owned()), None),
        "someone else's annotation stays"
    );
}

/// Flatcar's update operator in the same budget: a node whose reboot FLUO allowed
/// (`reboot-ok` and `reboot-needed` both "true", as FLUO v0.10.0-rc2's operator and agent
/// write them: `pkg/operator/operator.go` `stillRebootingSelector`) takes the only slot,
/// even with `countForeignDisruption: false`; when its agent comes back (`reboot-needed`
/// "false") the rollout goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_flatcars_update_operator_reboots_takes_the_slot() {
    use inplace_controller::decision::fluo::{REBOOT_NEEDED, REBOOT_OK};
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    for name in ["worker-1", "worker-2"] {
        create_node(&bed.client, name, &[]).await;
    }
    let fluo = |needed: &str| {
        Patch::Merge(
            json!({"metadata": {"annotations": {REBOOT_OK: "true", REBOOT_NEEDED: needed}}}),
        )
    };
    bed.nodes()
        .patch("worker-2", &Default::default(), &fluo("true"))
        .await
        .unwrap();
    create_release(&bed.client, "rel", "v1").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1, "countForeignDisruption": false}),
    )
    .await;
    rollout_when(
        &bed.client,
        "ro",
        "the slot used by worker-2's reboot",
        |r| {
            r.status.as_ref().is_some_and(|s| s.nodes.staged == 2)
                && condition(r, "Progressing").is_some_and(|(_, _, m)| {
                    m.contains(
                        "1 slot used by others: worker-2 rebooting under Flatcar's update operator",
                    )
                })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        bed.granted().await.is_empty(),
        "no grant while FLUO reboots worker-2"
    );
    bed.nodes()
        .patch("worker-2", &Default::default(), &fluo("false"))
        .await
        .unwrap();
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert_eq!(bed.granted().await, ["worker-1", "worker-2"]);
}
