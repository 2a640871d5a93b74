//! The agent on a node with a newer systemd: Debian trixie, systemd 257 as PID 1
//! (docs/development/test-beds.md § Root filesystem), one boot for everything only a newer
//! systemd has. The kubelet's system extension updates every supported systemd must do (the
//! bookworm test's, shared: [`super::sysext_updates_commit_roll_back_and_stage`]); then the
//! node merges `/usr` writable (mutable system extensions, systemd >= 256) and the agent's
//! swaps and its rollback keep it so, with what was written there; then a site's own
//! configuration extension, left unmerged as an agent stopped in the middle of a swap leaves
//! it, merged again by the next swap; then a configuration
//! extension (`systemd-confext`, systemd >= 254) as a Config artifact, set up as
//! docs/usage/config-artifacts.md says: merged into `/etc`, and one whose kubelet drop-in
//! breaks the kubelet rolled back to the previous image.

use std::path::Path;

use inplace_proto::Phase;
use inplace_tests::docs;
use inplace_tests::nspawn::{NodeOptions, Suite};
use inplace_tests::sysext::SysextBuilder;
use inplace_tests::test_api::TestApi;

use super::{
    CONFEXT, CONFEXT_DROP_IN, CONFEXT_DROP_IN_BROKEN, CONFEXT_DROP_IN_V1, Images, Plans,
    assert_kubelet_runs, assert_status, output, readlink, run, stored_image,
    sysext_updates_commit_roll_back_and_stage,
};
use crate::real_node::AgentNode;

/// The page whose § Configuration extension images the confext case runs as written.
const CONFIG_PAGE: &str = "../docs/usage/config-artifacts.md";

/// A configuration extension the agent does not manage: a site's own, placed by hand.
const SITE_CONFEXT: &str = "site-conf";

/// Where mutable mode keeps what is written into the merged `/usr`.
const MUTABLE_DIR: &str = "/var/lib/extensions.mutable";

/// A file written into the merged `/usr` while it is mutable.
const WRITTEN: &str = "/usr/share/inplace-written-while-mutable";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysext_mutable_sysext_and_confext_on_a_systemd_257_node() {
    let mut options = NodeOptions {
        suite: Suite::Trixie,
        ..NodeOptions::default()
    };
    // Mutable mode's writable layer: the kernel refuses an overlay upper directory on the
    // node's root, itself an overlay (test-beds.md); on a machine it is a plain directory.
    options
        .extra_nspawn_args
        .push(format!("--tmpfs={MUTABLE_DIR}:mode=0755"));
    let test_api = TestApi::start().await.expect("the API server starts");
    let bed = AgentNode::start_booting(test_api, "e2e-trixie", None, options).await;
    let systemd = output(&bed, &["systemctl", "--version"]).await;
    assert!(systemd.starts_with("systemd 257"), "{systemd}");
    let images = Images::for_suite(bed.work.path(), Suite::Trixie).await;
    let plans = Plans {
        bed: &bed,
        images: &images,
    };

    sysext_updates_commit_roll_back_and_stage(&plans).await;
    mutable_usr_stays_mutable_through_an_update_and_a_rollback(&plans).await;
    a_confext_left_unmerged_is_merged_again_by_the_next_swap(&plans).await;
    confext_merges_into_etc_and_a_broken_one_rolls_back(&plans).await;

    bed.node.poweroff().await.unwrap();
}

/// The node's own `systemd-sysext.service` merges mutable (as a node set up for it boots):
/// a file written into `/usr` lands in `/var/lib/extensions.mutable/usr`. The agent's
/// refresh merges in that mode too, so after an update and after a rollback `/usr` is still
/// writable and still holds what was written — where a refresh in systemd's default mode
/// would make it read-only and hide the file until the next boot brings it back over what
/// the agent verified.
async fn mutable_usr_stays_mutable_through_an_update_and_a_rollback(plans: &Plans<'_>) {
    let (bed, images) = (plans.bed, plans.images);
    bed.node
        .write_file(
            "/etc/systemd/system/systemd-sysext.service.d/50-mutable.conf",
            b"[Service]\nEnvironment=SYSTEMD_SYSEXT_MUTABLE_MODE=yes\n",
            0o644,
        )
        .await
        .unwrap();
    bed.node.systemctl(&["daemon-reload"]).await.unwrap();
    bed.node
        .systemctl(&["restart", "systemd-sysext.service"])
        .await
        .unwrap();
    let write = |line: &'static str| async move {
        bed.node
            .sh_ok(&format!("echo {line} >> {WRITTEN} && cat {WRITTEN}"))
            .await
            .unwrap_or_else(|e| panic!("/usr is not writable ({line}): {e}"))
    };
    assert_eq!(write("merged-mutable").await.trim(), "merged-mutable");
    let kept = output(bed, &["cat", &format!("{MUTABLE_DIR}{WRITTEN}")]).await;
    assert_eq!(kept, "merged-mutable", "written into the mutable layer");

    // An update: the new kubelet runs, /usr is still writable, the file still there.
    let v5 = images.healthy("v1.34.0").await;
    let p5 = plans.healthy(vec![plans.sysext("v5", &v5).await]);
    let r5 = run(bed, &p5, Phase::Succeeded, "v5 on a mutable /usr").await;
    assert_kubelet_runs(bed, images, "v1.34.0", "v5 on a mutable /usr").await;
    assert_eq!(
        write("after-update").await.trim(),
        "merged-mutable\nafter-update"
    );

    // A crash-looping kubelet: rolled back to v5, /usr still writable and still holding it.
    let v6 = images.crashing("v1.35.1").await;
    let p6 = plans.failing(vec![plans.sysext("v6", &v6).await]);
    run(bed, &p6, Phase::RolledBack, "v6 on a mutable /usr").await;
    assert_eq!(
        readlink(bed, "/etc/extensions/kubernetes.raw").await,
        stored_image("v1.34.0")
    );
    assert_kubelet_runs(bed, images, "v1.34.0", "after the rollback of v6").await;
    assert_status(bed, "RolledBack RolledBack", &r5).await;
    assert_eq!(
        write("after-rollback").await.trim(),
        "merged-mutable\nafter-update\nafter-rollback"
    );
}

/// Configuration extensions merged read-only over `/etc` keep `/etc/extensions` from being
/// written, so a swap unmerges them and its refresh merges them again. An agent stopped
/// between the two leaves them unmerged, and the plan it resumes may name none of them (a
/// site's own, placed by hand): this is that state, unmerged by hand, and the next swap
/// merges them again.
async fn a_confext_left_unmerged_is_merged_again_by_the_next_swap(plans: &Plans<'_>) {
    let (bed, images) = (plans.bed, plans.images);
    let site = SysextBuilder::confext(SITE_CONFEXT, images.suite)
        .file("etc/inplace-test/site", "site\n", 0o644)
        .build(&images.dir.join(format!("{SITE_CONFEXT}.raw")))
        .await
        .expect("mksquashfs");
    let link = format!("/var/lib/confexts/{SITE_CONFEXT}.raw");
    bed.node
        .write_file(&link, &site.bytes().await.unwrap(), 0o644)
        .await
        .unwrap();
    bed.node.sh_ok("systemd-confext refresh").await.unwrap();
    assert_eq!(
        output(bed, &["cat", "/etc/inplace-test/site"]).await,
        "site"
    );
    bed.node.sh_ok("systemd-confext unmerge").await.unwrap();
    assert!(!bed.node.exists("/etc/inplace-test/site").await.unwrap());

    let kubelet = images.healthy("v1.34.0").await;
    let p7 = plans.healthy(vec![plans.sysext("v7", &kubelet).await]);
    run(
        bed,
        &p7,
        Phase::Succeeded,
        "v7 with a confext left unmerged",
    )
    .await;
    assert_eq!(
        output(bed, &["cat", "/etc/inplace-test/site"]).await,
        "site",
        "the site's configuration extension is merged again"
    );
    // The next case starts without it.
    bed.node
        .sh_ok(&format!("rm {link} && systemd-confext refresh"))
        .await
        .unwrap();
}

/// A configuration extension as a Config artifact, beside the kubelet's system extension:
/// set up as the page says, merged into `/etc` (its release file and files there, its
/// kubelet drop-in loaded); then one whose drop-in keeps the kubelet from starting fails
/// its health checks and is rolled back to the first image, merged again, the kubelet
/// healthy with the first drop-in.
async fn confext_merges_into_etc_and_a_broken_one_rolls_back(plans: &Plans<'_>) {
    let (bed, images) = (plans.bed, plans.images);
    allow_confexts_as_the_page_says(bed).await;
    let kubelet = images.healthy("v1.34.0").await;

    let c1 = images.confext("c1", CONFEXT_DROP_IN_V1).await;
    let p1 = plans.healthy(vec![
        plans.sysext("c1", &kubelet).await,
        plans.confext("c1", &c1).await,
    ]);
    let r1 = run(bed, &p1, Phase::Succeeded, "confext c1").await;
    let link = format!("/var/lib/confexts/{CONFEXT}.raw");
    let c1_stored = readlink(bed, &link).await;
    assert_eq!(
        output(bed, &["sha256sum", &c1_stored]).await[..64],
        c1.sha256
    );
    let release = format!("/etc/extension-release.d/extension-release.{CONFEXT}");
    assert!(bed.node.exists(&release).await.unwrap(), "{release}");
    assert_c1_in_etc(bed).await;
    let environment = output(
        bed,
        &["systemctl", "show", "-p", "Environment", "kubelet.service"],
    )
    .await;
    assert!(environment.contains("CONFEXT=c1"), "{environment}");
    let status = output(bed, &["systemd-confext", "status", "--no-pager"]).await;
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("/etc") && l.contains(CONFEXT)),
        "{status}"
    );
    assert_kubelet_runs(bed, images, "v1.34.0", "confext c1").await;

    // Its drop-in keeps the kubelet from starting: rolled back to c1.
    let broken = images.confext("c2", CONFEXT_DROP_IN_BROKEN).await;
    let p2 = plans.failing(vec![
        plans.sysext("c2", &kubelet).await,
        plans.confext("c2", &broken).await,
    ]);
    run(bed, &p2, Phase::RolledBack, "confext c2").await;
    let (reason, message) = bed.ready().await;
    assert_eq!(reason, "RolledBack");
    assert!(message.contains("HealthCheckFailed"), "{message}");
    assert_eq!(readlink(bed, &link).await, c1_stored);
    assert_c1_in_etc(bed).await;
    assert_kubelet_runs(bed, images, "v1.34.0", "after the rollback of confext c2").await;
    assert_status(bed, "RolledBack RolledBack", &r1).await;
}

/// Writes each file the page's § Configuration extension images shows at the path its first
/// line names, then runs its commands.
async fn allow_confexts_as_the_page_says(bed: &AgentNode) {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join(CONFIG_PAGE);
    let heading = "## Configuration extension images";
    for language in ["toml", "ini"] {
        let block = docs::fenced_block(&page, heading, language).unwrap();
        let path = block.lines().next().and_then(|l| l.strip_prefix("# "));
        let path = path.expect("the block's first line names its file");
        bed.node
            .write_file(path, block.as_bytes(), 0o644)
            .await
            .unwrap();
    }
    let steps = docs::shell_block(&page, heading).unwrap();
    bed.node.sh_ok(&steps).await.unwrap();
}

/// The configuration extension c1's files are what `/etc` shows: its file and its kubelet
/// drop-in.
async fn assert_c1_in_etc(bed: &AgentNode) {
    assert_eq!(
        output(bed, &["cat", "/etc/inplace-test/confext"]).await,
        "c1"
    );
    assert_eq!(
        output(bed, &["cat", CONFEXT_DROP_IN]).await,
        CONFEXT_DROP_IN_V1.trim()
    );
}
