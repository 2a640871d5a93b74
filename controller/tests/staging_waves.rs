//! `spec.staging.maxConcurrent` on the real kube-apiserver (or the emulator with
//! `INPLACE_TEST_API=emulator`), with simulated agents on every node: the fleet is staged
//! in waves, never more nodes downloading at once than the limit, counted by the artifact
//! server they download from and from the agents' side; and the server refuses a limit
//! that is neither a count nor a percentage.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use inplace_tests::artifact_server::{Artifact, ArtifactServer};
use serde_json::json;
use support::sim_agent::SimConfig;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_stages_in_waves_of_max_concurrent() {
    let bed = Bed::start().await;
    // Every node downloads 256 KiB from one server through a shared 1 MiB/s link: long
    // enough that an unlimited rollout would have every node downloading at once.
    let server = ArtifactServer::start().await.unwrap();
    server.put("/kubernetes.raw", Artifact::bytes(vec![7u8; 256 << 10]));
    let link = server.share_link(1 << 20);
    let fleet = bed.fleet(SimConfig {
        download_from: Some(server.url("/kubernetes.raw")),
        ..SimConfig::default()
    });
    let nodes: Vec<String> = (1..=7).map(|i| format!("worker-{i}")).collect();
    for name in &nodes {
        create_node(&bed.client, name, &[]).await;
    }
    create_release(&bed.client, "rel", "v9").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": "100%", "staging": {"maxConcurrent": 2}}),
    )
    .await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert!(
        link.peak() <= 2,
        "at most 2 downloads at once, the server saw {}",
        link.peak()
    );
    assert!(
        fleet.max_staging() <= 2,
        "at most 2 nodes staging at once, saw {}",
        fleet.max_staging()
    );
    assert_eq!(
        fleet.stats.downloads.lock().unwrap().len(),
        nodes.len(),
        "every node downloaded once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_that_is_no_count_or_percentage_is_refused_by_the_server() {
    let bed = Bed::start().await;
    for (bad, why) in [
        (json!(0), "maxConcurrent must be a positive integer"),
        (json!("0%"), "maxConcurrent must be a positive integer"),
        (json!("half"), "maxConcurrent must be a positive integer"),
    ] {
        let spec = json!({"release": "rel", "staging": {"maxConcurrent": bad}});
        let refusal = refusal(&bed.client, "bad", spec).await;
        assert!(
            refusal.as_deref().is_some_and(|r| r.contains(why)),
            "{bad}: {refusal:?}"
        );
    }
}
