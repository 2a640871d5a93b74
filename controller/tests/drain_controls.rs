//! `spec.drain` end to end, on the real kube-apiserver with simulated agents and the
//! test bed's stand-in for the kubelets' part of pod deletions (`support::kubelet`): the API
//! server's refusals, pods the drain leaves alone (the `podSelector`, DaemonSet and mirror
//! pods: never evicted, never waited for), the grace period sent with an eviction and a
//! forced deletion, and `onTimeout: Halt | Skip | Force` on nodes whose drain a
//! PodDisruptionBudget blocks.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use inplace_proto::{DesiredState, DrainSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use serde_json::{Value, json};
use support::sim_agent::SimConfig;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_drain_settings_it_cannot_follow() {
    let (_api, client) = cluster().await;
    let drain = |drain: Value| json!({"release": "rel", "disruption": "Drain", "drain": drain});
    let rows = [
        (
            "force-no-opt-in",
            drain(json!({"onTimeout": "Force"})),
            Some("it needs allowForce: true"),
        ),
        (
            "force-opted-in",
            drain(json!({"onTimeout": "Force", "allowForce": true})),
            None,
        ),
        ("skip", drain(json!({"onTimeout": "Skip"})), None),
        (
            "grace-zero",
            drain(json!({"gracePeriodSeconds": 0})),
            Some("spec.drain.gracePeriodSeconds"),
        ),
        (
            "empty-selector",
            drain(json!({"podSelector": {}})),
            Some("an empty podSelector would leave every pod alone"),
        ),
        (
            "bad-operator",
            drain(json!({"podSelector": {"matchExpressions": [
                {"key": "app", "operator": "Near", "values": ["x"]}]}})),
            Some("operator must be one of In, NotIn, Exists, DoesNotExist"),
        ),
        (
            "in-without-values",
            drain(json!({"podSelector": {"matchExpressions": [
                {"key": "app", "operator": "In"}]}})),
            Some("In and NotIn need at least one value"),
        ),
        (
            "selector-ok",
            drain(json!({"gracePeriodSeconds": 30, "podSelector": {
                "matchLabels": {"inplace.dev/skip": "true"},
                "matchExpressions": [{"key": "tier", "operator": "Exists"}]}})),
            None,
        ),
    ];
    for (name, spec, want) in rows {
        let got = refusal(&client, name, spec).await;
        match (want, &got) {
            (None, None) => {}
            (Some(want), Some(message)) => assert!(message.contains(want), "{name}: {message}"),
            _ => panic!("{name}: wanted {want:?}, the server said {got:?}"),
        }
    }
    // Unset, the drain is today's: nothing is written back.
    create_rollout(&client, "plain", json!({"release": "rel"})).await;
    let stored = Api::<inplace_proto::NodeRollout>::all(client.clone())
        .get("plain")
        .await
        .unwrap();
    assert_eq!(stored.spec.drain, DrainSpec::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_leaves_selected_daemonset_and_mirror_pods_alone_and_sends_the_grace_period() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    create_node(&bed.client, "worker-1", &[]).await;
    let ds = daemonset_owner(&bed, "agent").await;
    for (name, labels, meta) in [
        ("web-1", json!({"app": "web"}), json!({})),
        ("keep-1", json!({"inplace.dev/skip": "true"}), json!({})),
        (
            "ds-1",
            json!({"app": "agent"}),
            json!({"ownerReferences": [ds]}),
        ),
        (
            "static-1",
            json!({"app": "static"}),
            json!({"annotations": {"kubernetes.io/config.mirror": "abc"}}),
        ),
    ] {
        create_running_pod(&bed.client, pod(name, "worker-1", labels, meta)).await;
    }
    create_release(&bed.client, "rel", "v8").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "disruption": "Drain", "drainTimeout": "10m",
               "drain": {"gracePeriodSeconds": 7,
                         "podSelector": {"matchLabels": {"inplace.dev/skip": "true"}}}}),
    )
    .await;
    // Completes long before drainTimeout: the three pods left alone are not waited for.
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), "default");
    assert!(pods.get_opt("web-1").await.unwrap().is_none(), "evicted");
    assert_eq!(
        bed.kubelets.grace_period("default/web-1"),
        Some(Some(7)),
        "the eviction carried gracePeriodSeconds"
    );
    for kept in ["keep-1", "ds-1", "static-1"] {
        let pod = pods.get(kept).await.unwrap();
        assert!(
            pod.metadata.deletion_timestamp.is_none(),
            "{kept} left alone"
        );
        assert_eq!(bed.kubelets.grace_period(&format!("default/{kept}")), None);
    }
    uncordoned(&bed, "worker-1").await;
}

/// A pod on `node` that a PodDisruptionBudget allowing no disruption protects.
async fn protected_pod(bed: &Bed, name: &str, node: &str) {
    create_running_pod(
        &bed.client,
        pod(name, node, json!({"app": name}), json!({})),
    )
    .await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}},
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(bed.client.clone(), "default")
        .create(&Default::default(), &pdb)
        .await
        .unwrap();
}

async fn uncordoned(bed: &Bed, name: &str) {
    eventually(&format!("{name} uncordoned"), || async {
        let node: Node = bed.nodes().get(name).await.ok()?;
        (!node.spec?.unschedulable.unwrap_or(false)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_timeout_halt_fails_skip_leaves_the_node_and_force_deletes_past_the_budget() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    for (node, group) in [
        ("halt-1", "halt"),
        ("skip-1", "skip"),
        ("skip-2", "skip"),
        ("force-1", "force"),
    ] {
        create_node(&bed.client, node, &[("drain", group)]).await;
    }
    protected_pod(&bed, "db-halt", "halt-1").await;
    protected_pod(&bed, "db-skip", "skip-1").await;
    protected_pod(&bed, "db-force", "force-1").await;
    create_running_pod(
        &bed.client,
        pod("web-skip", "skip-2", json!({"app": "web"}), json!({})),
    )
    .await;
    create_release(&bed.client, "rel", "v8").await;
    let rollout = |group: &str, drain: Value| {
        json!({"release": "rel", "nodeSelector": {"matchLabels": {"drain": group}},
               "maxFailures": 0, "disruption": "Drain", "drainTimeout": "3s", "drain": drain})
    };
    create_rollout(
        &bed.client,
        "ro-halt",
        rollout("halt", json!({"onTimeout": "Halt"})),
    )
    .await;
    create_rollout(
        &bed.client,
        "ro-skip",
        rollout("skip", json!({"onTimeout": "Skip"})),
    )
    .await;
    create_rollout(
        &bed.client,
        "ro-force",
        rollout(
            "force",
            json!({"onTimeout": "Force", "allowForce": true, "gracePeriodSeconds": 5}),
        ),
    )
    .await;

    // Halt: the node fails, and with maxFailures 0 the rollout halts.
    let halted = rollout_when(&bed.client, "ro-halt", "Halted=True", |r| {
        has_condition(r, "Halted", "True", "TooManyFailures")
    })
    .await;
    let status = halted.status.unwrap();
    assert_eq!(status.failed_nodes[0].reason, "DrainTimeout");
    assert!(status.failed_nodes[0].message.contains("default/db-halt"));

    // Skip: skip-1 is left at its revision, skip-2 is updated, nothing failed, complete.
    let skipped = rollout_when(&bed.client, "ro-skip", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let status = skipped.status.unwrap();
    assert_eq!((status.nodes.skipped, status.nodes.succeeded), (1, 1));
    assert_eq!(status.nodes.failed, 0);
    assert_eq!(status.skipped_nodes, ["skip-1"]);
    assert_eq!(condition_status(&bed, "ro-skip", "Halted").await, "False");
    let plan = bed.plans().get("skip-1").await.unwrap();
    assert_eq!(
        plan.spec.desired_state,
        DesiredState::Staged,
        "never activated"
    );
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), "default");
    assert!(
        pods.get_opt("db-skip").await.unwrap().is_some(),
        "its budget held"
    );
    let events = events_for(&bed.client, "ro-skip").await;
    assert!(events.iter().any(|(r, _)| r == "NodeSkipped"), "{events:?}");

    // Force: past drainTimeout the protected pod is deleted anyway, with the grace period,
    // and the node is updated.
    rollout_when(&bed.client, "ro-force", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert!(pods.get_opt("db-force").await.unwrap().is_none(), "deleted");
    assert_eq!(bed.kubelets.grace_period("default/db-force"), Some(Some(5)));
    let events = events_for(&bed.client, "ro-force").await;
    assert!(events.iter().any(|(r, _)| r == "DrainForced"), "{events:?}");

    for node in ["halt-1", "skip-1", "skip-2", "force-1"] {
        uncordoned(&bed, node).await;
    }
    assert!(
        pods.get_opt("db-halt").await.unwrap().is_some(),
        "its budget held"
    );
}

/// Evictions the API server refuses otherwise than by a budget's 429: a pod covered by two
/// PodDisruptionBudgets (the Eviction API answers 500). Its node fails on its own with the
/// refusal in the message, and the other node of the round is updated. `onTimeout: Force`
/// runs as the controller's ServiceAccount with the shipped RBAC. (Each aborted the whole
/// reconcile: every round of the rollout stopped with no status, no grant, no Event.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_eviction_fails_only_its_node_and_force_works_under_the_shipped_rbac() {
    let bed = Bed::start_with_shipped_rbac().await;
    let _fleet = bed.fleet(SimConfig::default());
    for (node, group) in [("two-1", "two"), ("ok-1", "two"), ("force-1", "force")] {
        create_node(&bed.client, node, &[("drain", group)]).await;
    }
    protected_pod(&bed, "db-two", "two-1").await;
    let second: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "db-two-again", "namespace": "default"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "db-two"}}},
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(bed.client.clone(), "default")
        .create(&Default::default(), &second)
        .await
        .unwrap();
    create_running_pod(
        &bed.client,
        pod("web-ok", "ok-1", json!({"app": "web"}), json!({})),
    )
    .await;
    protected_pod(&bed, "db-force", "force-1").await;
    create_release(&bed.client, "rel", "v8").await;
    let rollout = |group: &str, extra: Value| {
        let mut spec = json!({"release": "rel", "nodeSelector": {"matchLabels": {"drain": group}},
               "maxUnavailable": 2, "maxFailures": 1, "disruption": "Drain", "drainTimeout": "3s"});
        for (key, value) in extra.as_object().unwrap() {
            spec[key] = value.clone();
        }
        spec
    };
    create_rollout(
        &bed.client,
        "ro-two",
        rollout("two", json!({"drain": {"onTimeout": "Halt"}})),
    )
    .await;
    create_rollout(
        &bed.client,
        "ro-force",
        rollout(
            "force",
            json!({"drain": {"onTimeout": "Force", "allowForce": true, "gracePeriodSeconds": 5}}),
        ),
    )
    .await;

    let done = rollout_when(&bed.client, "ro-two", "two-1 failed, ok-1 updated", |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.nodes.succeeded == 1 && s.nodes.failed == 1)
    })
    .await;
    let status = done.status.unwrap();
    assert_eq!(status.failed_nodes[0].node, "two-1");
    assert_eq!(status.failed_nodes[0].reason, "DrainTimeout");
    let message = &status.failed_nodes[0].message;
    assert!(
        message.contains("default/db-two") && message.contains("more than one PodDisruptionBudget"),
        "{message}"
    );

    rollout_when(&bed.client, "ro-force", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(bed.client.clone(), "default");
    assert!(pods.get_opt("db-force").await.unwrap().is_none(), "deleted");
    for node in ["two-1", "ok-1", "force-1"] {
        uncordoned(&bed, node).await;
    }
}
