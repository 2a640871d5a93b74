//! Crash matrix on a real Kubernetes node (issue 7, item 1; issue 34).
//!
//! One nspawn node is a real Kubernetes node (`inplace_tests::kube_node`): the real kubelet
//! (built from Kubernetes' Go module) merged from a `kubernetes` system extension, containerd,
//! registered with the real control plane as `system:node:NAME`, running one Pod. The agent
//! runs there under the shipped, hardened unit (plus a drop-in `RestartSec=1s`, so a case does
//! not wait the shipped 10 s for each restart), with the kubelet's own kubeconfig as its
//! identity. The binary is this package's test build, which has the `failpoints` feature (see
//! `src/failpoints.rs`): writing a point's name to `/run/inplace/failpoints` makes the agent
//! SIGKILL itself when it passes that point.
//!
//! Each case starts from a committed, healthy revision, arms one point (or schedules a
//! SIGKILL from outside after a random delay), and applies a new revision: a healthy one
//! (update points; the real kubelet) or one whose kubelet cannot start (rollback points; the
//! same kubelet with a flag it refuses, crash-looping until the health check's timeout).
//! Every revision's image holds its case tag at its root (its own sha256). The health checks
//! are the unit and the Node `Ready`. systemd restarts the agent with the point disarmed (it
//! fires once); the case waits for the final phase and checks the invariant of faults.md on
//! the node and in the status (`crash_bed/invariant.rs`):
//! * the sysext link and the managed binary links point at complete files whose sha256 is
//!   the one of the expected revision (new after an update, old after a rollback); a
//!   binary the committed revision dropped (the `activate.remove` case leaves `crictl` out
//!   of its plan) has no link left; no
//!   `.inplace-new` temporaries; the staging directory is empty;
//! * the merged /usr is a healthy image's and kubelet.service is active;
//! * the previous committed revision's image is still on disk;
//! * the status says `Succeeded` / `RolledBack` with the right `currentRevision`, and a
//!   revision that was rolled back was never reported `Succeeded`;
//! * the point really fired (the file is gone, systemd counted one more restart);
//! * the Node is `Ready` and the Pod kept its container through every case: the same Pod,
//!   container ID, process (containerd's task list) and start time, `restartCount` 0.
//!
//! CI (default): every named point once plus two random kills. Long mode:
//! `INPLACE_CRASH_MATRIX=long cargo nextest run -p inplace-agent -E 'test(/^crash_matrix::/)'`
//! runs every point three times and random kills until at least 100 crashes were injected
//! (`INPLACE_CRASH_MATRIX_MIN` overrides the 100).
//!
//! The two API cases keep the stand-in kubelet (`usr/bin/kubelet-sim`): the outage case
//! because a Node check cannot pass while kube-apiserver is down (the node must finish from
//! its journal alone), the 409/410 case because it runs on the emulator, with which a real
//! kubelet cannot register.

use std::time::{Duration, Instant};

use crash_bed::{Bed, Cut, Kill, Kubelet, boot};
use inplace_agent::failpoints::{ROLLBACK_POINTS, UPDATE_POINTS};
use inplace_api_emulator::{AuthzMode, EmulatorConfig};
use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::test_api::TestApi;

use crate::crash_bed;
use crate::real_node;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_at_every_step_boundary_keeps_the_node_safe() {
    let long = std::env::var("INPLACE_CRASH_MATRIX").is_ok_and(|v| v == "long");
    let minimum: usize = std::env::var("INPLACE_CRASH_MATRIX_MIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut bed = boot(Kubelet::Real, None).await;
    let started = Instant::now();
    let rounds = if long { 3 } else { 1 };
    for _ in 0..rounds {
        for point in UPDATE_POINTS {
            bed.case(Kill::Point(point), true).await;
        }
        for point in ROLLBACK_POINTS {
            bed.case(Kill::Point(point), false).await;
        }
    }
    let randoms = if long {
        minimum.saturating_sub(bed.injected)
    } else {
        2
    };
    for i in 0..randoms {
        let delay = Duration::from_millis(rand::random_range(0..4000));
        bed.case(Kill::After(delay), i % 3 != 2).await;
    }
    eprintln!(
        "crash matrix: {} injected crashes ({} cases) in {:?}",
        bed.injected,
        bed.cases,
        started.elapsed()
    );
    if long {
        assert!(bed.injected >= minimum);
    }
    bed.real.node.poweroff().await.unwrap();
}

/// Where the power goes around a reboot activation, and whether the revision is healthy
/// (else its kubelet cannot start, and the boot into it is rolled back by a reboot).
const REBOOT_CUTS: &[(Cut, bool)] = &[
    // Journaled `Rebooting`, logind not asked yet: the power cut is the reboot.
    (Cut::Point("reboot.journaled"), true),
    // logind accepted the reboot; the node has not gone down yet.
    (Cut::RebootAsked, true),
    // Booted into the revision: `Verifying` journaled, nothing checked yet.
    (Cut::NextBoot("reboot.booted"), true),
    // Checked for the whole window, not committed yet.
    (Cut::NextBoot("commit.before"), true),
    // The boot failed its checks: links put back, `RebootingBack` journaled, logind not
    // asked yet.
    (Cut::NextBoot("rollback.reboot_journaled"), false),
];

/// docs/usage/reboot-updates.md § What is journaled: a power cut at every step around a
/// reboot activation ends on one whole revision, committed or rolled back, and the plan
/// says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cut_at_every_step_around_a_reboot_ends_committed_or_rolled_back() {
    let mut bed = boot(Kubelet::Real, None).await;
    bed.prepare_reboots().await;
    let started = Instant::now();
    for (cut, healthy) in REBOOT_CUTS {
        bed.reboot_case(*cut, *healthy).await;
    }
    eprintln!(
        "reboot power cuts: {} cases in {:?}",
        bed.injected,
        started.elapsed()
    );
    bed.real.node.poweroff().await.unwrap();
}

fn real_server(bed: &Bed) -> &inplace_tests::apiserver::ApiServer {
    bed.real.test_api.real().expect("the real server")
}

fn faults(bed: &Bed) -> &inplace_api_emulator::Faults {
    bed.real.test_api.emulator().expect("the emulator").faults()
}

/// A plan of `bed` whose health window is `window` (to land a kill in `Verifying`).
fn with_window(plan: NodeUpdatePlan, window: &str) -> NodeUpdatePlan {
    let mut value = serde_json::to_value(plan).unwrap();
    value["spec"]["healthChecks"]["window"] = window.into();
    serde_json::from_value(value).unwrap()
}

/// faults.md § Crashes: "API server unreachable for minutes ... keep the node safe from the
/// local journal ... report within seconds of recovery", with the real kube-apiserver
/// killed (SIGKILL) in the middle of an update (in its health window) and held down for a
/// minute: the node finishes the update from its journal alone, and once the server is back
/// (same port, etcd kept the data) the agent reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_killed_mid_update_on_a_real_node() {
    let api = TestApi::start().await.expect("the API server starts");
    let mut bed = boot(Kubelet::StandIn, Some(api)).await;

    bed.cases += 1;
    let tag = format!("c{}", bed.cases);
    bed.publish(&tag, true).await;
    let plan = with_window(bed.plan(&tag, true), "10s");
    let revision = inplace_proto::revision_of(&plan.spec.content);
    bed.real.apply(&plan).await;
    bed.real
        .wait_final(Phase::Verifying, &revision, "verifying before the outage")
        .await;
    real_server(&bed).kill_apiserver().unwrap();
    let killed = Instant::now();
    eprintln!("kube-apiserver killed while the node verifies {revision}");

    // The node finishes the update from its journal while the API is gone.
    let expected = format!("/opt/extensions/kubernetes/kubernetes-{tag}.raw");
    let deadline = Instant::now() + real_node::PATIENCE;
    loop {
        let link = bed
            .real
            .node
            .exec_ok(&["readlink", "/etc/extensions/kubernetes.raw"])
            .await
            .unwrap();
        let journal: serde_json::Value = bed
            .real
            .node
            .read_file("/var/lib/inplace/journal.json")
            .await
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if link.trim() == expected
            && bed.real.node.is_active("kubelet.service").await.unwrap()
            && journal["committed"]["revision"].as_str() == Some(revision.as_str())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the update did not finish during the outage: link {link}\n{}",
            bed.real
                .node
                .journal("inplace-agent.service", 60)
                .await
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Down for a minute in all (standing for minutes): the status writer and the watch are
    // deep in their backoff when it returns.
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(killed.elapsed())).await;
    let still_down = bed.real.api.get(bed.real.node.name()).await;
    assert!(still_down.is_err(), "the server is down: {still_down:?}");
    real_server(&bed).resume().unwrap();
    let resumed = Instant::now();
    bed.real
        .wait_final(Phase::Succeeded, &revision, "after the outage")
        .await;
    // Reported, not asserted: the restart itself takes seconds to tens of seconds here.
    eprintln!(
        "status caught up {:?} after kube-apiserver was let up again",
        resumed.elapsed()
    );
    let previous = bed.committed.0.clone();
    bed.committed = (tag.clone(), revision.clone());
    bed.check_invariant(&tag, &revision, &previous, "outage")
        .await;
    bed.real.node.poweroff().await.unwrap();
}

/// faults.md § Crashes: "watch ends with 410 Gone; 409 on status write — relist, re-apply
/// status", on a real node. On the emulator: a real server answers 409 only to a write that
/// really raced another and 410 only after etcd compacted past the watch's resourceVersion,
/// so neither a storm of 409s nor a cut watch resumed into 410 can be made to happen at a
/// chosen moment there (`conflict_next_writes`, `gone_next_watches`, `cut_watches`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_storm_and_gone_watch_on_a_real_node() {
    let emulator = TestApi::start_emulator(EmulatorConfig {
        authz: AuthzMode::Rbac,
        ..EmulatorConfig::default()
    })
    .await
    .unwrap();
    let mut bed = boot(Kubelet::StandIn, Some(emulator)).await;

    // A 409 storm on status writes, the watch cut and told 410 Gone: the next update is
    // seen (relist), applied and reported.
    faults(&bed).gone_next_watches(2);
    faults(&bed).cut_watches();
    bed.cases += 1;
    let tag = format!("c{}", bed.cases);
    bed.publish(&tag, true).await;
    let plan = bed.plan(&tag, true);
    let revision = inplace_proto::revision_of(&plan.spec.content);
    bed.real.apply(&plan).await;
    // The next 8 writes conflict (the agent's status writes; with backoff capped at 5 s
    // that is about 20 s of 409s).
    faults(&bed).conflict_next_writes(8);
    bed.real
        .wait_final(Phase::Succeeded, &revision, "after 409s and 410")
        .await;
    let previous = bed.committed.0.clone();
    bed.committed = (tag.clone(), revision.clone());
    bed.check_invariant(&tag, &revision, &previous, "409 storm")
        .await;
    bed.real.node.poweroff().await.unwrap();
}
