//! The switch's transitions: journaled, restarted, confirmed apart from the committed
//! content, or failed and denied; refused from any other step, the journal unchanged.

use chrono::Utc;
use inplace_proto::{Reason, UpdateContent};

use super::*;
use crate::journal::tests::at_step;

fn agent_update() -> UpdateContent {
    serde_json::from_value(serde_json::json!({"agent": {
        "version": "0.2.0", "url": "https://x/inplace-agent-0.2.0.raw", "sha256": "b".repeat(64),
    }}))
    .expect("content")
}

fn switch(attempt: u32) -> Switch {
    Switch {
        previous_image: "/opt/extensions/inplace-agent/inplace-agent-0.1.0.raw".into(),
        next_image: "/opt/extensions/inplace-agent/inplace-agent-0.2.0.raw".into(),
        next_sha256: "b".repeat(64),
        expected_version: "0.2.0".into(),
        previous_version: Some("0.1.0".into()),
        attempt,
    }
}

/// A node that committed revision "k" (its content) and now switches its agent.
fn switching() -> Journal {
    let node_content: UpdateContent = serde_json::from_value(serde_json::json!({
        "artifacts": [{"name": "k", "type": "Sysext", "url": "https://x/k.raw", "sha256": "0".repeat(64)}]
    }))
    .expect("content");
    let mut j = at_step("k", &node_content, Step::Verifying);
    j.commit(Utc::now()).expect("commit k");
    j.begin_staging("agent", Some(2), &agent_update(), Utc::now())
        .expect("staging");
    j.staged(Vec::new()).expect("staged");
    j.begin_switch(switch(1)).expect("begin_switch");
    j
}

#[test]
fn a_confirmed_switch_is_recorded_apart_from_the_committed_content() {
    let mut j = switching();
    assert_eq!(j.step(), Some(Step::SwitchingAgent));
    assert_eq!(j.in_flight().and_then(|f| f.switch()), Some(&switch(1)));
    j.restart_switch(2).expect("restart_switch");
    assert_eq!(j.in_flight().and_then(|f| f.switch()), Some(&switch(2)));

    let installed = j
        .confirm_switch(Utc::now())
        .expect("confirm_switch")
        .clone();
    assert_eq!(installed.revision(), "agent");
    assert_eq!(installed.version(), "0.2.0");
    assert_eq!(installed.image(), switch(1).next_image);
    assert!(j.in_flight().is_none());
    assert_eq!(j.agent(), Some(&installed));
    // The node's content chain is what it was: the next release diffs against "k".
    assert_eq!(j.current_revision(), Some("k"));
    assert!(j.previous().is_none());
}

#[test]
fn a_failed_switch_is_denied_as_rolled_back() {
    let mut j = switching();
    let failure = Failure {
        reason: Reason::AgentNotConfirmed,
        message: "agent 0.2.0 did not confirm itself by its deadline".into(),
    };
    j.switch_failed(failure.clone(), Utc::now())
        .expect("switch_failed");
    let denied = j.failure_of("agent").expect("denied");
    assert_eq!(denied.failure(), &failure);
    assert!(denied.rolled_back());
    assert!(j.agent().is_none());
    assert_eq!(j.current_revision(), Some("k"));
}

#[test]
fn switch_transitions_from_other_steps_are_refused_and_change_nothing() {
    for step in [
        Step::Staging,
        Step::Activating,
        Step::Verifying,
        Step::RollingBack,
    ] {
        let mut j = at_step("a", &agent_update(), step);
        let before = j.clone();
        assert!(j.restart_switch(2).is_err(), "{step:?}");
        assert!(j.confirm_switch(Utc::now()).is_err(), "{step:?}");
        assert!(
            j.switch_failed(
                Failure {
                    reason: Reason::AgentNotConfirmed,
                    message: String::new(),
                },
                Utc::now()
            )
            .is_err(),
            "{step:?}"
        );
        if step != Step::Staged {
            assert!(j.begin_switch(switch(1)).is_err(), "{step:?}");
        }
        assert_eq!(j, before, "{step:?}");
    }
    // And the plain transitions are refused from SwitchingAgent.
    let mut j = switching();
    let before = j.clone();
    assert!(j.verifying().is_err());
    assert!(j.commit(Utc::now()).is_err());
    assert!(j.begin_switch(switch(1)).is_err());
    assert_eq!(j, before);
}
