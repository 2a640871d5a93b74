//! Running the controller: leader election with two replicas, the metrics and probe
//! endpoints, graceful shutdown, a kube-apiserver restart (on the real server), and surviving
//! conflicts, cut watches and an outage (on the emulator: only it injects those faults on
//! demand).

// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::time::Duration;

use inplace_controller::runtime::leader::LeaseSettings;
use inplace_controller::runtime::run::Settings;
use inplace_tests::test_api::TestApi;
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::json;
use support::sim_agent::SimConfig;
use support::*;

fn lease(identity: &str) -> LeaseSettings {
    LeaseSettings {
        namespace: "default".into(),
        name: "inplace-controller".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(3),
        renew_every: Duration::from_millis(500),
    }
}

async fn holder(client: &kube::Client) -> Option<String> {
    let api: kube::Api<Lease> = kube::Api::namespaced(client.clone(), "default");
    api.get_opt("inplace-controller")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body
}

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leader_and_a_clean_handover() {
    let (api, client) = cluster().await;
    let _fleet = fleet(&api, &client, SimConfig::default());
    create_node(&client, "worker-1", &[]).await;
    create_release(&client, "rel", "v1").await;

    let addr_a = free_addr();
    let settings = |identity: &str, addr| Settings {
        metrics_addr: Some(addr),
        lease: Some(lease(identity)),
        ..test_settings()
    };
    let (metrics_a, stop_a, task_a) = start_controller(
        api.admin_config().await.unwrap(),
        settings("replica-a", addr_a),
    );
    eventually("replica-a leads", || async {
        (holder(&client).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let (metrics_b, stop_b, task_b) = start_controller(
        api.admin_config().await.unwrap(),
        settings("replica-b", free_addr()),
    );
    create_rollout(&client, "first", json!({"release": "rel"})).await;
    rollout_when(&client, "first", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    // The follower stays a follower while the leader renews.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(metrics_a.is_leader());
    assert!(!metrics_b.is_leader());
    assert_eq!(holder(&client).await.as_deref(), Some("replica-a"));

    // Metrics and probes on the leader.
    let text = http_get(&addr_a.to_string(), "/metrics").await;
    assert!(text.contains("inplace_controller_leader 1"), "{text}");
    assert!(
        text.contains("inplace_controller_reconciles_total{controller=\"rollout\"}"),
        "{text}"
    );
    assert!(text.contains("inplace_controller_api_writes_total{kind=\"plan_apply\"}"));
    assert!(text.contains("inplace_rollout_nodes{rollout=\"first\",state=\"succeeded\"} 1"));
    assert!(
        http_get(&addr_a.to_string(), "/healthz")
            .await
            .contains(" 200 OK")
    );
    assert!(
        http_get(&addr_a.to_string(), "/readyz")
            .await
            .contains(" 200 OK")
    );

    // Graceful stop of the leader: it releases the Lease and the follower takes over.
    stop_a.send(true).unwrap();
    let result = tokio::time::timeout(WAIT, task_a).await.unwrap().unwrap();
    assert!(result.is_ok(), "{result:?}");
    assert!(!metrics_a.is_leader());
    eventually("replica-b leads", || async {
        (holder(&client).await.as_deref() == Some("replica-b")).then_some(())
    })
    .await;
    create_node(&client, "worker-2", &[]).await;
    create_rollout(
        &client,
        "second",
        json!({"release": "rel", "nodeSelector": {"matchLabels": {"late": "yes"}}}),
    )
    .await;
    rollout_when(&client, "second", "reconciled by replica-b", |r| {
        has_condition(r, "Complete", "True", "NoNodesSelected")
    })
    .await;
    rollout_when(&client, "first", "worker-2 updated by replica-b", |r| {
        r.status.as_ref().is_some_and(|s| s.nodes.succeeded == 2)
    })
    .await;
    assert!(metrics_b.is_leader());
    stop_b.send(true).unwrap();
    let result = tokio::time::timeout(WAIT, task_b).await.unwrap().unwrap();
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_steps_down() {
    let (api, client) = cluster().await;
    let (metrics, _stop, task) = start_controller(
        api.admin_config().await.unwrap(),
        Settings {
            lease: Some(lease("replica-a")),
            ..test_settings()
        },
    );
    eventually("replica-a leads", || async {
        (holder(&client).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    // Someone else takes the Lease (as after a partition): the old leader must stop.
    let api: kube::Api<Lease> = kube::Api::namespaced(client.clone(), "default");
    api.patch(
        "inplace-controller",
        &Default::default(),
        &kube::api::Patch::Merge(json!({"spec": {"holderIdentity": "intruder"}})),
    )
    .await
    .unwrap();
    let result = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    let error = result.unwrap_err();
    assert!(
        error.to_string().contains("lost the leader Lease"),
        "{error}"
    );
    assert!(!metrics.is_leader());
}

/// The outage cases' rollout: simulated agents, 4 nodes, release `rel`, rollout `ro` with
/// `maxUnavailable: 1`.
async fn four_nodes_one_at_a_time(bed: &Bed) -> support::sim_agent::Fleet {
    let fleet = bed.fleet(SimConfig {
        activate: Duration::from_millis(400),
        ..SimConfig::default()
    });
    for i in 1..=4 {
        create_node(&bed.client, &format!("worker-{i}"), &[]).await;
    }
    create_release(&bed.client, "rel", "v1").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1}),
    )
    .await;
    fleet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_survives_conflicts_cut_watches_and_an_outage() {
    use inplace_api_emulator::OutageKind;
    // The emulator: conflicts on the next N writes, 410 Gone on the next watches, watches
    // cut and an outage of a chosen length on demand are faults only it injects.
    let api = TestApi::start_emulator(inplace_api_emulator::EmulatorConfig::default())
        .await
        .unwrap();
    let bed = Bed::start_on(api).await;
    let fleet = four_nodes_one_at_a_time(&bed).await;
    bed.faults().conflict_next_writes(5);
    rollout_when(&bed.client, "ro", "one node updated", |r| {
        r.status.as_ref().is_some_and(|s| s.nodes.succeeded >= 1)
    })
    .await;
    // Watches end with 410 Gone and must relist; then the API is down for a while.
    bed.faults().gone_next_watches(4);
    bed.faults().cut_watches();
    bed.faults()
        .outage(Duration::from_secs(3), OutageKind::Unavailable);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rollout = rollout_when(&bed.client, "ro", "Complete=True after the faults", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert_eq!(rollout.status.unwrap().nodes.succeeded, 4);
    assert_eq!(fleet.max_activating(), 1, "no double grant across relists");
}

/// The real outage: kube-apiserver killed (SIGKILL) mid-rollout and let up again on the same
/// port with etcd's data. The controller's watches and writes, and the agents', recover.
/// The heaviest case of this file: nextest starts it first of the tests that boot no node
/// (`.config/nextest.toml`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_survives_kube_apiserver_killed_and_restarted() {
    // A server of its own: it kills it.
    let bed = Bed::start_on(TestApi::start().await.unwrap()).await;
    let fleet = four_nodes_one_at_a_time(&bed).await;
    rollout_when(&bed.client, "ro", "one node updated", |r| {
        r.status.as_ref().is_some_and(|s| s.nodes.succeeded >= 1)
    })
    .await;
    match &*bed.api {
        TestApi::Real(server) => {
            server.kill_apiserver().unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            server.resume().unwrap();
        }
        // INPLACE_TEST_API=emulator: the closest the emulator comes.
        TestApi::Emulator(emulator) => emulator.faults().outage(
            Duration::from_secs(3),
            inplace_api_emulator::OutageKind::Unavailable,
        ),
    }
    let rollout = rollout_when(&bed.client, "ro", "Complete=True after the restart", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert_eq!(rollout.status.unwrap().nodes.succeeded, 4);
    assert_eq!(
        fleet.max_activating(),
        1,
        "no double grant across the restart"
    );
}
