//! FleetLock on the real kube-apiserver (docs/usage/fleetlock.md): the controller serves the
//! protocol with `--fleetlock-addr`; the requests are zincati's, built from its protocol
//! document and its client's source (coreos/zincati `docs/development/fleetlock/protocol.md`,
//! `src/fleet_lock/mod.rs`): the header `fleet-lock-protocol: true` and
//! `{"client_params": {"group": …, "id": …}}`. zincati itself needs rpm-ostree and a Fedora
//! CoreOS host, so it does not run here.
//!
//! What it proves: the page's block works as written; zincati's default id (derived from the
//! machine ID) finds its Node; the lock is recursive, owned and bounded by its group; a held
//! slot keeps a rollout with `maxUnavailable: 1` from granting, and an activating node keeps
//! FleetLock from granting; bad requests get the protocol's errors.

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use inplace_controller::decision::fleetlock::{HOLDER_ANNOTATION, zincati_id};
use inplace_controller::rollout::fleetlock::FleetLockSettings;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::sim_agent::SimConfig;
use support::*;

const MACHINE_ID: &str = "3d1219c7c4c5404aaa1f6d2a48adfda4";

/// A loopback address nothing listens on yet.
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn settings(addr: SocketAddr) -> inplace_controller::runtime::run::Settings {
    let mut settings = test_settings();
    settings.reconcile.fleetlock = Some(FleetLockSettings {
        addr,
        max_holders: 1,
    });
    settings
}

/// A POST to the FleetLock server at `addr` (HTTP/1.1, the connection closed after the
/// answer), with the protocol's header when `header`; the status and the JSON body (`null`
/// when there is none).
async fn post(addr: SocketAddr, path: &str, header: bool, body: &Value) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let header = if header {
        "fleet-lock-protocol: true\r\n"
    } else {
        ""
    };
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{header}content-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// One FleetLock request as zincati sends it.
async fn ask(addr: SocketAddr, path: &str, group: &str, id: &str) -> (u16, Value) {
    let body = json!({"client_params": {"group": group, "id": id}});
    post(addr, &format!("/v1/{path}"), true, &body).await
}

async fn holder(bed: &Bed, node: &str) -> Option<String> {
    let node: Node = bed.nodes().get(node).await.unwrap();
    node.metadata
        .annotations
        .and_then(|a| a.get(HOLDER_ANNOTATION).cloned())
}

/// Waits until the controller serves FleetLock at `addr`.
async fn serving(addr: SocketAddr) {
    eventually("the FleetLock server answers", || async {
        tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zincatis_reboots_and_a_rollout_share_one_budget_through_fleetlock() {
    let addr = free_addr();
    let bed = Bed::start_with(settings(addr)).await;
    for name in ["worker-1", "worker-2", "worker-3"] {
        create_node(&bed.client, name, &[]).await;
    }
    bed.nodes()
        .patch_status(
            "worker-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": {"machineID": MACHINE_ID}}})),
        )
        .await
        .unwrap();
    serving(addr).await;
    let base = format!("http://{addr}");

    // The page's block, as written, for worker-2.
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/fleetlock.md");
    let block = inplace_tests::docs::shell_block(&page, "## Asking by hand").unwrap();
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = work.path().join("admin.kubeconfig");
    bed.api.write_admin_kubeconfig(&kubeconfig).unwrap();
    let path = inplace_tests::tools::path_with_tools().unwrap();
    let printed = tokio::task::block_in_place(|| {
        inplace_tests::docs::run_as_a_person(
            &block,
            work.path(),
            &[
                ("FLEETLOCK", base.as_ref()),
                ("KUBECONFIG", kubeconfig.as_os_str()),
                ("PATH", path.as_os_str()),
            ],
        )
    })
    .unwrap();
    assert_eq!(printed, "200\ndefault/worker-2\n200\n");
    assert_eq!(holder(&bed, "worker-2").await, None);

    // zincati's default id on worker-1: recursive, owned, one slot for the group.
    let zincati = zincati_id(MACHINE_ID).unwrap();
    assert_eq!(ask(addr, "pre-reboot", "default", &zincati).await.0, 200);
    assert_eq!(ask(addr, "pre-reboot", "default", &zincati).await.0, 200);
    assert_eq!(
        holder(&bed, "worker-1").await,
        Some(format!("default/{zincati}"))
    );
    let (status, error) = ask(addr, "pre-reboot", "default", "worker-3").await;
    assert_eq!(status, 409);
    assert_eq!(error["kind"], "failed_lock_semaphore_full", "{error}");
    // Another client's release leaves the slot held.
    assert_eq!(
        ask(addr, "steady-state", "default", "worker-3").await.0,
        200
    );
    assert!(holder(&bed, "worker-1").await.is_some());
    assert_eq!(ask(addr, "steady-state", "default", &zincati).await.0, 200);
    assert_eq!(ask(addr, "steady-state", "default", &zincati).await.0, 200);
    assert_eq!(holder(&bed, "worker-1").await, None);

    // worker-2 rebooting under FleetLock: the rollout grants nothing and says why.
    assert_eq!(ask(addr, "pre-reboot", "default", "worker-2").await.0, 200);
    let fleet = bed.fleet(SimConfig {
        activate: Duration::from_secs(3),
        ..SimConfig::default()
    });
    create_release(&bed.client, "rel", "v1").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1, "countForeignDisruption": false}),
    )
    .await;
    rollout_when(&bed.client, "ro", "the slot worker-2's reboot uses", |r| {
        r.status.as_ref().is_some_and(|s| s.nodes.staged == 3)
            && condition(r, "Progressing").is_some_and(|(_, _, m)| {
                m.contains("1 slot used by others: worker-2 rebooting under a FleetLock client")
            })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        bed.granted().await.is_empty(),
        "no grant while worker-2 reboots"
    );
    assert_eq!(
        ask(addr, "steady-state", "default", "worker-2").await.0,
        200
    );

    // While the rollout activates a node, no reboot slot: the refusal names the node.
    let activating = eventually("an activation started", || async {
        bed.granted().await.first().cloned()
    })
    .await;
    let other = ["worker-1", "worker-2", "worker-3"]
        .into_iter()
        .find(|n| *n != activating)
        .unwrap();
    let (status, error) = ask(addr, "pre-reboot", "default", other).await;
    assert_eq!(status, 409, "{error}");
    assert_eq!(error["kind"], "failed_lock_rollout_budget", "{error}");
    let named = format!("NodeRollout ro has 1 of 1 slots in use: {activating} activating");
    assert_eq!(error["value"], named.as_str());
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert_eq!(fleet.max_activating(), 1);
    assert_eq!(ask(addr, "pre-reboot", "default", other).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_protocols_errors_and_change_nothing() {
    let addr = free_addr();
    let bed = Bed::start_with(settings(addr)).await;
    create_node(&bed.client, "worker-1", &[]).await;
    serving(addr).await;
    let body = json!({"client_params": {"group": "default", "id": "worker-1"}});
    let (status, error) = post(addr, "/v1/pre-reboot", false, &body).await;
    assert_eq!(status, 400);
    assert_eq!(error["kind"], "bad_request");
    assert!(
        error["value"]
            .as_str()
            .unwrap()
            .contains("fleet-lock-protocol"),
        "{error}"
    );
    let (status, error) = ask(addr, "pre-reboot", "a group", "worker-1").await;
    assert_eq!((status, error["kind"].as_str()), (400, Some("bad_request")));
    let (status, error) = ask(addr, "pre-reboot", "default", "nobody").await;
    assert_eq!(
        (status, error["kind"].as_str()),
        (404, Some("unknown_client"))
    );
    assert!(
        error["value"].as_str().unwrap().contains("nobody"),
        "{error}"
    );
    assert_eq!(holder(&bed, "worker-1").await, None);
}
