//! Revisions activated by a reboot (`activation.mode: Reboot`), against the fakes of
//! `common/`: the links swapped and the reboot journaled before logind is asked, the boot
//! verified by the agent that starts after it, a failed boot rolled back by a second
//! reboot, inhibitors waited for, a refusal rolled back without one.

use crate::common;

use std::sync::atomic::Ordering;

use common::Bed;
use inplace_agent::journal::Step;
use inplace_proto::{ActivationMode, NodeUpdatePlan, Phase};

/// The bed's plan, activated by a reboot.
fn reboot_plan(bed: &Bed, image: &str, binary: &str) -> NodeUpdatePlan {
    let mut plan = bed.plan(image, binary, "Active");
    plan.spec.content.activation.mode = Some(ActivationMode::Reboot);
    plan
}

fn reasons(bed: &Bed) -> Vec<String> {
    let mut reasons: Vec<String> = Vec::new();
    for s in bed.status.published.lock().unwrap().iter() {
        let reason = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        if reasons.last() != Some(&reason) {
            reasons.push(reason);
        }
    }
    reasons
}

#[tokio::test]
async fn a_reboot_revision_reboots_once_and_is_committed_after_the_boot() {
    let bed = Bed::new();
    let _v1 = bed.with_v1().await;
    bed.systemd.calls.lock().unwrap().clear();
    let plan = reboot_plan(&bed, "OK v2", "kubectl v2");
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();

    // Swapped and journaled, nothing that runs told: the boot does that.
    assert_eq!(bed.power.reboots(), 1);
    assert_eq!(agent.journal().step(), Some(Step::Rebooting));
    let asked = agent.journal().in_flight().unwrap().reboot().unwrap();
    assert_eq!(asked.from_boot, "boot-1");
    assert_eq!(
        (bed.link().as_str(), bed.kubectl().as_str()),
        ("OK v2", "kubectl v2")
    );
    assert!(
        bed.systemd.calls.lock().unwrap().is_empty(),
        "no refresh, no restart"
    );
    assert_eq!(bed.last().phase, Some(Phase::Activating));
    assert!(
        reasons(&bed).contains(&"Rebooting".to_owned()),
        "{:?}",
        reasons(&bed)
    );

    // The agent is stopped as the node goes down; the next boot's agent verifies.
    drop(agent);
    bed.boot();
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert_eq!(agent.journal().current_revision(), Some(revision.as_str()));
    assert_eq!(bed.power.reboots(), 1, "one reboot");
    assert_eq!(bed.last().attempts, Some(1));
    assert!(
        bed.systemd.calls.lock().unwrap().is_empty(),
        "checked, not restarted: {:?}",
        bed.systemd.calls.lock().unwrap()
    );
}

#[tokio::test]
async fn one_reboot_artifact_makes_the_whole_release_reboot_once() {
    let bed = Bed::new();
    let _v1 = bed.with_v1().await;
    bed.systemd.calls.lock().unwrap().clear();
    let mut plan = bed.plan("OK v2", "kubectl v2", "Active");
    plan.spec.content.artifacts[0].activation = Some(ActivationMode::Reboot);
    assert!(plan.spec.content.reboots());
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.power.reboots(), 1);
    assert!(
        bed.systemd.calls.lock().unwrap().is_empty(),
        "kubelet.service (restartUnits) is not restarted before the reboot"
    );
    bed.boot();
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(bed.power.reboots(), 1);
}

#[tokio::test]
async fn a_boot_that_fails_its_checks_reboots_again_into_the_previous_revision() {
    let bed = Bed::new();
    let _v1 = bed.with_v1().await;
    let plan = reboot_plan(&bed, "unhealthy v2", "kubectl v2");
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.power.reboots(), 1);
    bed.boot();

    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    // kubelet fails in the new boot: links back, the reboot back journaled and asked.
    assert_eq!(bed.power.reboots(), 2);
    assert_eq!(agent.journal().step(), Some(Step::RebootingBack));
    let back = agent.journal().in_flight().unwrap();
    assert_eq!(back.reboot().unwrap().from_boot, "boot-2");
    assert_eq!(back.failure().unwrap().reason.as_str(), "HealthCheckFailed");
    assert_eq!(
        (bed.link().as_str(), bed.kubectl().as_str()),
        ("OK v1", "kubectl v1")
    );
    assert_eq!(bed.last().phase, Some(Phase::RollingBack));

    // A restart before the node went down asks again, in the same boot.
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.power.reboots(), 3);
    assert_eq!(agent.journal().step(), Some(Step::RebootingBack));

    // Booted back into v1 (no plan seen yet: finished all the same), verified, denied.
    bed.boot();
    let mut agent = bed.agent().await;
    agent.handle(None).await.unwrap();
    assert!(agent.journal().in_flight().is_none());
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert!(agent.journal().failure_of(&revision).unwrap().rolled_back());
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(bed.power.reboots(), 3);
    assert_eq!(bed.link(), "OK v1");
}

#[tokio::test]
async fn a_restart_before_the_node_went_down_asks_for_the_reboot_again() {
    let bed = Bed::new();
    let _v1 = bed.with_v1().await;
    let plan = reboot_plan(&bed, "OK v2", "kubectl v2");
    bed.power.refuse.store(false, Ordering::SeqCst);
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    // Same boot, whatever the plan says now (the links are swapped and journaled).
    let mut agent = bed.agent().await;
    agent.handle(None).await.unwrap();
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.power.reboots(), 3);
    assert_eq!(agent.journal().step(), Some(Step::Rebooting));
    // Booted, and the plan moved on meanwhile: the boot is rolled back (superseded) by a
    // reboot, then the new plan is acted on after that boot.
    bed.boot();
    let mut agent = bed.agent().await;
    let v3 = bed.plan("OK v3", "kubectl v3", "Active");
    agent.handle(Some(&v3)).await.unwrap();
    assert_eq!(agent.journal().step(), Some(Step::RebootingBack));
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.power.reboots(), 4);
    bed.boot();
    let mut agent = bed.agent().await;
    agent.handle(Some(&v3)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(bed.link(), "OK v3");
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert!(
        agent.journal().failure_of(&revision).is_none(),
        "superseded, not denied"
    );
}

#[tokio::test]
async fn a_blocking_inhibitor_is_waited_for_with_nothing_swapped() {
    let bed = Bed::new();
    let _v1 = bed.with_v1().await;
    bed.power.blocked_looks.store(3, Ordering::SeqCst);
    let plan = reboot_plan(&bed, "OK v2", "kubectl v2");
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    let waited: Vec<_> = bed
        .status
        .published
        .lock()
        .unwrap()
        .iter()
        .filter_map(|s| {
            s.conditions
                .iter()
                .find(|c| c.reason == "RebootInhibited")
                .cloned()
        })
        .collect();
    assert!(!waited.is_empty(), "{:?}", reasons(&bed));
    assert!(
        waited[0]
            .message
            .contains("backup (pid 4242): copying /var/lib/etcd")
            && !waited[0].message.contains("ModemManager"),
        "names the blocking inhibitor only: {}",
        waited[0].message
    );
    assert_eq!(bed.power.reboots(), 1, "after the inhibitor was released");
    assert_eq!(bed.power.blocked_looks.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_refused_reboot_rolls_back_without_one() {
    let bed = Bed::new();
    let _v1 = bed.with_v1().await;
    bed.power.refuse.store(true, Ordering::SeqCst);
    let plan = reboot_plan(&bed, "OK v2", "kubectl v2");
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.power.reboots(), 0);
    assert!(agent.journal().in_flight().is_none());
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "RolledBack");
    assert!(
        message.contains("RebootFailed") && message.contains("Access denied"),
        "{message}"
    );
    assert_eq!(
        (bed.link().as_str(), bed.kubectl().as_str()),
        ("OK v1", "kubectl v1")
    );
}
