//! What a rollout costs the API and the controller, counted (not timed) on the real
//! kube-apiserver with simulated agents: each plan written at most twice, each agent's
//! status at most three times, the rollout's status at most once a second; and a round in
//! which nothing changed builds no node views, decides nothing and sends no request.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use inplace_controller::metrics::Metrics;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::sim_agent::SimConfig;
use support::*;

const NODES: usize = 24;

/// The sum of a metric's samples whose labels contain `labels` (`""`: all of them).
fn metric(metrics: &Metrics, name: &str, labels: &str) -> f64 {
    metrics
        .render()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let rest = key.strip_prefix(name)?;
            (rest.is_empty() || rest.starts_with('{')).then_some((rest, value))
        })
        .filter(|(rest, _)| rest.contains(labels))
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_writes_little_and_an_unchanged_round_does_nothing() {
    // No resync inside the test: a resync round decides again, by design.
    let mut settings = test_settings();
    settings.reconcile.resync = Duration::from_secs(3600);
    let bed = Bed::start_with(settings).await;
    let fleet = bed.fleet(SimConfig {
        every_phase: false,
        ..SimConfig::default()
    });
    let names: Vec<String> = (0..NODES).map(|i| format!("node-{i:02}")).collect();
    for name in &names {
        create_node(&bed.client, name, &[("pool", "fleet")]).await;
    }
    create_release(&bed.client, "k8s-1-31-2", "v1.31.2").await;
    let started = Instant::now();
    create_rollout(
        &bed.client,
        "fleet",
        json!({"release": "k8s-1-31-2", "maxUnavailable": "25%",
               "nodeSelector": {"matchLabels": {"pool": "fleet"}}}),
    )
    .await;
    rollout_when(&bed.client, "fleet", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    // A status owed when Complete was seen is written within the next second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window = started.elapsed();

    let writes = |kind: &str| metric(&bed.metrics, "inplace_controller_api_writes_total", kind);
    let plan_applies = writes("kind=\"plan_apply\"");
    let status_writes = writes("kind=\"rollout_status\"");
    let agent_writes = fleet.stats.status_writes.load(Ordering::SeqCst);
    assert!(
        plan_applies <= 2.0 * NODES as f64,
        "{plan_applies} plan applies for {NODES} nodes"
    );
    assert!(
        agent_writes <= 3 * NODES,
        "{agent_writes} agent status writes for {NODES} nodes"
    );
    // Status writes are at least a second apart, so a window of w seconds holds at most
    // floor(w) + 1 of them; a slow machine only makes fewer.
    let most = window.as_secs_f64().floor() + 1.0;
    assert!(
        status_writes >= 1.0 && status_writes <= most,
        "{status_writes} rollout status writes in {window:?}"
    );

    // Nothing the decision reads changes: an annotation on a selected Node wakes the
    // rollout (its node is rebuilt) but it decides nothing and sends nothing.
    let unchanged = || {
        metric(
            &bed.metrics,
            "inplace_controller_rollout_rounds_total",
            "unchanged",
        )
    };
    let touch = |name: String, i: usize| {
        let nodes = bed.nodes();
        async move {
            nodes
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"touched": i.to_string()}}})),
                )
                .await
                .unwrap();
        }
    };
    // First settle: a touch answered by an unchanged round alone means that earlier
    // events are done with.
    let decided = || {
        metric(
            &bed.metrics,
            "inplace_controller_rollout_rounds_total",
            "decided",
        )
    };
    for i in 0.. {
        let (u, d) = (unchanged(), decided());
        touch(names[0].clone(), i).await;
        eventually("a round after a touch", || async {
            (unchanged() > u || decided() > d).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if decided() == d {
            break;
        }
    }
    let decided_before = decided();
    let views = metric(
        &bed.metrics,
        "inplace_controller_node_views_built_total",
        "",
    );
    let requests = metric(&bed.metrics, "inplace_controller_api_requests_total", "");
    let before = unchanged();
    let touches = 3 * NODES;
    for round in 0..3 {
        for name in &names {
            touch(name.clone(), 1000 + round).await;
        }
    }
    eventually("the touches' rounds", || async {
        (unchanged() > before).then_some(())
    })
    .await;
    // Let every touch's event reach the controller.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let built = metric(
        &bed.metrics,
        "inplace_controller_node_views_built_total",
        "",
    ) - views;
    assert!(
        built <= touches as f64,
        "{built} node views built for {touches} touched nodes (a full rebuild per round would be {NODES} per round)"
    );
    assert_eq!(decided(), decided_before, "an unchanged round decided");
    assert_eq!(
        metric(&bed.metrics, "inplace_controller_api_requests_total", ""),
        requests,
        "an unchanged round sent a request"
    );
}
