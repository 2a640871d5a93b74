//! Deleting a NodeRollout mid-flight, against the real kube-apiserver with simulated agents
//! and the controller running under the shipped RBAC: the `inplace.dev/uncordon` finalizer holds
//! the deletion until the nodes the rollout cordoned are uncordoned — never a node a person
//! cordoned, and never a node whose agent is still swapping.

use crate::support;

use std::time::Duration;

use inplace_controller::decision::SCALE_DOWN_MARK_ANNOTATION;
use inplace_proto::{DesiredState, NodeUpdatePlan, Phase};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PostParams};
use serde_json::json;
use support::sim_agent::SimConfig;
use support::*;

const FINALIZER: &str = "inplace.dev/uncordon";

fn cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn cordon_recorded(plan: &NodeUpdatePlan) -> bool {
    plan.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("inplace.dev/cordoned"))
}

fn phase(plan: &NodeUpdatePlan) -> Option<Phase> {
    plan.status.as_ref().and_then(|s| s.phase)
}

async fn rollout_gone(bed: &Bed, name: &str) {
    eventually(&format!("rollout {name} removed"), || async {
        bed.rollouts()
            .get_opt(name)
            .await
            .ok()
            .and_then(|r| r.is_none().then_some(()))
    })
    .await;
}

/// A pod on `node` that a PodDisruptionBudget allows no disruption of.
async fn create_protected_pod(client: &kube::Client, node: &str) {
    create_running_pod(client, pod("db-1", node, json!({"app": "db"}), json!({}))).await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_rollout_uncordons_the_nodes_it_cordoned_and_no_other() {
    let bed = Bed::start_with_shipped_rbac().await;
    let _fleet = bed.fleet(SimConfig::default());
    for name in ["worker-1", "worker-2"] {
        create_node(&bed.client, name, &[]).await;
    }
    // worker-1 cannot be drained (its pod's budget allows no eviction): the rollout cordons
    // it and waits. worker-2 was cordoned by a person before the rollout.
    create_protected_pod(&bed.client, "worker-1").await;
    bed.nodes()
        .patch(
            "worker-2",
            &Default::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    create_release(&bed.client, "rel", "v1").await;
    create_rollout(
        &bed.client,
        "ro",
        // Not counted: worker-2, cordoned by a person, is updated beside worker-1.
        json!({"release": "rel", "maxUnavailable": 2, "disruption": "Drain", "drainTimeout": "1h",
               "countForeignDisruption": false}),
    )
    .await;
    rollout_when(
        &bed.client,
        "ro",
        "worker-2 updated, worker-1 draining",
        |r| {
            r.status
                .as_ref()
                .is_some_and(|s| s.nodes.succeeded == 1 && s.active_nodes == ["worker-1"])
        },
    )
    .await;
    let rollout = bed.rollouts().get("ro").await.unwrap();
    assert!(
        rollout
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER),
        "{:?}",
        rollout.metadata.finalizers
    );
    eventually("worker-1 cordoned and recorded", || async {
        let node = bed.nodes().get("worker-1").await.ok()?;
        let plan = bed.plans().get("worker-1").await.ok()?;
        (cordoned(&node) && cordon_recorded(&plan)).then_some(())
    })
    .await;
    assert!(!cordon_recorded(
        &bed.plans().get("worker-2").await.unwrap()
    ));
    let scale_down_marked = |node: &Node| {
        node.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(SCALE_DOWN_MARK_ANNOTATION))
    };
    assert!(
        scale_down_marked(&bed.nodes().get("worker-1").await.unwrap()),
        "the autoscaler is kept off the draining node"
    );

    bed.rollouts()
        .delete("ro", &Default::default())
        .await
        .unwrap();
    rollout_gone(&bed, "ro").await;

    let worker_1 = bed.nodes().get("worker-1").await.unwrap();
    assert!(!cordoned(&worker_1));
    assert!(
        !scale_down_marked(&worker_1),
        "the autoscaler's annotation goes with the rollout: {:?}",
        worker_1.metadata.annotations
    );
    let plan = bed.plans().get("worker-1").await.unwrap();
    assert!(!cordon_recorded(&plan), "{:?}", plan.metadata.annotations);
    assert_eq!(
        plan.spec.desired_state,
        DesiredState::Staged,
        "never activated"
    );
    assert!(
        cordoned(&bed.nodes().get("worker-2").await.unwrap()),
        "a person's cordon stays"
    );
    let events = events_for(&bed.client, "ro").await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "Uncordoned" && n.contains("worker-1") && n.contains("deleted")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_rollout_keeps_a_swapping_node_cordoned_until_its_agent_finishes() {
    let bed = Bed::start_with_shipped_rbac().await;
    let mut config = SimConfig::default();
    // Long enough to observe the deleted rollout waiting on a loaded machine.
    config
        .slow
        .insert("worker-1".into(), Duration::from_secs(20));
    let fleet = bed.fleet(config);
    for name in ["worker-1", "worker-2"] {
        create_node(&bed.client, name, &[]).await;
    }
    create_release(&bed.client, "rel", "v2").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1, "disruption": "Cordon"}),
    )
    .await;
    // The simulated agent counts an activation only after its status write lands, so the
    // count is awaited too: a snapshot taken in between missed worker-1 (CI, session 45).
    eventually("worker-1 swapping, cordoned, counted", || async {
        let node = bed.nodes().get("worker-1").await.ok()?;
        let plan = bed.plans().get("worker-1").await.ok()?;
        (cordoned(&node)
            && matches!(phase(&plan), Some(Phase::Activating | Phase::Verifying))
            && fleet
                .stats
                .activation_order
                .lock()
                .unwrap()
                .contains(&"worker-1".to_owned()))
        .then_some(())
    })
    .await;
    // Slots go to nodes in name order as they finish staging: worker-2 may have gone first.
    let activated = fleet.stats.activation_order.lock().unwrap().clone();
    bed.rollouts()
        .delete("ro", &Default::default())
        .await
        .unwrap();

    // Until the rollout is gone: a schedulable worker-1 is never seen before its agent
    // finished (node read first: the plan's phase only moves forward).
    let mut seen_waiting = false;
    loop {
        let rollout = bed.rollouts().get_opt("ro").await.unwrap();
        let node = bed.nodes().get("worker-1").await.unwrap();
        let plan = bed.plans().get("worker-1").await.unwrap();
        let busy = matches!(phase(&plan), Some(Phase::Activating | Phase::Verifying));
        assert!(
            cordoned(&node) || !busy,
            "worker-1 uncordoned while its agent is in {:?}",
            phase(&plan)
        );
        match rollout {
            Some(r) => {
                assert!(r.metadata.deletion_timestamp.is_some());
                seen_waiting |= busy;
            }
            None => break,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(seen_waiting, "the deleted rollout was never seen waiting");
    let plan = bed.plans().get("worker-1").await.unwrap();
    assert_eq!(phase(&plan), Some(Phase::Succeeded));
    assert!(!cordon_recorded(&plan));
    assert!(!cordoned(&bed.nodes().get("worker-1").await.unwrap()));
    // No new activation once the rollout was deleted; nobody left cordoned.
    assert_eq!(*fleet.stats.activation_order.lock().unwrap(), activated);
    if !activated.contains(&"worker-2".to_owned()) {
        let worker_2 = bed.plans().get("worker-2").await.unwrap();
        assert_eq!(worker_2.spec.desired_state, DesiredState::Staged);
    }
    assert!(!cordoned(&bed.nodes().get("worker-2").await.unwrap()));
    let events = events_for(&bed.client, "ro").await;
    assert!(
        events.iter().any(|(r, _)| r == "WaitingForActivation"),
        "{events:?}"
    );
}
