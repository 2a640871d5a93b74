//! The whole per-revision flow against fake edges (fetcher, systemd, probes, status) and a
//! real file system in a temporary directory (see `common/mod.rs`).

use crate::common;

use std::sync::atomic::Ordering;

use common::Bed;
use inplace_agent::journal::Step;
use inplace_proto::{
    Architecture, ArchitectureBuild, Artifact, DesiredState, NodeUpdatePlan, Phase,
};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

#[tokio::test]
async fn first_install_succeeds() {
    let bed = Bed::new();
    let plan = bed.plan("OK v1", "kubectl v1", "Active");
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(
        bed.phases(),
        vec![
            Phase::Downloading,
            Phase::Activating,
            Phase::Verifying,
            Phase::Succeeded
        ]
    );
    let status = bed.last();
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert_eq!(status.current_revision.as_deref(), Some(revision.as_str()));
    assert_eq!(status.target_revision.as_deref(), Some(revision.as_str()));
    assert_eq!(status.attempts, Some(1));
    assert_eq!(status.observed_generation, Some(1));
    assert!(status.finished_at.is_some());
    assert_eq!(status.artifacts[0].bytes_done, 5);
    assert_eq!(bed.ready().0, "True");
    assert!(
        bed.ready().2.ends_with("the node reports kubelet v1.31.2"),
        "{:?}",
        bed.ready()
    );
    assert_eq!(bed.degraded(), ("False".into(), "AsExpected".into()));
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    assert_eq!(
        *bed.systemd.calls.lock().unwrap(),
        vec![
            "refresh extensions",
            "daemon-reload",
            "restart kubelet.service"
        ]
    );
    // The same plan again: nothing to do.
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
}

#[tokio::test]
async fn upgrades_keep_the_previous_revision_and_collect_older_ones() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let v1_target =
        std::fs::read_link(bed.settings.paths.extensions_dir.join("kubernetes.raw")).unwrap();
    agent
        .handle(Some(&bed.plan("OK v2", "kubectl v2", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.link(), "OK v2");
    assert!(v1_target.exists(), "the previous revision stays on disk");
    let journal = agent.journal();
    assert!(journal.previous().is_some());
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.link(), "OK v3");
    assert_eq!(bed.kubectl(), "kubectl v3");
    assert!(
        !v1_target.exists(),
        "revisions older than the previous one are collected"
    );
}

#[tokio::test]
async fn staged_only_leaves_the_running_revision_untouched() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    bed.systemd.calls.lock().unwrap().clear();
    let plan = bed.plan("OK v2", "kubectl v2", "Staged");
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Staged));
    assert_eq!(bed.ready().0, "True");
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    assert!(bed.systemd.calls.lock().unwrap().is_empty());
    assert_eq!(agent.journal().in_flight().unwrap().step(), Step::Staged);
    // Then activation reuses the staged files without downloading again.
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    agent
        .handle(Some(&bed.plan("OK v2", "kubectl v2", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(bed.link(), "OK v2");
}

async fn rolls_back(image: &str, reason: &str) {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let plan = bed.plan(image, "kubectl v2", "Active");
    agent.handle(Some(&plan)).await.unwrap();
    let phases = bed.phases();
    assert_eq!(phases.last(), Some(&Phase::RolledBack), "{phases:?}");
    assert!(phases.contains(&Phase::RollingBack));
    let (status, r, message) = bed.ready();
    assert_eq!((status.as_str(), r.as_str()), ("False", "RolledBack"));
    assert!(
        message.contains(reason),
        "{message} should mention {reason}"
    );
    assert_eq!(bed.link(), "OK v1", "the old image is linked again");
    assert_eq!(bed.kubectl(), "kubectl v1");
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert_eq!(bed.last().failed_revisions, vec![revision]);
    // Not retried: the same plan is denied without any download.
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
    // The status keeps saying what happened (rolled back), and that it is not retried.
    let (_, r, message) = bed.ready();
    assert_eq!(r, "RolledBack");
    assert!(message.contains("not retried"), "{message}");
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    // A new revision goes ahead.
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert!(bed.last().failed_revisions.is_empty());
}

#[tokio::test]
async fn unit_restart_failure_rolls_back() {
    rolls_back("OK v2 restart-fails", "UnitFailed").await;
}

/// Issue 18 item 9: the first update from each state systemd-sysext can be in on a real
/// node — nothing merged, merged by hand with `systemd-sysext refresh` (the unit inactive:
/// restarting it fails "already merged" on systemd 252), merged by the unit at boot —
/// commits v2 and rolls back a failing v3, never degrading the node.
#[tokio::test]
async fn first_update_commits_and_rolls_back_from_every_sysext_state() {
    for state in ["nothing merged", "merged by hand", "merged by the unit"] {
        let bed = Bed::new();
        if state != "nothing merged" {
            // kubelet v0 installed as flatcar.md says: stored, linked, merged.
            let image = bed.root().join("opt/extensions/kubernetes/v0.raw");
            std::fs::create_dir_all(image.parent().unwrap()).unwrap();
            std::fs::create_dir_all(&bed.settings.paths.extensions_dir).unwrap();
            std::fs::write(&image, "OK v0").unwrap();
            std::os::unix::fs::symlink(
                &image,
                bed.settings.paths.extensions_dir.join("kubernetes.raw"),
            )
            .unwrap();
            bed.systemd.refresh_by_hand();
            if state == "merged by the unit" {
                bed.systemd.sysext_active.store(true, Ordering::SeqCst);
            }
            assert!(bed.systemd.merged(), "{state}");
        }
        let mut agent = bed.agent().await;
        agent
            .handle(Some(&bed.plan("OK v2", "kubectl v2", "Active")))
            .await
            .unwrap();
        assert_eq!(
            bed.last().phase,
            Some(Phase::Succeeded),
            "{state}: {:?}",
            bed.ready()
        );
        assert_eq!(bed.link(), "OK v2", "{state}");
        agent
            .handle(Some(&bed.plan("OK v3 unhealthy", "kubectl v3", "Active")))
            .await
            .unwrap();
        assert_eq!(
            bed.last().phase,
            Some(Phase::RolledBack),
            "{state}: {:?}",
            bed.ready()
        );
        assert_eq!(
            bed.degraded(),
            ("False".into(), "AsExpected".into()),
            "{state}"
        );
        assert_eq!(bed.link(), "OK v2", "{state}");
        assert!(bed.systemd.merged(), "{state}: v2 merged again");
    }
}

/// Issue 18 item 5: a plan that restarts the kubelet without checking the version the
/// node reports says so in its status.
#[tokio::test]
async fn a_commit_says_when_the_kubelet_version_was_not_checked() {
    let bed = Bed::new();
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.spec.content.health_checks.node_kubelet_version = false;
    bed.agent().await.handle(Some(&plan)).await.unwrap();
    let (status, reason, message) = bed.ready();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Succeeded"));
    assert!(
        message
            .ends_with("kubelet version not checked: healthChecks.nodeKubeletVersion is not set"),
        "{message}"
    );
}

/// `nodeReady` with `nodeKubeletVersion`: the commit says the new kubelet reported the Node
/// Ready.
#[tokio::test]
async fn a_commit_says_the_node_reports_ready() {
    let bed = Bed::new();
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.spec.content.health_checks.node_ready = true;
    bed.agent().await.handle(Some(&plan)).await.unwrap();
    let (status, reason, message) = bed.ready();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Succeeded"));
    assert!(
        message.ends_with("the node reports kubelet v1.31.2 and Ready"),
        "{message}"
    );
}

/// `nodeReady`: a kubelet that runs but never gets the Node Ready is rolled back when the
/// timeout runs out, and the status names the Ready condition's status, reason and message.
#[tokio::test]
async fn a_node_that_never_gets_ready_rolls_back() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let mut plan = bed.plan("OK v2 not-ready", "kubectl v2", "Active");
    plan.spec.content.health_checks.node_ready = true;
    plan.spec.content.health_checks.timeout = "200ms".parse().unwrap();
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    let (status, reason, message) = bed.ready();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "RolledBack"));
    assert!(
        message.contains(
            "the Node is not Ready (False, KubeletNotReady: container runtime network not ready)"
        ),
        "{message}"
    );
    assert_eq!(bed.link(), "OK v1", "the old image is linked again");
}

/// Issue 18 item 5: a restart job that ends `done` without starting the unit (a
/// `Condition…=` not met) is no proof the new revision runs: the activation fails with
/// `UnitFailed` naming the unit and rolls back — even for a plan with no health checks.
#[tokio::test]
async fn a_unit_that_does_not_start_after_its_restart_fails_the_activation() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let mut plan = bed.plan("OK v2 no-start", "kubectl v2", "Active");
    plan.spec.content.health_checks = serde_json::from_value(serde_json::json!({})).unwrap();
    let before = bed.phases().len();
    agent.handle(Some(&plan)).await.unwrap();
    let phases = bed.phases().split_off(before);
    assert_eq!(phases.last(), Some(&Phase::RolledBack), "{phases:?}");
    assert!(!phases.contains(&Phase::Succeeded), "{phases:?}");
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "RolledBack");
    assert!(
        message.contains("UnitFailed") && message.contains("kubelet.service did not start"),
        "{message}"
    );
    assert_eq!(bed.link(), "OK v1");
}

#[tokio::test]
async fn health_failure_rolls_back() {
    rolls_back("OK v2 unhealthy", "HealthCheckFailed").await;
}

#[tokio::test]
async fn extension_not_merged_rolls_back() {
    rolls_back("OK v2 incompatible", "ExtensionNotMerged").await;
}

#[tokio::test]
async fn failed_rollback_degrades_the_node_and_stops() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    // v2's health check fails, and then nothing can be restarted any more.
    let plan = bed.plan("OK v2 unhealthy", "kubectl v2", "Active");
    let systemd = bed.systemd.clone();
    let watcher = tokio::spawn(async move {
        while systemd.restarts.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        systemd.broken.store(true, Ordering::SeqCst);
    });
    agent.handle(Some(&plan)).await.unwrap();
    watcher.await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Failed));
    assert_eq!(bed.degraded(), ("True".into(), "RollbackFailed".into()));
    assert_eq!(bed.ready().1, "RollbackFailed");
    // No further automatic action, whatever the plan says.
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
    assert_eq!(bed.degraded().0, "True");
    // Also after a restart.
    let mut agent = bed.agent().await;
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.degraded().0, "True");
}

#[tokio::test]
async fn hash_mismatch_fails_without_touching_anything() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let mut plan = bed.plan("OK v2", "kubectl v2", "Active");
    plan.spec.content.artifacts[1].sha256 = "ab".repeat(32);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Failed));
    assert_eq!(bed.ready().1, "HashMismatch");
    assert!(bed.ready().2.contains("kubectl"));
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    // The v2 image staged before the failure is gone again; v1's stays.
    let images: Vec<_> = std::fs::read_dir(bed.settings.paths.images_dir.join("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(images.len(), 1, "{images:?}");
    assert!(agent.journal().in_flight().is_none());
}

#[tokio::test]
async fn download_404_is_permanent_and_named() {
    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.spec.content.artifacts[0].url = "https://dl.example/missing/kubernetes.raw".into();
    agent.handle(Some(&plan)).await.unwrap();
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "DownloadFailed");
    assert!(
        message.contains("404") && message.contains("kubernetes"),
        "{message}"
    );
}

#[tokio::test]
async fn invalid_and_denied_plans_are_refused_before_any_io() {
    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.spec.content.artifacts[0].sha256 = "XYZ".into();
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.ready().1, "InvalidPlan");
    assert!(bed.ready().2.contains("spec.artifacts[0].sha256"));
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.spec.content.artifacts[1].path = Some("/usr/bin/kubectl".into());
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.ready().1, "PolicyDenied");
    assert!(bed.ready().2.contains("spec.artifacts[1].path"));
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), 0);
    assert!(!bed.settings.state_dir.join("store").exists());
}

/// A release for a mixed fleet: the image's first build is for another architecture, this
/// node's is among `otherArchitectures`. The node downloads and installs its own build, and
/// never the other; the revision stays the release's. A release with no build for this
/// node's architecture is refused before any download, naming the artifact.
#[tokio::test]
async fn a_node_installs_the_build_for_its_architecture_and_refuses_a_release_without_one() {
    let this = Architecture::of_this_build().expect("a Kubernetes architecture");
    let other = if this == Architecture::Arm64 {
        Architecture::Amd64
    } else {
        Architecture::Arm64
    };
    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    let image = plan.spec.content.artifacts[0].clone();
    let own_build = ArchitectureBuild {
        architecture: this,
        url: image.url.clone(),
        sha256: image.sha256.clone(),
        size: image.size,
        signature_url: None,
    };
    let other_url = "https://dl.example/other-architecture/kubernetes.raw";
    plan.spec.content.artifacts[0] = Artifact {
        url: other_url.into(),
        sha256: "0".repeat(64),
        architecture: Some(other),
        other_architectures: vec![own_build],
        ..image
    };
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(
        bed.last().phase,
        Some(Phase::Succeeded),
        "{:?}",
        bed.ready()
    );
    assert_eq!(bed.link(), "OK v1");
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert_eq!(bed.last().current_revision, Some(revision));

    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let mut plan = bed.plan("OK v2", "kubectl v2", "Active");
    plan.spec.content.artifacts[0].architecture = Some(other);
    agent.handle(Some(&plan)).await.unwrap();
    let (status, reason, message) = bed.ready();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ArchitectureUnsupported")
    );
    assert!(
        message.contains(&format!(
            "spec.artifacts[0]: artifact kubernetes has no build for this node's architecture {this} (it has {other})"
        )),
        "{message}"
    );
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), 0);
}

/// `<root>/opt/bin/sub` is a symlink to a directory the agent may write (`<root>/etc`
/// here; on a node `/etc/extensions` or its own state would do): a plan putting a binary
/// at `<root>/opt/bin/sub/kubectl` is refused naming both paths, before any download, and
/// nothing appears where the symlink points.
#[tokio::test]
async fn a_target_reached_through_a_symlinked_subdirectory_is_refused() {
    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let elsewhere = bed.root().join("etc");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::create_dir_all(bed.root().join("opt/bin")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, bed.root().join("opt/bin/sub")).unwrap();
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    let target = bed.root().join("opt/bin/sub/kubectl");
    plan.spec.content.artifacts[1].path = Some(target.display().to_string());
    agent.handle(Some(&plan)).await.unwrap();
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "TargetThroughSymlink", "{message}");
    for name in [
        "spec.artifacts[1].path".to_owned(),
        target.display().to_string(),
        bed.root().join("opt/bin/sub").display().to_string(),
    ] {
        assert!(message.contains(&name), "{name} not in {message}");
    }
    assert_eq!(bed.last().phase, Some(Phase::Failed));
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), 0);
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

#[tokio::test]
async fn plan_for_another_node_is_ignored() {
    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.metadata.name = Some("worker-2".into());
    plan.spec.node_name = "worker-2".into();
    agent.handle(Some(&plan)).await.unwrap();
    assert!(bed.status.last().is_none());
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), 0);
}

/// Applies `plan` with kubelet's restart hanging and drops the agent mid-step: "kill -9"
/// during activation, after the links were switched.
async fn killed_while_kubelet_restarts(bed: &Bed, plan: &NodeUpdatePlan) {
    bed.systemd.hang.store(true, Ordering::SeqCst);
    let mut agent = bed.agent().await;
    until_hung(agent.handle(Some(plan)), &bed.systemd.hung).await;
    drop(agent);
    bed.systemd.hang.store(false, Ordering::SeqCst);
}

/// Runs `work` until `hung` says it reached the step that hangs, and no longer: the caller
/// then drops the agent ("kill -9" at that step). Told by the fake, not guessed from a
/// time, which a loaded machine can outlast before the step is reached.
async fn until_hung<F>(work: F, hung: &Notify)
where
    F: std::future::Future,
    F::Output: std::fmt::Debug,
{
    tokio::select! {
        ended = work => panic!("the agent ended ({ended:?}) before the step that hangs"),
        () = hung.notified() => {}
    }
}

#[tokio::test]
async fn crash_during_activation_resumes_on_restart() {
    let bed = Bed::new();
    drop(bed.with_v1().await);
    let plan = bed.plan("OK v2", "kubectl v2", "Active");
    killed_while_kubelet_restarts(&bed, &plan).await;
    assert_eq!(bed.link(), "OK v2", "the swap happened before the crash");
    let mut agent = bed.agent().await;
    assert_eq!(
        agent.journal().in_flight().unwrap().step(),
        Step::Activating
    );
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(
        bed.last().attempts,
        Some(2),
        "the interrupted attempt counts"
    );
    assert_eq!(bed.link(), "OK v2");
}

#[tokio::test]
async fn crash_loop_during_activation_rolls_back_and_stops() {
    let bed = Bed::new();
    drop(bed.with_v1().await);
    let plan = bed.plan("OK v2", "kubectl v2", "Active");
    for _ in 0..3 {
        killed_while_kubelet_restarts(&bed, &plan).await;
    }
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert!(
        bed.ready().2.contains("TooManyAttempts"),
        "{}",
        bed.ready().2
    );
    assert_eq!(bed.link(), "OK v1");
}

#[tokio::test]
async fn plan_deleted_mid_activation_ends_on_the_committed_revision() {
    let bed = Bed::new();
    drop(bed.with_v1().await);
    let plan = bed.plan("OK v2", "kubectl v2", "Active");
    killed_while_kubelet_restarts(&bed, &plan).await;
    let mut agent = bed.agent().await;
    agent.handle(None).await.unwrap();
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    assert!(agent.journal().in_flight().is_none());
    // Superseded, not failed: the revision is not denied.
    assert!(agent.journal().failed().is_empty());
}

#[tokio::test]
async fn first_install_over_a_plain_file_restores_it_on_rollback() {
    let bed = Bed::new();
    let bin = bed.root().join("opt/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("kubectl"), "distro kubectl").unwrap();
    let mut agent = bed.agent().await;
    agent
        .handle(Some(&bed.plan("OK v1 unhealthy", "kubectl v1", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(bed.kubectl(), "distro kubectl");
    let meta = std::fs::symlink_metadata(bin.join("kubectl")).unwrap();
    assert!(meta.is_file());
    assert!(
        !bed.settings
            .paths
            .extensions_dir
            .join("kubernetes.raw")
            .exists()
    );
}

#[tokio::test]
async fn plan_changed_during_a_download_stops_it_and_stages_the_new_one() {
    let bed = Bed::new();
    let mut stuck = bed.plan("OK v1", "kubectl v1", "Active");
    stuck.spec.content.artifacts[0].url = "https://dl.example/hang/kubernetes.raw".into();
    let (tx, rx) = tokio::sync::watch::channel(Some(Some(stuck)));
    let mut agent = bed.agent().await;
    let follow = tokio::spawn(async move {
        agent.follow(rx).await.unwrap();
        agent
    });
    // Wait until the stuck download started.
    let images = bed.settings.paths.images_dir.join("kubernetes");
    while !images.join(".kubernetes.hang.partial").exists() {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let wanted = bed.plan("OK v2", "kubectl v2", "Active");
    tx.send_replace(Some(Some(wanted.clone())));
    let revision = inplace_proto::revision_of(&wanted.spec.content);
    while bed.status.last().and_then(|s| s.current_revision) != Some(revision.clone()) {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    drop(tx);
    let agent = follow.await.unwrap();
    assert_eq!(bed.link(), "OK v2");
    assert!(
        !images.join(".kubernetes.hang.partial").exists(),
        "the abandoned download is cleaned up"
    );
    assert!(
        agent.journal().failed().is_empty(),
        "a superseded revision is not denied"
    );
}

#[tokio::test]
async fn crash_during_download_changes_nothing_and_restages_on_restart() {
    let bed = Bed::new();
    drop(bed.with_v1().await);
    let plan = bed.plan("OK v2", "kubectl v2", "Active");
    bed.fetcher.hang.store(true, Ordering::SeqCst);
    {
        let mut agent = bed.agent().await;
        until_hung(agent.handle(Some(&plan)), &bed.fetcher.hung).await;
    }
    // "kill -9" mid-download: nothing visible changed.
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    let partial = bed
        .settings
        .paths
        .images_dir
        .join("kubernetes/.kubernetes.hang.partial");
    assert!(partial.exists());
    bed.fetcher.hang.store(false, Ordering::SeqCst);
    let mut agent = bed.agent().await;
    assert_eq!(agent.journal().in_flight().unwrap().step(), Step::Staging);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(bed.link(), "OK v2");
    assert!(
        !partial.exists(),
        "the interrupted download's leftovers are swept"
    );
}

#[tokio::test]
async fn crash_during_rollback_finishes_it_on_restart_whatever_the_plan() {
    let bed = Bed::new();
    drop(bed.with_v1().await);
    let plan = bed.plan("OK v2 unhealthy", "kubectl v2", "Active");
    let before = bed.systemd.restarts.load(Ordering::SeqCst);
    {
        let mut agent = bed.agent().await;
        let systemd = bed.systemd.clone();
        // Once v2's kubelet restarted (and fails its check), the rollback's restart hangs.
        let arm = tokio::spawn(async move {
            while systemd.restarts.load(Ordering::SeqCst) <= before {
                tokio::task::yield_now().await;
            }
            systemd.hang.store(true, Ordering::SeqCst);
        });
        until_hung(agent.handle(Some(&plan)), &bed.systemd.hung).await;
        arm.await.unwrap();
    }
    let journal = bed.agent().await.journal().clone();
    assert_eq!(journal.in_flight().unwrap().step(), Step::RollingBack);
    bed.systemd.hang.store(false, Ordering::SeqCst);
    // The plan was deleted meanwhile: the rollback is still finished.
    let mut agent = bed.agent().await;
    agent.handle(None).await.unwrap();
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    assert!(agent.journal().in_flight().is_none());
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert!(
        agent.journal().failure_of(&revision).is_some(),
        "the failed revision is denied"
    );
    // The finishing pass had no plan to report to; when the plan is seen again the status
    // says the revision was rolled back (not merely "denied").
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(bed.ready().1, "RolledBack");
    assert_eq!(bed.link(), "OK v1");
}

#[tokio::test]
async fn drift_is_reported_degraded_naming_the_path_and_clears_when_repaired() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let plan = bed.plan("OK v1", "kubectl v1", "Active");
    let kubectl = bed.root().join("opt/bin/kubectl");
    let target = std::fs::read_link(&kubectl).unwrap();
    // Someone points the managed binary elsewhere.
    let elsewhere = bed.root().join("elsewhere");
    std::fs::write(&elsewhere, "#!/bin/sh\necho not ours\n").unwrap();
    std::fs::remove_file(&kubectl).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &kubectl).unwrap();
    agent.handle(Some(&plan)).await.unwrap();
    let status = bed.last();
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "Drifted")
    );
    assert!(
        degraded.message.contains(&kubectl.display().to_string())
            && degraded.message.contains("elsewhere"),
        "{}",
        degraded.message
    );
    // Report only: the host is left as it is.
    assert_eq!(std::fs::read_link(&kubectl).unwrap(), elsewhere);
    // Put back: no longer degraded.
    std::fs::remove_file(&kubectl).unwrap();
    std::os::unix::fs::symlink(&target, &kubectl).unwrap();
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(
        bed.degraded(),
        ("False".to_owned(), "AsExpected".to_owned())
    );
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
}

const ARCHIVE_URL: &str = "https://dl.example/tools/crictl.tar.gz";

/// `plan` with a third artifact: a tar.gz (served at [`ARCHIVE_URL`]) holding `crictl`
/// (`crictl` bytes) and a README; only `crictl` is installed, at `<root>/opt/bin/crictl`.
fn with_archive(bed: &Bed, plan: NodeUpdatePlan, crictl: &str) -> NodeUpdatePlan {
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (name, bytes, mode) in [("crictl", crictl, 0o755), ("README.md", "docs", 0o644)] {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(mode);
        header.set_cksum();
        tar.append_data(&mut header, name, bytes.as_bytes())
            .unwrap();
    }
    let archive = tar.into_inner().unwrap().finish().unwrap();
    with_archive_bytes(bed, plan, archive)
}

/// `plan` with a third artifact: the tar.gz `archive` (served at [`ARCHIVE_URL`]) of which
/// the member `crictl` is installed at `<root>/opt/bin/crictl`.
fn with_archive_bytes(bed: &Bed, mut plan: NodeUpdatePlan, archive: Vec<u8>) -> NodeUpdatePlan {
    let artifact = serde_json::json!({
        "name": "crictl", "type": "Archive", "url": ARCHIVE_URL,
        "sha256": hex::encode(Sha256::digest(&archive)), "size": archive.len(),
        "members": [{"from": "crictl",
                     "to": format!("{}/opt/bin/crictl", bed.root().display())}],
    });
    bed.fetcher
        .objects
        .lock()
        .unwrap()
        .insert(ARCHIVE_URL.to_owned(), archive);
    plan.spec
        .content
        .artifacts
        .push(serde_json::from_value(artifact).unwrap());
    plan
}

fn crictl(bed: &Bed) -> String {
    std::fs::read_to_string(bed.root().join("opt/bin/crictl")).unwrap_or_default()
}

#[tokio::test]
async fn staged_archive_members_are_reused_on_activation() {
    let bed = Bed::new();
    drop(bed.with_v1().await);
    let staged = with_archive(&bed, bed.plan("OK v2", "kubectl v2", "Staged"), "crictl v2");
    let mut agent = bed.agent().await;
    agent.handle(Some(&staged)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Staged));
    assert_eq!(crictl(&bed), "", "staging links nothing");
    // The agent restarts and the archive is gone from the server: activation must take
    // the members staged before, not download the archive again.
    drop(agent);
    bed.fetcher.objects.lock().unwrap().remove(ARCHIVE_URL);
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    let mut active = staged.clone();
    active.spec.desired_state = DesiredState::Active;
    let mut agent = bed.agent().await;
    agent.handle(Some(&active)).await.unwrap();
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
    assert_eq!(
        bed.last().phase,
        Some(Phase::Succeeded),
        "{:?}",
        bed.ready()
    );
    assert_eq!(crictl(&bed), "crictl v2");
    assert_eq!(bed.kubectl(), "kubectl v2");
    let target = std::fs::read_link(bed.root().join("opt/bin/crictl")).unwrap();
    assert_eq!(
        target,
        bed.settings
            .state_dir
            .join("store/sha256")
            .join(hex::encode(Sha256::digest("crictl v2")))
    );
}

#[tokio::test]
async fn archive_members_are_installed_and_rolled_back_with_their_revision() {
    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let v1 = with_archive(&bed, bed.plan("OK v1", "kubectl v1", "Active"), "crictl v1");
    agent.handle(Some(&v1)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(crictl(&bed), "crictl v1");
    // An unhealthy v2 with a new crictl: rolled back, crictl v1 again.
    let v2 = with_archive(
        &bed,
        bed.plan("OK v2 unhealthy", "kubectl v2", "Active"),
        "crictl v2",
    );
    agent.handle(Some(&v2)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(crictl(&bed), "crictl v1");
    // v3 changes only the image: the committed archive's member is reused, no download.
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    let v3 = with_archive(&bed, bed.plan("OK v3", "kubectl v1", "Active"), "crictl v1");
    bed.fetcher.objects.lock().unwrap().remove(ARCHIVE_URL);
    agent.handle(Some(&v3)).await.unwrap();
    assert_eq!(
        bed.last().phase,
        Some(Phase::Succeeded),
        "{:?}",
        bed.ready()
    );
    assert_eq!(
        bed.fetcher.calls.load(Ordering::SeqCst),
        fetches + 1,
        "only the new image is downloaded"
    );
    assert_eq!(crictl(&bed), "crictl v1");
}

/// `plan` with two more artifacts: a `crictl` binary (`crictl` bytes) at
/// `<root>/opt/bin/crictl` and a `tools` sysext image (`tools` bytes).
fn with_crictl_and_tools(
    bed: &Bed,
    mut plan: NodeUpdatePlan,
    crictl: &str,
    tools: &str,
) -> NodeUpdatePlan {
    let crictl_url = format!(
        "https://dl.example/bin/{}/crictl",
        hex::encode(&Sha256::digest(crictl)[..4])
    );
    let tools_url = format!(
        "https://dl.example/tools/{}/tools.raw",
        hex::encode(&Sha256::digest(tools)[..4])
    );
    let mut objects = bed.fetcher.objects.lock().unwrap();
    objects.insert(crictl_url.clone(), crictl.as_bytes().to_vec());
    objects.insert(tools_url.clone(), tools.as_bytes().to_vec());
    for artifact in [
        serde_json::json!({"name": "crictl", "type": "Binary", "url": crictl_url,
                           "sha256": hex::encode(Sha256::digest(crictl)),
                           "path": format!("{}/opt/bin/crictl", bed.root().display())}),
        serde_json::json!({"name": "tools", "type": "Sysext", "url": tools_url,
                           "sha256": hex::encode(Sha256::digest(tools))}),
    ] {
        plan.spec
            .content
            .artifacts
            .push(serde_json::from_value(artifact).unwrap());
    }
    plan
}

fn crictl_link(bed: &Bed) -> std::path::PathBuf {
    bed.root().join("opt/bin/crictl")
}

fn tools_link(bed: &Bed) -> std::path::PathBuf {
    bed.settings.paths.extensions_dir.join("tools.raw")
}

fn tools_merged(bed: &Bed) -> bool {
    inplace_agent::store::extension_release(&bed.settings.paths, "tools").exists()
}

/// Installs v1 with kubectl, crictl and the kubernetes and tools sysexts; returns the agent
/// and where crictl and tools point.
async fn v1_with_crictl_and_tools(
    bed: &Bed,
) -> (
    inplace_agent::update::Agent,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let mut agent = bed.agent().await;
    let v1 = with_crictl_and_tools(
        bed,
        bed.plan("OK v1", "kubectl v1", "Active"),
        "crictl v1",
        "tools v1",
    );
    agent.handle(Some(&v1)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(crictl(bed), "crictl v1");
    assert!(tools_merged(bed));
    let crictl_target = std::fs::read_link(crictl_link(bed)).unwrap();
    let tools_target = std::fs::read_link(tools_link(bed)).unwrap();
    (agent, crictl_target, tools_target)
}

/// Every symlink under `dir` points at an existing file.
fn assert_no_dangling_links(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink()
        {
            assert!(path.exists(), "{} dangles", path.display());
        }
    }
}

#[tokio::test]
async fn a_dropped_binary_and_sysext_are_unlinked_and_nothing_dangles_after_collection() {
    let bed = Bed::new();
    let (mut agent, crictl_v1, tools_v1) = v1_with_crictl_and_tools(&bed).await;
    agent
        .handle(Some(&bed.plan("OK v2", "kubectl v2", "Active")))
        .await
        .unwrap();
    assert_eq!(
        bed.last().phase,
        Some(Phase::Succeeded),
        "{:?}",
        bed.ready()
    );
    assert!(
        std::fs::symlink_metadata(crictl_link(&bed)).is_err(),
        "the dropped binary's link is removed"
    );
    assert!(
        std::fs::symlink_metadata(tools_link(&bed)).is_err(),
        "the dropped extension's link is removed"
    );
    assert!(
        !tools_merged(&bed),
        "the dropped extension is no longer merged"
    );
    assert!(
        crictl_v1.exists() && tools_v1.exists(),
        "the previous revision's files stay on disk"
    );
    assert_eq!(bed.degraded(), ("False".into(), "AsExpected".into()));
    // Two commits later the old files are collected; no link is left pointing at them.
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert!(!crictl_v1.exists() && !tools_v1.exists());
    assert_no_dangling_links(&bed.root().join("opt/bin"));
    assert_no_dangling_links(&bed.settings.paths.extensions_dir);
    assert_eq!(bed.degraded(), ("False".into(), "AsExpected".into()));
}

#[tokio::test]
async fn a_rolled_back_revision_puts_the_dropped_links_back() {
    let bed = Bed::new();
    let (mut agent, crictl_v1, tools_v1) = v1_with_crictl_and_tools(&bed).await;
    agent
        .handle(Some(&bed.plan("OK v2 unhealthy", "kubectl v2", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(std::fs::read_link(crictl_link(&bed)).unwrap(), crictl_v1);
    assert_eq!(std::fs::read_link(tools_link(&bed)).unwrap(), tools_v1);
    assert_eq!(crictl(&bed), "crictl v1");
    assert!(tools_merged(&bed), "the extension is merged again");
    assert_eq!(bed.link(), "OK v1");
}

#[tokio::test]
async fn a_crash_after_removing_a_dropped_link_resumes_and_rolls_back_to_it() {
    let bed = Bed::new();
    let (agent, crictl_v1, _) = v1_with_crictl_and_tools(&bed).await;
    drop(agent);
    let plan = bed.plan("OK v2 unhealthy", "kubectl v2", "Active");
    killed_while_kubelet_restarts(&bed, &plan).await;
    assert!(std::fs::symlink_metadata(crictl_link(&bed)).is_err());
    let mut agent = bed.agent().await;
    assert_eq!(
        agent.journal().in_flight().unwrap().step(),
        Step::Activating
    );
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(std::fs::read_link(crictl_link(&bed)).unwrap(), crictl_v1);
    assert!(tools_merged(&bed));
}

#[tokio::test]
async fn a_file_a_person_put_at_a_dropped_path_is_left_alone() {
    let bed = Bed::new();
    let (mut agent, _, _) = v1_with_crictl_and_tools(&bed).await;
    let path = crictl_link(&bed);
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, "#!/bin/sh\necho hand-made\n").unwrap();
    agent
        .handle(Some(&bed.plan("OK v2", "kubectl v2", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "#!/bin/sh\necho hand-made\n"
    );
    assert!(
        !std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

/// A tar.gz whose one member, `crictl`, is `size` zero bytes: compressed by `gzip`, a few
/// hundred KiB for hundreds of MiB.
fn gzip_bomb(size: u64) -> Vec<u8> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut header = tar::Header::new_gnu();
    header.set_path("crictl").unwrap();
    header.set_size(size);
    header.set_mode(0o755);
    header.set_cksum();
    let mut gzip = Command::new("gzip")
        .arg("-c")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip runs");
    let mut stdin = gzip.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        stdin.write_all(header.as_bytes()).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..size.div_ceil(1 << 20) {
            stdin.write_all(&zeros).unwrap();
        }
        stdin.write_all(&[0u8; 1024]).unwrap(); // the end-of-archive blocks
    });
    let output = gzip.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(output.status.success());
    output.stdout
}

/// A decompression bomb under the shipped limits (the default policy; the plan states no
/// `maxExtractedSize`): a tar.gz of about 0.5 MiB whose member expands to 512 MiB is refused
/// at that member's header. Nothing of it is written or linked. (It wrote all 512 MiB to the
/// node's disk: the limit was 4 × max_artifact_size, 32 GiB.)
#[tokio::test]
async fn a_decompression_bomb_is_refused_under_the_shipped_limits() {
    let bed = Bed::new();
    assert_eq!(
        bed.settings.policy.max_artifact_size,
        8 << 30,
        "shipped default"
    );
    let mut agent = bed.with_v1().await;
    let bomb = gzip_bomb(512 << 20);
    assert!(bomb.len() < 1 << 20, "{} bytes compressed", bomb.len());
    let plan = with_archive_bytes(&bed, bed.plan("OK v2", "kubectl v2", "Active"), bomb);
    agent.handle(Some(&plan)).await.unwrap();

    assert_eq!(bed.last().phase, Some(Phase::Failed));
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "StagingFailed");
    assert!(
        message.contains("artifact crictl")
            && message.contains(
                "member \"crictl\" (536870912 bytes) ends past the limit of 268435456 bytes"
            ),
        "{message}"
    );
    assert_eq!(crictl(&bed), "");
    assert_eq!(bed.link(), "OK v1");
    // Nothing the size of the member is left anywhere under the state directory.
    fn largest(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .map(|e| e.unwrap())
                    .map(|e| match e.file_type().unwrap().is_dir() {
                        true => largest(&e.path()),
                        false => e.metadata().unwrap().len(),
                    })
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    }
    assert!(largest(&bed.settings.state_dir) < 1 << 20);
}

/// Extracting a member may not eat into `policy.reserved_disk_space`: refused as `DiskFull`,
/// naming the member, the directory and the reserve, before a byte of it is written.
#[tokio::test]
async fn an_archive_member_that_would_eat_into_the_disk_reserve_is_refused() {
    let mut bed = Bed::new();
    bed.settings.policy.reserved_disk_space = u64::MAX;
    let mut agent = bed.agent().await;
    let plan = with_archive(&bed, bed.plan("OK v1", "kubectl v1", "Active"), "crictl v1");
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Failed));
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "DiskFull");
    assert!(
        message.contains("member \"crictl\"") && message.contains("reserved"),
        "{message}"
    );
    assert_eq!(crictl(&bed), "");
}
