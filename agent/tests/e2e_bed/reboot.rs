//! Revisions activated by a reboot (`activation.mode: Reboot`) on a real node: the agent
//! under the shipped unit asks logind, systemd reboots the container (systemd-nspawn ends
//! with status 133 and the bed boots it again, as a machine comes back), the node merges
//! its extensions at boot and starts the kubelet they bring, and the agent of the new boot
//! verifies and commits — or, when the kubelet fails its checks, reboots again into the
//! previous revision and reports `RolledBack`. Both cases run in sequence on one node
//! (three reboots).

use std::time::Duration;

use inplace_proto::Phase;
use inplace_tests::nspawn::NodeOptions;
use inplace_tests::test_api::TestApi;

use super::{
    Images, Plans, assert_kubelet_runs, assert_status, output, readlink, revision, stored_image,
};
use crate::real_node::{AgentNode, by_reboot};

/// How long a node may take to go down and come back on a loaded 2-core machine.
const REBOOT_PATIENCE: Duration = Duration::from_secs(300);

async fn boot_id(bed: &AgentNode) -> String {
    output(bed, &["cat", "/proc/sys/kernel/random/boot_id"]).await
}

/// Waits for the node to reboot by itself and come back; panics with the plan's status.
async fn rebooted(bed: &mut AgentNode, label: &str) {
    if let Err(e) = bed.node.wait_own_reboot(REBOOT_PATIENCE).await {
        panic!("{label}: {e}\n{}", bed.diagnostics().await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_release_commits_after_one_reboot_and_a_failing_one_reboots_back() {
    let mut options = NodeOptions::default();
    inplace_tests::sysext::merge_at_boot(&mut options, &["kubelet.service"]);
    let test_api = TestApi::start().await.expect("the API server starts");
    let mut bed = AgentNode::start_booting(test_api, "e2e-reboot", None, options).await;
    let images = Images::new(bed.work.path()).await;
    let (v2, v3) = (
        images.healthy("v1.32.0").await,
        images.crashing("v1.33.0").await,
    );
    let (p2, p3) = {
        let plans = Plans {
            bed: &bed,
            images: &images,
        };
        let p2 = by_reboot(plans.healthy(vec![plans.sysext("v2", &v2).await]));
        // A crash-looping kubelet is never healthy for the window; the generous timeout
        // keeps the reboot back from starting before the bed has seen the node up.
        let p3 = by_reboot(plans.plan(vec![plans.sysext("v3", &v3).await], "2s", "25s"));
        (p2, p3)
    };

    // v2: one reboot, a new boot, the extension merged at boot, committed.
    let before = boot_id(&bed).await;
    bed.apply(&p2).await;
    rebooted(&mut bed, "into v2").await;
    let booted = boot_id(&bed).await;
    assert_ne!(booted, before, "a reboot brings a new boot ID");
    let r2 = revision(&p2);
    bed.wait_final(Phase::Succeeded, &r2, "v2 by a reboot")
        .await;
    assert_eq!(boot_id(&bed).await, booted, "exactly one reboot");
    assert_eq!(
        bed.node.merged_extensions().await.unwrap(),
        vec!["kubernetes".to_owned()]
    );
    assert_eq!(
        readlink(&bed, "/etc/extensions/kubernetes.raw").await,
        stored_image("v1.32.0")
    );
    assert_kubelet_runs(&bed, &images, "v1.32.0", "v2 after the reboot").await;
    assert_status(&bed, "Succeeded Succeeded", &r2).await;

    // v3 fails its checks after the boot: a second reboot, back into v2.
    bed.apply(&p3).await;
    rebooted(&mut bed, "into v3").await;
    rebooted(&mut bed, "back into v2").await;
    let back = boot_id(&bed).await;
    bed.wait_final(Phase::RolledBack, &revision(&p3), "v3 by a reboot")
        .await;
    assert_eq!(boot_id(&bed).await, back, "no reboot after the one back");
    let (reason, message) = bed.ready().await;
    assert_eq!(reason, "RolledBack", "{message}");
    assert_eq!(
        readlink(&bed, "/etc/extensions/kubernetes.raw").await,
        stored_image("v1.32.0")
    );
    assert_kubelet_runs(&bed, &images, "v1.32.0", "after the reboot back").await;
    assert_status(&bed, "RolledBack RolledBack", &r2).await;

    bed.node.poweroff().await.unwrap();
}
