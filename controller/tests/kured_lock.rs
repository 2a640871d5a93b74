//! Sharing the fleet with kured on the real kube-apiserver (docs/usage/standalone-rollouts.md
//! § Sharing the fleet): the controller runs with `--kured-daemonset kube-system/kured`, and
//! a stand-in for kured's daemons (`support::kured`, kured 1.23.0's
//! `pkg/daemonsetlock/daemonsetlock.go`) takes and releases the lock as kured does, cordoning
//! its node meanwhile, as kured drains before it reboots.
//!
//! What it proves: while kured holds its lock no activation starts (`RebootLockHeld`, naming
//! the holder); while the rollout activates, kured's daemons find the lock held by
//! `inplace/<rollout>` and wait; and with `maxUnavailable: 1`, a node kured reboots and a
//! node inplace activates are never down together.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use inplace_controller::rollout::kured_lock::KuredSettings;
use inplace_proto::Phase;
use inplace_tests::test_api::TestApi;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::jiff::SignedDuration;
use kube::api::Api;
use serde_json::json;
use support::sim_agent::SimConfig;
use support::*;

fn settings() -> inplace_controller::runtime::run::Settings {
    let mut settings = test_settings();
    settings.reconcile.kured = Some(KuredSettings {
        namespace: "kube-system".into(),
        name: "kured".into(),
        annotation: support::kured::ANNOTATION.into(),
        ttl: SignedDuration::from_mins(30),
        recheck: Duration::from_secs(1),
    });
    settings
}

/// A server of its own: kured's DaemonSet is in `kube-system`, which a reset of the run's
/// shared server leaves as it is (tests/kube/reset.go).
async fn own_bed() -> Bed {
    Bed::start_on_with(TestApi::start().await.unwrap(), settings()).await
}

/// The nodes whose agent is activating or verifying, as the API says.
async fn activating(bed: &Bed) -> Vec<String> {
    bed.plans_where(|p| {
        matches!(
            p.status.as_ref().and_then(|s| s.phase),
            Some(Phase::Activating | Phase::Verifying)
        )
    })
    .await
}

/// One kured reboot of `node`, from a held lock: cordon (kured drains), down for a while,
/// back (uncordon), release. Throughout, no node inplace activates may be down as well.
async fn reboot_holding_the_lock(bed: &Bed, ds: &Api<DaemonSet>, node: &str, down: &AtomicBool) {
    bed.set_cordon(node, true).await;
    down.store(true, Ordering::SeqCst);
    for _ in 0..10 {
        let also_down = activating(bed).await;
        assert!(
            also_down.is_empty(),
            "kured reboots {node} while inplace activates {also_down:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bed.set_cordon(node, false).await;
    down.store(false, Ordering::SeqCst);
    support::kured::release(ds, node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kured_and_a_rollout_share_one_budget_through_kureds_lock() {
    let bed = Arc::new(own_bed().await);
    let ds = support::kured::create_daemonset(&bed.client).await;
    let fleet = bed.fleet(SimConfig {
        activate: Duration::from_secs(2),
        ..SimConfig::default()
    });
    for name in ["worker-1", "worker-2", "worker-3", "worker-4"] {
        create_node(&bed.client, name, &[]).await;
    }
    let down = Arc::new(AtomicBool::new(false));

    // kured reboots worker-2 first: the rollout waits for its lock, and says why.
    let (got, _) = support::kured::acquire(&ds, "worker-2", Duration::ZERO).await;
    assert!(got);
    create_release(&bed.client, "rel", "v1").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1}),
    )
    .await;
    rollout_when(&bed.client, "ro", "held by kured's lock", |r| {
        condition(r, "Progressing").is_some_and(|(status, reason, message)| {
            status == "False"
                && reason == "RebootLockHeld"
                && message.starts_with("kured's reboot lock is held by \"worker-2\" since ")
        })
    })
    .await;
    assert_eq!(fleet.stats.activation_order.lock().unwrap().len(), 0);
    reboot_holding_the_lock(&bed, &ds, "worker-2", &down).await;

    // Once the rollout activates, kured's daemons wanting to reboot worker-1 and worker-3
    // find the lock held by the rollout, and wait for it, each trying every 300 ms.
    eventually("an activation started", || async {
        (fleet.stats.activating_now.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    let kured = {
        let (bed, ds, down) = (bed.clone(), ds.clone(), down.clone());
        tokio::spawn(async move {
            let mut refused_by = Vec::new();
            for node in ["worker-1", "worker-3"] {
                loop {
                    let (got, holder) = support::kured::acquire(&ds, node, Duration::ZERO).await;
                    if got {
                        break;
                    }
                    refused_by.push(holder);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                reboot_holding_the_lock(&bed, &ds, node, &down).await;
            }
            refused_by
        })
    };
    rollout_when(&bed.client, "ro", "all nodes updated", |r| {
        condition(r, "Complete").is_some_and(|(status, _, _)| status == "True")
    })
    .await;
    let refused_by = tokio::time::timeout(WAIT, kured).await.unwrap().unwrap();
    assert_eq!(
        refused_by.first().map(String::as_str),
        Some("inplace/ro"),
        "{refused_by:?}"
    );
    assert_eq!(fleet.max_activating(), 1);
    assert_eq!(
        support::kured::lock_value(&ds).await,
        None,
        "the rollout released kured's lock"
    );
}

/// kured with `--concurrency=2` (its multi-holder lock): a daemon rebooting worker-2 uses one
/// place and one slot of the rollout (`maxUnavailable: 2`); the rollout joins the lock as
/// `inplace/ro` while it activates, so the lock is full and a second kured daemon waits;
/// when the rollout is done it leaves, and the daemon's place is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kureds_multi_holder_lock_gives_the_rollout_one_place() {
    let bed = Arc::new(own_bed().await);
    let ds = support::kured::create_daemonset(&bed.client).await;
    let fleet = bed.fleet(SimConfig {
        activate: Duration::from_secs(2),
        ..SimConfig::default()
    });
    for name in ["worker-1", "worker-2", "worker-3", "worker-4"] {
        create_node(&bed.client, name, &[]).await;
    }
    let (got, _) = support::kured::acquire_shared(&ds, "worker-2", 2).await;
    assert!(got);
    create_release(&bed.client, "rel", "v1").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 2, "countForeignDisruption": false}),
    )
    .await;
    rollout_when(&bed.client, "ro", "worker-2's place used", |r| {
        condition(r, "Progressing")
            .is_some_and(|(_, _, m)| m.contains("worker-2 held by kured's lock"))
    })
    .await;
    let joined = eventually("the rollout joined kured's lock", || async {
        let holders = support::kured::shared_holders(&ds).await;
        holders
            .contains(&"inplace/ro".to_owned())
            .then_some(holders)
    })
    .await;
    assert_eq!(joined, ["worker-2", "inplace/ro"]);
    let (got, holders) = support::kured::acquire_shared(&ds, "worker-3", 2).await;
    assert!(!got, "the lock is full while the rollout activates");
    assert_eq!(holders, "worker-2,inplace/ro");
    rollout_when(&bed.client, "ro", "three nodes updated", |r| {
        r.status.as_ref().is_some_and(|s| s.nodes.succeeded == 3)
    })
    .await;
    eventually("the rollout left kured's lock", || async {
        (support::kured::shared_holders(&ds).await == ["worker-2"]).then_some(())
    })
    .await;
    let order = fleet.stats.activation_order.lock().unwrap().clone();
    assert_eq!(
        fleet.max_activating(),
        1,
        "worker-2's reboot used the other slot: {order:?}"
    );
    support::kured::release_shared(&ds, "worker-2").await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        condition(r, "Complete").is_some_and(|(status, _, _)| status == "True")
    })
    .await;
    assert!(support::kured::shared_holders(&ds).await.is_empty());
}
