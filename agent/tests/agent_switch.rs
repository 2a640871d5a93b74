//! An agent update through the coordinator (docs/design/agent-self-update.md, "The
//! protocol"), against the fake edges of `common/mod.rs`: the old agent (A, built as 0.1.0)
//! stages the signed image, journals the switch, keeps its binary, arms the guard and swaps;
//! the new one (B, the bed's coordinator opened again as 0.2.0) proves itself and confirms;
//! or the guard (the real `self_update::guard`, past its deadline) restores A, which reports
//! the rollback. A restart of the agent is a new coordinator on the same directories.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Bed, Signer, bed_trusting};
use inplace_agent::journal::Step;
use inplace_agent::power::Power;
use inplace_agent::self_update::{self, ClockReading, GuardPaths, Pending, Verdict};
use inplace_agent::update::Agent;
use inplace_proto::{NodeUpdatePlan, Phase};
use sha2::{Digest, Sha256};

const NEXT: &str = "inplace-agent 0.2.0 image";

/// A node running agent 0.1.0 from its own sysext image, allowing agent updates, trusting
/// `signer`.
fn node(signer: &Signer) -> Bed {
    let mut bed = bed_trusting(signer, false);
    bed.settings.self_update.allow = true;
    let images = bed.settings.paths.images_dir.join("inplace-agent");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&bed.settings.paths.extensions_dir).unwrap();
    let previous = images.join("inplace-agent-0.1.0.raw");
    std::fs::write(&previous, "inplace-agent 0.1.0 image").unwrap();
    std::os::unix::fs::symlink(&previous, paths(&bed).extension_link).unwrap();
    bed
}

fn paths(bed: &Bed) -> GuardPaths {
    GuardPaths::new(&bed.settings.state_dir, &bed.settings.paths.extensions_dir)
}

/// The plan asking for agent 0.2.0, its image signed with `comment`.
fn agent_plan(bed: &Bed, signer: &Signer, comment: &str) -> NodeUpdatePlan {
    let url = "https://dl.example/agent/inplace-agent-0.2.0.raw";
    let signature_url = format!("{url}.minisig");
    let mut objects = bed.fetcher.objects.lock().unwrap();
    objects.insert(url.into(), NEXT.as_bytes().to_vec());
    objects.insert(signature_url.clone(), signer.sign(NEXT.as_bytes(), comment));
    serde_json::from_value(serde_json::json!({
        "apiVersion": "inplace.dev/v1alpha1",
        "kind": "NodeUpdatePlan",
        "metadata": {"name": common::NODE, "generation": 2},
        "spec": {
            "nodeName": common::NODE,
            "desiredState": "Active",
            "agent": {"version": "0.2.0", "url": url, "sha256": hex::encode(Sha256::digest(NEXT)),
                      "size": NEXT.len(), "signatureUrl": signature_url},
        }
    }))
    .unwrap()
}

const SIGNED_FOR_0_2_0: &str = "timestamp:1 file:inplace-agent-0.2.0.raw version:0.2.0";

/// The plan's status says Succeeded (its Ready condition shown when not).
fn assert_succeeded(bed: &Bed) {
    assert_eq!(
        bed.last().phase,
        Some(Phase::Succeeded),
        "{:?}",
        bed.ready()
    );
}

fn link(bed: &Bed) -> PathBuf {
    std::fs::read_link(paths(bed).extension_link).unwrap()
}

fn pending(bed: &Bed) -> Option<Pending> {
    self_update::read_pending(&paths(bed).pending).unwrap()
}

/// The agent restarted as `version` (PID 1 restarting the unit after a swap or a restore).
async fn restarted_as(bed: &mut Bed, version: &str) -> Agent {
    bed.running.version = version.into();
    bed.agent().await
}

/// A, 0.1.0, takes the plan: staged, journaled, armed, swapped.
async fn switched(bed: &Bed, plan: &NodeUpdatePlan) {
    let mut a = bed.agent().await;
    a.handle(Some(plan)).await.unwrap();
    assert_eq!(a.journal().step(), Some(Step::SwitchingAgent));
}

/// A, 0.1.0, refuses the plan's signature: `SignatureInvalid`, nothing armed, the link
/// unmoved. The condition's message.
async fn refused_signature(bed: &Bed, plan: &NodeUpdatePlan) -> String {
    let mut a = bed.agent().await;
    a.handle(Some(plan)).await.unwrap();
    let (status, reason, message) = bed.ready();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SignatureInvalid")
    );
    assert!(pending(bed).is_none());
    assert!(link(bed).ends_with("inplace-agent-0.1.0.raw"));
    message
}

/// A node where A took the signed plan for 0.2.0 and swapped (the guard armed).
async fn mid_switch() -> (Bed, NodeUpdatePlan) {
    let signer = Signer::new();
    let bed = node(&signer);
    let plan = agent_plan(&bed, &signer, SIGNED_FOR_0_2_0);
    switched(&bed, &plan).await;
    (bed, plan)
}

/// The guard, run as the unit would run it, its clock jumping past the deadline (and the
/// time it grants from its own start) after its first look.
async fn guard_after_deadline(bed: &Bed) -> Verdict {
    let armed = pending(bed).unwrap();
    let looks = AtomicU64::new(0);
    let now = move || {
        let later = looks.fetch_add(1, Ordering::SeqCst) * 100_000;
        ClockReading {
            boot_id: armed.boot_deadline.as_ref().map(|b| b.boot_id.clone()),
            boottime: armed.boot_deadline.as_ref().map(|b| b.boottime + later),
            wall: armed.deadline + later,
        }
    };
    self_update::guard(&paths(bed), bed.systemd.as_ref(), &now)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_old_agent_arms_and_swaps_and_the_new_one_confirms_without_touching_the_content() {
    let (mut bed, plan) = mid_switch().await;

    let armed = pending(&bed).expect("the guard is armed");
    assert_eq!(armed.expected_version, "0.2.0");
    let boot = armed
        .boot_deadline
        .as_ref()
        .expect("armed on this boot's clock");
    assert_eq!(
        Some(&boot.boot_id),
        bed.power.boot_id().as_ref(),
        "armed on the boot the agent opened in"
    );
    assert_eq!(link(&bed), armed.next_image);
    assert_eq!(std::fs::read_to_string(&armed.next_image).unwrap(), NEXT);
    assert!(armed.previous_image.ends_with("inplace-agent-0.1.0.raw"));
    let kept = paths(&bed).previous_binary;
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), "agent 0.1.0");
    assert_eq!(
        std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        armed.previous_binary_sha256.as_deref(),
        Some(hex::encode(Sha256::digest("agent 0.1.0")).as_str())
    );
    assert_eq!(
        *bed.systemd.calls.lock().unwrap(),
        vec![
            "refresh extensions",
            "daemon-reload",
            "restart inplace-agent.service"
        ],
        "the agent restarts itself, nothing else"
    );
    assert_eq!(bed.last().phase, Some(Phase::Activating));

    let mut b = restarted_as(&mut bed, "0.2.0").await;
    b.handle(Some(&plan)).await.unwrap();
    let revision = inplace_proto::revision_of(&plan.spec.content);
    let confirming = bed.status.published.lock().unwrap().iter().any(|s| {
        s.conditions
            .iter()
            .any(|c| c.message == "confirming agent 0.2.0")
    });
    assert!(confirming, "B wrote its status before it confirmed");
    assert!(pending(&bed).is_none(), "disarmed");
    let status = bed.last();
    assert_eq!(status.phase, Some(Phase::Succeeded), "{:?}", bed.ready());
    assert_eq!(status.current_revision.as_deref(), Some(revision.as_str()));
    let journal = b.journal();
    assert_eq!(
        journal.agent().map(|a| a.revision()),
        Some(revision.as_str())
    );
    assert_eq!(
        journal.current_revision(),
        None,
        "the content chain is untouched"
    );
    assert!(journal.in_flight().is_none());

    // Up to date from now on: nothing downloaded or restarted again.
    let calls = bed.systemd.calls.lock().unwrap().len();
    b.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(bed.systemd.calls.lock().unwrap().len(), calls);
}

#[tokio::test]
async fn an_image_signed_for_another_version_is_refused_naming_the_field_and_both_versions() {
    let signer = Signer::new();
    let bed = node(&signer);
    let plan = agent_plan(
        &bed,
        &signer,
        "timestamp:1 file:inplace-agent-0.2.0.raw version:0.1.0",
    );
    let message = refused_signature(&bed, &plan).await;
    for word in [
        "spec.agent.signatureUrl",
        "0.1.0",
        "spec.agent.version 0.2.0",
    ] {
        assert!(message.contains(word), "{word:?} not in {message}");
    }
}

/// B cannot write its status (its identity refused): it says why in `STATUS=` and never
/// confirms; the guard restores A, which reports RolledBack with the guard's reason.
#[tokio::test]
async fn a_new_agent_refused_by_the_api_server_is_rolled_back_by_the_guard() {
    let (mut bed, plan) = mid_switch().await;
    *bed.status.refuse.lock().unwrap() = Some("Unauthorized (401)".into());

    let mut b = restarted_as(&mut bed, "0.2.0").await;
    let notified = bed.notified.clone();
    let guard = async {
        while !notified
            .lock()
            .unwrap()
            .iter()
            .any(|l| l == "cannot confirm agent 0.2.0: Unauthorized (401)")
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        guard_after_deadline(&bed).await
    };
    let both = async { tokio::join!(b.handle(Some(&plan)), guard) };
    let (confirmed, verdict) = tokio::time::timeout(Duration::from_secs(60), both)
        .await
        .expect("B gives up once the guard restored A");
    confirmed.unwrap();
    assert_eq!(verdict, Verdict::Restore);
    assert_eq!(
        b.journal().step(),
        Some(Step::SwitchingAgent),
        "B never confirmed"
    );
    assert!(link(&bed).ends_with("inplace-agent-0.1.0.raw"));

    let mut a = restarted_as(&mut bed, "0.1.0").await;
    a.handle(Some(&plan)).await.unwrap();
    let revision = inplace_proto::revision_of(&plan.spec.content);
    let denied = a.journal().failure_of(&revision).expect("denied");
    assert_eq!(denied.failure().reason.as_str(), "AgentNotConfirmed");
    assert!(a.journal().in_flight().is_none());
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "RolledBack");
    assert!(message.contains("AgentNotConfirmed"), "{message}");
    assert!(
        !paths(&bed).rolled_back.exists(),
        "the guard's record is consumed"
    );
    assert!(pending(&bed).is_none());
}

/// Power lost after the journal, before the guard was armed (the table's first row): A
/// starts the switch again at step 3, once per attempt, then gives up.
#[tokio::test]
async fn a_switch_stopped_before_its_guard_starts_again_then_gives_up() {
    let (bed, plan) = mid_switch().await;
    let previous = pending(&bed).unwrap().previous_image;
    let lose_power_before_arming = || {
        std::fs::remove_file(paths(&bed).pending).unwrap();
        let link = paths(&bed).extension_link;
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&previous, &link).unwrap();
    };
    for attempt in 2..=3 {
        lose_power_before_arming();
        let mut a = bed.agent().await;
        a.handle(Some(&plan)).await.unwrap();
        let switch = a.journal().in_flight().and_then(|f| f.switch()).cloned();
        assert_eq!(switch.map(|s| s.attempt), Some(attempt));
        assert!(pending(&bed).is_some(), "armed again");
        assert_eq!(link(&bed), pending(&bed).unwrap().next_image);
    }
    lose_power_before_arming();
    let mut a = bed.agent().await;
    a.handle(Some(&plan)).await.unwrap();
    let revision = inplace_proto::revision_of(&plan.spec.content);
    let denied = a.journal().failure_of(&revision).expect("given up");
    assert_eq!(denied.failure().reason.as_str(), "TooManyAttempts");
    assert!(pending(&bed).is_none());
    assert_eq!(link(&bed), previous);
}

/// B finds a link that does not hash to the plan's sha256: it confirms nothing and says
/// why; the guard decides.
#[tokio::test]
async fn a_new_agent_that_is_not_what_was_ordered_never_confirms() {
    let (mut bed, plan) = mid_switch().await;
    std::fs::write(pending(&bed).unwrap().next_image, "tampered").unwrap();
    let mut b = restarted_as(&mut bed, "0.2.0").await;
    b.handle(Some(&plan)).await.unwrap();
    assert_eq!(b.journal().step(), Some(Step::SwitchingAgent));
    assert!(pending(&bed).is_some(), "still armed: the guard decides");
    let said = bed.notified.lock().unwrap().join("\n");
    assert!(
        said.contains("does not hash to the plan's sha256"),
        "{said}"
    );
}

/// The power-loss table's second row: armed, lost before the link moved. A disarms and
/// starts again at step 3 (the next attempt), armed again and swapped.
#[tokio::test]
async fn lost_after_arming_before_the_swap_the_old_agent_starts_again() {
    let (bed, plan) = mid_switch().await;
    let armed = pending(&bed).unwrap();
    let extension_link = paths(&bed).extension_link;
    std::fs::remove_file(&extension_link).unwrap();
    std::os::unix::fs::symlink(&armed.previous_image, &extension_link).unwrap();
    let mut a = bed.agent().await;
    a.handle(Some(&plan)).await.unwrap();
    let switch = a.journal().in_flight().and_then(|f| f.switch()).cloned();
    assert_eq!(switch.map(|s| s.attempt), Some(2));
    assert_eq!(link(&bed), armed.next_image);
    assert!(pending(&bed).is_some());
}

/// The third row: the link swapped, lost before the refresh or the restart. A (still the
/// one merged) redoes step 4; B, once it runs, confirms.
#[tokio::test]
async fn lost_after_the_swap_the_old_agent_redoes_it_and_the_new_one_confirms() {
    let (mut bed, plan) = mid_switch().await;
    bed.systemd.calls.lock().unwrap().clear();
    let mut a = bed.agent().await;
    a.handle(Some(&plan)).await.unwrap();
    assert_eq!(
        *bed.systemd.calls.lock().unwrap(),
        vec![
            "refresh extensions",
            "daemon-reload",
            "restart inplace-agent.service"
        ]
    );
    let switch = a.journal().in_flight().and_then(|f| f.switch()).cloned();
    assert_eq!(switch.map(|s| s.attempt), Some(1), "not a new attempt");
    let mut b = restarted_as(&mut bed, "0.2.0").await;
    b.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert!(pending(&bed).is_none());
}

/// Row 7a: B removed `pending.json`, lost before its journal commit. B, started again,
/// proves itself again and commits.
#[tokio::test]
async fn lost_after_disarming_before_the_commit_the_new_agent_confirms_again() {
    let (mut bed, plan) = mid_switch().await;
    self_update::disarm(&paths(&bed)).unwrap();
    let mut b = restarted_as(&mut bed, "0.2.0").await;
    b.handle(Some(&plan)).await.unwrap();
    assert_succeeded(&bed);
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert_eq!(
        b.journal().agent().map(|a| a.revision()),
        Some(revision.as_str())
    );
}

/// The plan moved on (a Kubernetes release) while the agent switched: B still confirms its
/// switch, never shows that outcome as the new plan's, and goes on to the new plan.
#[tokio::test]
async fn a_plan_that_moved_on_during_the_switch_is_taken_after_the_confirmation() {
    let (mut bed, plan) = mid_switch().await;
    let next = bed.plan("OK v1", "kubectl v1", "Active");
    let next_revision = inplace_proto::revision_of(&next.spec.content);
    let mut b = restarted_as(&mut bed, "0.2.0").await;
    b.handle(Some(&next)).await.unwrap();
    let switched = inplace_proto::revision_of(&plan.spec.content);
    assert_eq!(
        b.journal().agent().map(|a| a.revision()),
        Some(switched.as_str())
    );
    assert_eq!(b.journal().current_revision(), Some(next_revision.as_str()));
    let shown_as_next = bed.status.published.lock().unwrap().iter().any(|s| {
        s.conditions
            .iter()
            .any(|c| c.message.contains("confirmed itself"))
    });
    assert!(!shown_as_next, "the switch's outcome is not the new plan's");
    assert_succeeded(&bed);
}

/// A plan for the agent version that already runs (a node bootstrapped with the fleet's
/// current image, then given the fleet's rollout) is up to date: nothing is fetched,
/// journaled, armed or restarted. (It started a switch; interrupted before the swap, the
/// agent then waited for a guard that was never armed and ignored every later plan.)
#[tokio::test]
async fn a_plan_for_the_running_agent_version_is_up_to_date_and_switches_nothing() {
    let signer = Signer::new();
    let mut bed = node(&signer);
    let plan = agent_plan(&bed, &signer, SIGNED_FOR_0_2_0);
    let mut agent = restarted_as(&mut bed, "0.2.0").await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(agent.journal().step(), None);
    assert!(pending(&bed).is_none());
    assert!(bed.systemd.calls.lock().unwrap().is_empty());
    assert!(link(&bed).ends_with("inplace-agent-0.1.0.raw"));
    assert_succeeded(&bed);
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert_eq!(
        bed.last().current_revision.as_deref(),
        Some(revision.as_str())
    );
}

/// A node whose guard path unit is not active (not installed, not enabled) takes no switch:
/// nothing would restore a broken agent.
#[tokio::test]
async fn without_the_guard_unit_active_no_switch_starts() {
    let signer = Signer::new();
    let bed = node(&signer);
    bed.systemd
        .inactive
        .lock()
        .unwrap()
        .push("inplace-agent-guard.path".into());
    let plan = agent_plan(&bed, &signer, SIGNED_FOR_0_2_0);
    let mut a = bed.agent().await;
    a.handle(Some(&plan)).await.unwrap();
    let (status, reason, message) = bed.ready();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SelfUpdateUnsupported")
    );
    assert!(
        message.contains("inplace-agent-guard.path is inactive"),
        "{message}"
    );
    assert!(pending(&bed).is_none());
    assert!(bed.systemd.calls.lock().unwrap().is_empty());
}

/// `[self_update] trusted_keys_dir` apart from the policy's: a key trusted for Kubernetes
/// artifacts does not vouch for an agent image, which runs as root.
#[tokio::test]
async fn an_agent_image_needs_a_key_of_the_self_update_keys_dir() {
    let signer = Signer::new();
    let mut bed = node(&signer);
    let agent_keys = tempfile::tempdir().unwrap();
    bed.settings.self_update.trusted_keys_dir = agent_keys.path().to_path_buf();
    let plan = agent_plan(&bed, &signer, SIGNED_FOR_0_2_0);
    let message = refused_signature(&bed, &plan).await;
    assert!(message.contains("spec.agent.signatureUrl"), "{message}");
}

/// A plan for a lower agent version than the running build is refused at
/// `spec.agent.version`: anyone who may write plans could otherwise roll the fleet back to
/// an old, signed, vulnerable agent.
#[tokio::test]
async fn a_plan_for_a_lower_agent_version_is_refused_as_a_downgrade() {
    let signer = Signer::new();
    let mut bed = node(&signer);
    let plan = agent_plan(&bed, &signer, SIGNED_FOR_0_2_0);
    let mut agent = restarted_as(&mut bed, "0.10.0").await;
    agent.handle(Some(&plan)).await.unwrap();
    let (status, reason, message) = bed.ready();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "DowngradeDenied")
    );
    for word in ["spec.agent.version", "0.2.0", "0.10.0", "allow_downgrade"] {
        assert!(message.contains(word), "{word:?} not in {message}");
    }
    assert_eq!(agent.journal().step(), None);
    assert!(pending(&bed).is_none());
    assert!(bed.systemd.calls.lock().unwrap().is_empty());
}

/// A confirmed switch is up to date only while its build runs: an agent put back to 0.1.0
/// (a package reinstalled, an image relinked by hand) takes the plan again.
#[tokio::test]
async fn a_confirmed_switch_is_up_to_date_only_while_its_build_runs() {
    let (mut bed, plan) = mid_switch().await;
    let mut b = restarted_as(&mut bed, "0.2.0").await;
    b.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    let mut a = restarted_as(&mut bed, "0.1.0").await;
    a.handle(Some(&plan)).await.unwrap();
    assert_eq!(
        a.journal().step(),
        Some(Step::SwitchingAgent),
        "0.1.0 runs, so the plan for 0.2.0 is not done: {:?}",
        bed.ready()
    );
}
