//! The health gates end to end, on the real kube-apiserver with simulated agents: an updated
//! node that is not `Ready` holds the rollout until it is, and the Prometheus alert gate,
//! asked at a real HTTP endpoint this test serves in Prometheus' JSON shape, holds the
//! rollout while a listed alert fires and fails closed while the endpoint is slow, answers
//! something else or is down.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::time::Duration;

use inplace_controller::rollout::alert_gate::PrometheusSettings;
use inplace_proto::NodeRollout;
use serde_json::json;
use support::prometheus::{Answer, FakePrometheus};
use support::sim_agent::SimConfig;
use support::*;

/// The controller's patience with Prometheus in these cases: far below the slow answer.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long the slow endpoint takes.
const SLOW: Duration = Duration::from_secs(30);

fn progressing_is(r: &NodeRollout, reason: &str, says: &str) -> bool {
    condition(r, "Progressing")
        .is_some_and(|(s, got, message)| s == "False" && got == reason && message.contains(says))
}

fn staged(r: &NodeRollout, n: i32) -> bool {
    r.status.as_ref().is_some_and(|s| s.nodes.staged == n)
}

/// Waits until the controller asked the endpoint `more` more times, with the rollout still
/// held for `reason`: the hold is a verdict the controller keeps reaching, not a round that
/// has not happened yet.
async fn held_across_asks(
    bed: &Bed,
    prometheus: &FakePrometheus,
    more: usize,
    reason: &str,
    says: &str,
) {
    let from = prometheus.asked();
    eventually("the controller to ask Prometheus again", || async {
        (prometheus.asked() >= from + more).then_some(())
    })
    .await;
    rollout_when(&bed.client, "ro", reason, |r| {
        progressing_is(r, reason, says)
    })
    .await;
    assert!(
        bed.granted().await.is_empty(),
        "a node was granted while {reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_alert_holds_the_rollout_a_gate_without_an_answer_fails_closed() {
    let mut prometheus = FakePrometheus::start(Answer::Alerts(vec![
        ("NodeDown".into(), "firing".into()),
        ("Watchdog".into(), "firing".into()),
    ]))
    .await;
    let mut settings = test_settings();
    settings.reconcile.prometheus = Some(PrometheusSettings {
        url: prometheus.url(),
        timeout: TIMEOUT,
    });
    settings.reconcile.alert_recheck = Duration::from_millis(500);
    let bed = Bed::start_with(settings).await;
    let _fleet = bed.fleet(SimConfig::default());
    for name in ["a", "b", "c"] {
        create_node(&bed.client, name, &[]).await;
    }
    create_release(&bed.client, "rel", "v2").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1,
               "gates": {"alerts": ["NodeDown", "DiskSoonFull"]}}),
    )
    .await;

    // A listed alert fires: everything is staged, nothing activates, the alert is named
    // (the unlisted Watchdog is not).
    let held = rollout_when(&bed.client, "ro", "staged and held by NodeDown", |r| {
        staged(r, 3)
            && progressing_is(
                r,
                "AlertFiring",
                "alerts firing (spec.gates.alerts): NodeDown",
            )
    })
    .await;
    let message = condition(&held, "Progressing").unwrap().2;
    assert!(!message.contains("Watchdog"), "{message}");
    held_across_asks(&bed, &prometheus, 2, "AlertFiring", "NodeDown").await;
    assert!(
        events_for(&bed.client, "ro")
            .await
            .iter()
            .any(|(r, _)| r == "AlertFiring")
    );

    // A listed alert that is only pending does not block, but the endpoint is slower than
    // the timeout: no answer, the gate stays closed.
    prometheus.answer(Answer::After(SLOW));
    rollout_when(&bed.client, "ro", "held: Prometheus too slow", |r| {
        progressing_is(r, "GateUnavailable", "no complete answer within 1s")
    })
    .await;
    held_across_asks(
        &bed,
        &prometheus,
        1,
        "GateUnavailable",
        "no complete answer",
    )
    .await;

    // Something that is not Prometheus' JSON.
    prometheus.answer(Answer::NotJson);
    rollout_when(&bed.client, "ro", "held: not Prometheus' answer", |r| {
        progressing_is(r, "GateUnavailable", "not Prometheus' alerts answer")
    })
    .await;
    held_across_asks(
        &bed,
        &prometheus,
        2,
        "GateUnavailable",
        "not Prometheus' alerts answer",
    )
    .await;

    // Down: connections refused.
    prometheus.down().await;
    let down = rollout_when(&bed.client, "ro", "held: Prometheus down", |r| {
        progressing_is(r, "GateUnavailable", "/api/v1/alerts failed")
    })
    .await;
    assert!(bed.granted().await.is_empty());
    let message = condition(&down, "Progressing").unwrap().2;
    assert!(
        message.contains(prometheus.url().as_str().trim_end_matches('/')),
        "{message}"
    );

    // Back, the alert resolved (another one pending): the rollout goes on to the end.
    prometheus.answer(Answer::Alerts(vec![
        ("DiskSoonFull".into(), "pending".into()),
        ("Watchdog".into(), "firing".into()),
    ]));
    prometheus.up().await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
}

/// No Prometheus configured: the gates set by the command of standalone-rollouts.md § Steer
/// it cannot be checked, so nothing activates and the message says what is missing; an
/// empty list lifts the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_listed_without_a_prometheus_url_hold_the_rollout_until_lifted() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    create_node(&bed.client, "a", &[]).await;
    create_release(&bed.client, "rel", "v2").await;
    create_rollout(
        &bed.client,
        "workers",
        json!({"release": "rel", "paused": true}),
    )
    .await;
    let api = bed.api.clone();
    tokio::task::spawn_blocking(move || {
        let server = api.real().expect("the real API server");
        server
            .run_kubectl(&[
                "patch",
                "noderollout",
                "workers",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"gates":{"alerts":["NodeDown","HighErrorRate"]}}}"#,
            ])
            .unwrap()
    })
    .await
    .unwrap();
    patch_rollout(&bed.client, "workers", json!({"paused": false})).await;
    rollout_when(&bed.client, "workers", "held: no Prometheus", |r| {
        staged(r, 1) && progressing_is(r, "GateUnavailable", "no Prometheus URL (--prometheus-url)")
    })
    .await;
    assert!(bed.granted().await.is_empty());

    patch_rollout(&bed.client, "workers", json!({"gates": {"alerts": []}})).await;
    rollout_when(&bed.client, "workers", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
}

/// An updated node goes NotReady: the nodes the rollout selects next are staged but not
/// activated, the status names the node; once it is Ready again they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_updated_node_that_is_not_ready_holds_the_rollout_until_it_is() {
    let bed = Bed::start().await;
    let _fleet = bed.fleet(SimConfig::default());
    create_node(&bed.client, "a", &[("pool", "gate")]).await;
    create_node(&bed.client, "b", &[]).await;
    create_node(&bed.client, "c", &[]).await;
    create_release(&bed.client, "rel", "v2").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "nodeSelector": {"matchLabels": {"pool": "gate"}}}),
    )
    .await;
    rollout_when(&bed.client, "ro", "a updated", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;

    set_node_ready(&bed.client, "a", "False", "KubeletNotReady").await;
    for name in ["b", "c"] {
        bed.nodes()
            .patch(
                name,
                &Default::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"labels": {"pool": "gate"}}})),
            )
            .await
            .unwrap();
    }
    rollout_when(&bed.client, "ro", "b and c staged, held by a", |r| {
        staged(r, 2) && progressing_is(r, "NodeNotReady", "a (Ready=False (KubeletNotReady))")
    })
    .await;
    assert_eq!(bed.granted().await, ["a"], "only a was ever granted");
    assert!(
        events_for(&bed.client, "ro")
            .await
            .iter()
            .any(|(r, _)| r == "NodeNotReady")
    );

    set_node_ready(&bed.client, "a", "True", "KubeletReady").await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
}
