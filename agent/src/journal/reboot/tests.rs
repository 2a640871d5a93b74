//! The reboot's transitions: journaled with the boot they were asked from, verified after
//! it, refused (rolled back without a reboot) or rolled back with one; refused from any
//! other step, the journal unchanged.

use chrono::Utc;
use inplace_proto::{Reason, UpdateContent};

use super::*;
use crate::journal::tests::at_step;

fn content() -> UpdateContent {
    serde_json::from_value(serde_json::json!({
        "artifacts": [{"name": "k", "type": "Sysext", "url": "https://x/k.raw",
                       "sha256": "0".repeat(64), "activation": "Reboot"}]
    }))
    .expect("content")
}

fn failure() -> Failure {
    Failure {
        reason: Reason::HealthCheckFailed,
        message: "kubelet.service is failed".into(),
    }
}

/// A journal at `step`, reached through the transitions (boot "b1" asked for the reboot,
/// "b2" asked for the reboot back).
fn at(step: Step) -> Journal {
    let mut j = at_step(
        "r",
        &content(),
        match step {
            Step::Rebooting | Step::RebootingBack => Step::Activating,
            other => other,
        },
    );
    if matches!(step, Step::Rebooting | Step::RebootingBack) {
        j.rebooting("b1").expect("rebooting");
    }
    if step == Step::RebootingBack {
        j.rebooted().expect("rebooted");
        j.rolling_back(Some(failure())).expect("rolling_back");
        j.rebooting_back("b2").expect("rebooting_back");
    }
    assert_eq!(j.step(), Some(step));
    j
}

#[test]
fn a_reboot_is_journaled_with_its_boot_and_kept_through_verification() {
    let mut j = at(Step::Rebooting);
    let asked = j
        .in_flight()
        .and_then(|f| f.reboot())
        .cloned()
        .expect("reboot");
    assert_eq!(asked.from_boot, "b1");
    assert!(
        !asked.happened(Some("b1")),
        "the same boot has not rebooted"
    );
    assert!(asked.happened(Some("b2")));
    assert!(asked.happened(None), "an unknown boot counts as booted");
    j.rebooted().expect("rebooted");
    assert_eq!(j.step(), Some(Step::Verifying));
    assert_eq!(j.in_flight().and_then(|f| f.reboot()), Some(&asked));
    j.commit(Utc::now()).expect("commit");
    assert_eq!(j.current_revision(), Some("r"));
}

#[test]
fn a_failed_boot_is_rolled_back_by_a_reboot_and_denied_as_rolled_back() {
    let mut j = at(Step::RebootingBack);
    assert_eq!(
        j.in_flight()
            .and_then(|f| f.reboot())
            .map(|r| r.from_boot.as_str()),
        Some("b2")
    );
    j.rolled_back(Utc::now()).expect("rolled_back");
    let failed = j.failure_of("r").expect("denied");
    assert!(failed.rolled_back());
    assert_eq!(failed.failure(), &failure());
}

#[test]
fn a_refused_reboot_is_forgotten_and_rolled_back_without_one() {
    let mut j = at(Step::Rebooting);
    j.reboot_refused(failure()).expect("reboot_refused");
    let flight = j.in_flight().expect("in flight");
    assert_eq!(flight.step(), Step::RollingBack);
    assert_eq!(flight.reboot(), None);
    assert_eq!(flight.failure(), Some(&failure()));
}

#[test]
fn the_reboot_transitions_are_refused_from_every_other_step() {
    type Transition = fn(&mut Journal) -> Result<(), TransitionError>;
    use Step::*;
    let transitions: [(&str, Transition, &[Step]); 7] = [
        ("rebooting", |j| j.rebooting("b3"), &[Activating]),
        ("rebooted", Journal::rebooted, &[Rebooting]),
        (
            "reboot_refused",
            |j| j.reboot_refused(failure()),
            &[Rebooting],
        ),
        ("rebooting_back", |j| j.rebooting_back("b3"), &[RollingBack]),
        (
            "rolled_back",
            |j| j.rolled_back(Utc::now()).map(drop),
            &[RollingBack, RebootingBack],
        ),
        (
            "rollback_failed",
            |j| j.rollback_failed(failure(), Utc::now()).map(drop),
            &[RollingBack, RebootingBack],
        ),
        // What the other steps allow is refused from the two new ones.
        ("commit", |j| j.commit(Utc::now()).map(drop), &[Verifying]),
    ];
    let mut refused = 0;
    for from in [
        Staging,
        Staged,
        Activating,
        Verifying,
        RollingBack,
        Rebooting,
        RebootingBack,
    ] {
        for (name, transition, allowed) in &transitions {
            let mut j = at(from);
            let was = j.clone();
            match transition(&mut j) {
                Ok(()) => assert!(allowed.contains(&from), "{name} from {from:?} went through"),
                Err(e) => {
                    assert!(
                        !allowed.contains(&from),
                        "{name} from {from:?} refused: {e}"
                    );
                    assert_eq!(e.from, Some(from));
                    assert_eq!(j, was, "a refused {name} changed the journal");
                    refused += 1;
                }
            }
        }
    }
    // 49 pairs, 9 of them possible.
    assert_eq!(refused, 40);
}

#[test]
fn the_other_transitions_refuse_the_reboot_steps() {
    for from in [Step::Rebooting, Step::RebootingBack] {
        let mut j = at(from);
        let was = j.clone();
        assert!(j.verifying().is_err());
        assert!(j.resume_activating().is_err());
        assert!(j.count_attempt().is_err());
        assert!(j.deny(failure(), Utc::now()).is_err());
        assert!(j.activating(vec![]).is_err());
        assert!(j.abandon_staging().is_err());
        assert_eq!(j, was);
    }
    let mut j = at(Step::Rebooting);
    assert!(
        j.rolling_back(Some(failure())).is_err(),
        "a reboot asked for is seen through"
    );
}
