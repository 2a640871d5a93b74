//! The controller against the real kube-apiserver (or the emulator with
//! `INPLACE_TEST_API=emulator`), with simulated agents on every node writing their plan's
//! status as the node.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::time::Duration;

use inplace_proto::{DesiredState, Phase};
use inplace_tests::fixtures::ReleaseFixture;
use k8s_openapi::api::core::v1::Node;
use serde_json::json;
use support::sim_agent::{Failure, SimConfig};
use support::*;

fn workers(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("worker-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_with_max_unavailable_one_never_activate_two_at_once() {
    let bed = Bed::start().await;
    let fleet = bed.fleet(SimConfig::default());
    create_node(
        &bed.client,
        "cp-1",
        &[("node-role.kubernetes.io/control-plane", "")],
    )
    .await;
    for name in ["worker-b", "worker-a"] {
        create_node(&bed.client, name, &[("pool", "a")]).await;
    }
    create_release(&bed.client, "k8s-1-31-2", "v1.31.2").await;
    create_rollout(
        &bed.client,
        "all",
        json!({"release": "k8s-1-31-2", "maxUnavailable": 1}),
    )
    .await;
    let rollout = rollout_when(&bed.client, "all", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let status = rollout.status.unwrap();
    assert_eq!(status.nodes.total, 3);
    assert_eq!(status.nodes.succeeded, 3);
    assert_eq!(status.observed_generation, rollout.metadata.generation);
    assert_eq!(fleet.max_activating(), 1, "never two nodes at once");
    // Control plane first (then staged workers by name).
    let order = fleet.stats.activation_order.lock().unwrap().clone();
    assert_eq!(order.len(), 3);
    assert_eq!(order[0], "cp-1");

    // Every plan: owned by the rollout, owner reference to its node, content copied.
    for name in ["cp-1", "worker-a", "worker-b"] {
        let plan = bed.plans().get(name).await.unwrap();
        let node = bed.nodes().get(name).await.unwrap();
        let owner = &plan.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "Node");
        assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());
        assert_eq!(plan.spec.desired_state, DesiredState::Active);
        assert_eq!(plan.spec.release.as_deref(), Some("k8s-1-31-2"));
        assert_eq!(plan.spec.revision, status.revision);
        assert_eq!(
            plan.metadata.labels.as_ref().unwrap()["inplace.dev/rollout"],
            "all"
        );
        assert_eq!(plan.status.unwrap().phase, Some(Phase::Succeeded));
    }

    // The release was validated too.
    let release = bed.releases().get("k8s-1-31-2").await.unwrap();
    let release_status = release.status.unwrap();
    assert_eq!(release_status.revision, status.revision);
    assert_eq!(release_status.conditions[0].reason, "ValidRelease");

    let events = events_for(&bed.client, "all").await;
    let reasons: Vec<&str> = events.iter().map(|(r, _)| r.as_str()).collect();
    for wanted in ["ActivationStarted", "NodeUpdated", "AllNodesUpdated"] {
        assert!(
            reasons.contains(&wanted),
            "no {wanted} event in {reasons:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_node_halts_the_rollout_at_max_failures() {
    let bed = Bed::start().await;
    let mut config = SimConfig::default();
    config
        .failures
        .insert("worker-2".into(), Failure::rolled_back("HealthCheckFailed"));
    let fleet = bed.fleet(config);
    for name in workers(5) {
        create_node(&bed.client, &name, &[]).await;
    }
    create_release(&bed.client, "rel", "v2").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1, "maxFailures": 0}),
    )
    .await;
    let rollout = rollout_when(&bed.client, "ro", "Halted=True", |r| {
        has_condition(r, "Halted", "True", "TooManyFailures")
    })
    .await;
    let (_, _, message) = condition(&rollout, "Halted").unwrap();
    assert!(message.contains("worker-2 (HealthCheckFailed"), "{message}");
    let status = rollout.status.unwrap();
    assert_eq!(status.failed_nodes.len(), 1);
    assert_eq!(status.failed_nodes[0].node, "worker-2");
    assert_eq!(status.failed_nodes[0].reason, "HealthCheckFailed");

    // Halted: no new activations, however long we wait. (Slots go to staged nodes in
    // name order, so which nodes went before worker-2 depends on staging times.)
    let activated = fleet.stats.activation_order.lock().unwrap().clone();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(*fleet.stats.activation_order.lock().unwrap(), activated);
    assert_eq!(activated.last().map(String::as_str), Some("worker-2"));
    for name in workers(5) {
        let plan = bed.plans().get(&name).await.unwrap();
        let expected = if activated.contains(&name) {
            DesiredState::Active
        } else {
            DesiredState::Staged
        };
        assert_eq!(plan.spec.desired_state, expected, "{name}");
    }
    assert_eq!(
        fleet
            .stats
            .succeeded
            .load(std::sync::atomic::Ordering::SeqCst),
        activated.len() - 1
    );
    assert_eq!(fleet.max_activating(), 1);
    let events = events_for(&bed.client, "ro").await;
    assert!(events.iter().any(|(r, _)| r == "Halted"), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_new_activations_and_resume_finishes() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    for name in workers(3) {
        create_node(&bed.client, &name, &[]).await;
    }
    create_release(&bed.client, "rel", "v3").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 3, "paused": true}),
    )
    .await;
    let rollout = rollout_when(&bed.client, "ro", "paused with every node staged", |r| {
        has_condition(r, "Progressing", "False", "Paused")
            && r.status.as_ref().is_some_and(|s| s.nodes.staged == 3)
    })
    .await;
    assert_eq!(rollout.status.unwrap().nodes.updating, 0);
    for name in workers(3) {
        let plan = bed.plans().get(&name).await.unwrap();
        assert_eq!(plan.spec.desired_state, DesiredState::Staged);
    }
    patch_rollout(&bed.client, "ro", json!({"paused": false})).await;
    rollout_when(&bed.client, "ro", "Complete=True after resume", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let events = events_for(&bed.client, "ro").await;
    assert!(events.iter().any(|(r, _)| r == "Paused"), "{events:?}");
    assert!(events.iter().any(|(r, _)| r == "Resumed"), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_downgrade_is_copied_from_the_rollout_into_every_plan() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    for name in workers(2) {
        create_node(&bed.client, &name, &[]).await;
    }
    create_release(&bed.client, "rel", "v1").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 2, "paused": true, "allowDowngrade": true}),
    )
    .await;
    let plans_say = |allowed: bool| {
        let plans = bed.plans();
        async move {
            for name in workers(2) {
                match plans.get_opt(&name).await.unwrap() {
                    Some(plan) if plan.spec.allow_downgrade == allowed => {}
                    _ => return None,
                }
            }
            Some(())
        }
    };
    eventually("every plan allows downgrades", || plans_say(true)).await;
    // Taking the permission back reaches the plans already written.
    patch_rollout(&bed.client, "ro", json!({"allowDowngrade": false})).await;
    eventually("no plan allows downgrades", || plans_say(false)).await;
    let plan = bed.plans().get("worker-1").await.unwrap();
    let release = bed.releases().get("rel").await.unwrap();
    assert_eq!(
        plan.spec.revision,
        release.status.and_then(|s| s.revision),
        "the flag is not content: the plan keeps the release's revision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_release_touches_nothing_until_it_is_created() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    for name in workers(2) {
        create_node(&bed.client, &name, &[]).await;
    }
    create_rollout(&bed.client, "ro", json!({"release": "later"})).await;
    let rollout = rollout_when(&bed.client, "ro", "ReleaseNotFound", |r| {
        has_condition(r, "Progressing", "False", "ReleaseNotFound")
    })
    .await;
    assert_eq!(rollout.status.unwrap().nodes.total, 2);
    assert!(
        bed.plans()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // An invalid release is reported as such, and still touches nothing.
    ReleaseFixture::kubelet("later", "v4", "v1.31.2")
        .kubernetes_sysext("file:///etc/passwd", &"4f0c".repeat(16), None)
        .create(&bed.client)
        .await
        .unwrap();
    rollout_when(&bed.client, "ro", "ReleaseInvalid", |r| {
        has_condition(r, "Progressing", "False", "ReleaseInvalid")
    })
    .await;
    let release = eventually("the release marked invalid", || async {
        let r = bed.releases().get("later").await.ok()?;
        let c = r.status.as_ref()?.conditions.first()?.clone();
        (c.reason == "InvalidRelease").then_some(c)
    })
    .await;
    assert!(release.message.contains("url"), "{}", release.message);
    assert!(
        bed.plans()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Releases are immutable: replace it with a valid one under the same name.
    bed.releases()
        .delete("later", &Default::default())
        .await
        .unwrap();
    create_release(&bed.client, "later", "v4").await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_mid_rollout_drops_out_and_a_late_node_joins() {
    let bed = Bed::start().await;
    let mut config = SimConfig::default();
    // worker-1 activates first and takes long: it is deleted while it holds the slot.
    config
        .slow
        .insert("worker-1".into(), Duration::from_secs(600));
    let _fleet = bed.fleet(config);
    for name in workers(3) {
        create_node(&bed.client, &name, &[]).await;
    }
    create_release(&bed.client, "rel", "v5").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1}),
    )
    .await;
    rollout_when(&bed.client, "ro", "worker-1 activating", |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.active_nodes == ["worker-1"])
    })
    .await;
    delete_node(&bed.client, "worker-1").await;
    let rollout = rollout_when(&bed.client, "ro", "Complete=True with 2 nodes", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert_eq!(rollout.status.unwrap().nodes.total, 2);
    eventually("worker-1's plan garbage-collected", || async {
        bed.plans()
            .get_opt("worker-1")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await;

    // A node that joins later gets the plan and the update.
    create_node(&bed.client, "worker-9", &[]).await;
    rollout_when(&bed.client, "ro", "Complete=True with the late node", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
            && r.status.as_ref().is_some_and(|s| s.nodes.succeeded == 3)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_selection_and_a_second_rollout_for_owned_nodes() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    for name in workers(2) {
        create_node(&bed.client, &name, &[("pool", "a")]).await;
    }
    create_release(&bed.client, "rel", "v6").await;
    create_rollout(
        &bed.client,
        "nobody",
        json!({"release": "rel", "nodeSelector": {"matchLabels": {"pool": "none"}}}),
    )
    .await;
    let rollout = rollout_when(
        &bed.client,
        "nobody",
        "Complete=True NoNodesSelected",
        |r| has_condition(r, "Complete", "True", "NoNodesSelected"),
    )
    .await;
    let (_, _, message) = condition(&rollout, "Complete").unwrap();
    assert!(message.contains("matches no node"), "{message}");
    assert_eq!(rollout.status.unwrap().nodes.total, 0);

    create_rollout(
        &bed.client,
        "first",
        json!({"release": "rel", "nodeSelector": {"matchLabels": {"pool": "a"}}}),
    )
    .await;
    rollout_when(&bed.client, "first", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    create_rollout(&bed.client, "second", json!({"release": "rel"})).await;
    let second = rollout_when(&bed.client, "second", "nodes refused", |r| {
        has_condition(r, "NodesRefused", "True", "NodeOwnedByOtherRollout")
    })
    .await;
    let (_, _, message) = condition(&second, "NodesRefused").unwrap();
    assert!(
        message.contains("worker-1 (owned by rollout \"first\")"),
        "{message}"
    );
    for name in workers(2) {
        let plan = bed.plans().get(&name).await.unwrap();
        assert_eq!(
            plan.metadata.labels.as_ref().unwrap()["inplace.dev/rollout"],
            "first"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_mode_cordons_during_activation_and_uncordons_after() {
    let bed = Bed::start().await;
    let mut config = SimConfig::default();
    config
        .slow
        .insert("worker-1".into(), Duration::from_secs(2));
    let _fleet = bed.fleet(config);
    for name in workers(2) {
        create_node(&bed.client, &name, &[]).await;
    }
    // A node a person cordoned stays cordoned.
    bed.nodes()
        .patch(
            "worker-2",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    create_release(&bed.client, "rel", "v7").await;
    create_rollout(
        &bed.client,
        "ro",
        // Counted as others' disruption, worker-2's cordon would take the only slot
        // (controller/tests/foreign_disruption.rs); this test is about whose cordon is whose.
        json!({"release": "rel", "maxUnavailable": 1, "disruption": "Cordon",
               "countForeignDisruption": false}),
    )
    .await;
    eventually("worker-1 cordoned while activating", || async {
        let node: Node = bed.nodes().get("worker-1").await.ok()?;
        node.spec?.unschedulable?.then_some(())
    })
    .await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let unschedulable = |node: Node| node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
    eventually("worker-1 uncordoned", || async {
        (!unschedulable(bed.nodes().get("worker-1").await.ok()?)).then_some(())
    })
    .await;
    assert!(unschedulable(bed.nodes().get("worker-2").await.unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_evicts_pods_and_a_blocking_pdb_is_reported_as_drain_timeout() {
    use k8s_openapi::api::core::v1::Pod;
    let bed = Bed::start().await;
    let fleet = bed.fleet(SimConfig::default());
    for name in workers(2) {
        create_node(&bed.client, &name, &[]).await;
    }
    // worker-1: a plain pod (evicted), a DaemonSet pod and a mirror pod (both stay), and a
    // pod whose PodDisruptionBudget allows no disruption (blocks the drain).
    create_running_pod(
        &bed.client,
        pod("web-1", "worker-1", json!({"app": "web"}), json!({})),
    )
    .await;
    let ds = daemonset_owner(&bed, "ds").await;
    create_running_pod(
        &bed.client,
        pod(
            "ds-1",
            "worker-1",
            json!({"app": "ds"}),
            json!({"ownerReferences": [ds]}),
        ),
    )
    .await;
    create_running_pod(
        &bed.client,
        pod(
            "static-1",
            "worker-1",
            json!({"app": "static"}),
            json!({"annotations": {"kubernetes.io/config.mirror": "abc"}}),
        ),
    )
    .await;
    create_running_pod(
        &bed.client,
        pod("db-1", "worker-1", json!({"app": "db"}), json!({})),
    )
    .await;
    let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    }))
    .unwrap();
    kube::Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(
        bed.client.clone(),
        "default",
    )
    .create(&Default::default(), &pdb)
    .await
    .unwrap();
    // worker-2: only an evictable pod.
    create_running_pod(
        &bed.client,
        pod("web-2", "worker-2", json!({"app": "web"}), json!({})),
    )
    .await;

    create_release(&bed.client, "rel", "v8").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1, "maxFailures": 1,
               "disruption": "Drain", "drainTimeout": "3s"}),
    )
    .await;
    let rollout = rollout_when(
        &bed.client,
        "ro",
        "worker-1 DrainTimeout, worker-2 updated",
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.failed_nodes
                    .iter()
                    .any(|f| f.node == "worker-1" && f.reason == "DrainTimeout")
                    && s.nodes.succeeded == 1
            })
        },
    )
    .await;
    let status = rollout.status.unwrap();
    let failure = status
        .failed_nodes
        .iter()
        .find(|f| f.node == "worker-1")
        .unwrap();
    assert!(
        failure.message.contains("default/db-1"),
        "{}",
        failure.message
    );
    assert!(
        failure.message.contains("disruption budget"),
        "{}",
        failure.message
    );
    assert_eq!(condition_status(&bed, "ro", "Halted").await, "False");

    let pods: kube::Api<Pod> = kube::Api::namespaced(bed.client.clone(), "default");
    assert!(pods.get_opt("web-1").await.unwrap().is_none(), "evicted");
    assert!(pods.get_opt("web-2").await.unwrap().is_none(), "evicted");
    assert!(
        pods.get_opt("ds-1").await.unwrap().is_some(),
        "DaemonSet pod stays"
    );
    assert!(
        pods.get_opt("static-1").await.unwrap().is_some(),
        "mirror pod stays"
    );
    assert!(
        pods.get_opt("db-1").await.unwrap().is_some(),
        "protected by its PDB"
    );
    // Both nodes uncordoned: worker-1 after its drain timed out, worker-2 after success.
    for name in workers(2) {
        let node = bed.nodes().get(&name).await.unwrap();
        eventually(&format!("{name} uncordoned"), || async {
            let node: Node = bed.nodes().get(&name).await.ok()?;
            (!node.spec?.unschedulable.unwrap_or(false)).then_some(())
        })
        .await;
        drop(node);
    }
    let plan = bed.plans().get("worker-1").await.unwrap();
    assert_eq!(
        plan.spec.desired_state,
        DesiredState::Staged,
        "never activated"
    );
    assert_eq!(fleet.max_activating(), 1);
    let events = events_for(&bed.client, "ro").await;
    assert!(
        events.iter().any(|(r, _)| r == "EvictionBlocked"),
        "{events:?}"
    );
    assert!(
        events.iter().any(|(r, _)| r == "DrainTimeout"),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_mode_never_exceeds_its_slots() {
    let bed = Bed::start().await;
    let fleet = bed.fleet(SimConfig::default());
    for name in workers(6) {
        create_node(&bed.client, &name, &[]).await;
    }
    create_release(&bed.client, "rel", "v9").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": "34%", "disruption": "Drain"}),
    )
    .await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert!(fleet.max_activating() <= 2, "{}", fleet.max_activating());
    for name in workers(6) {
        let node: Node = bed.nodes().get(&name).await.unwrap();
        let cordoned = node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
        if cordoned {
            // The last uncordon may still be in flight.
            eventually(&format!("{name} uncordoned"), || async {
                let node: Node = bed.nodes().get(&name).await.ok()?;
                (!node.spec?.unschedulable.unwrap_or(false)).then_some(())
            })
            .await;
        }
    }
}
