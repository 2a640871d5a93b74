//! kured's reboot lock (`kured.rs`): held by a kured daemon, no activation starts
//! (`RebootLockHeld`, naming the holder) and a selected node it is held for occupies a slot
//! even where the rollout does not count others' disruption; free or ours, grants go on.

use super::*;
use crate::decision::kured::{KuredView, holder_id, read_lock};

fn with_lock<'a>(
    s: &'a NodeRolloutSpec,
    nodes: Vec<NodeView>,
    value: Option<&str>,
) -> RolloutInput<'a> {
    RolloutInput {
        kured: Some(KuredView {
            lock: read_lock(value, t(100)),
            ours: holder_id("ro"),
        }),
        ..input(s, nodes)
    }
}

const HELD_FOR_WORKER_2: &str = r#"{"nodeID":"worker-2","metadata":{"unschedulable":false},"created":"2026-11-28T08:00:00Z","TTL":0}"#;

#[test]
fn kureds_lock_held_for_a_node_holds_every_grant_and_takes_that_nodes_slot() {
    let mut s = spec(IntOrString::Int(2), 0);
    s.count_foreign_disruption = false;
    let nodes = vec![staged(node("worker-1")), staged(node("worker-2"))];
    let d = decide(&with_lock(&s, nodes.clone(), Some(HELD_FOR_WORKER_2)));
    assert!(granted(&d).is_empty(), "{:?}", d.actions);
    let p = condition(&d, "Progressing");
    assert_eq!(
        (p.status.as_str(), p.reason.as_str()),
        ("False", "RebootLockHeld")
    );
    assert!(
        p.message.starts_with("kured's reboot lock is held by \"worker-2\" since 2026-11-28T08:00:00Z; no new activations"),
        "{}",
        p.message
    );
    assert!(
        p.message
            .contains("1 slot used by others: worker-2 held by kured's lock"),
        "{}",
        p.message
    );

    let d = decide(&with_lock(&s, nodes.clone(), None));
    assert_eq!(granted(&d), ["worker-1", "worker-2"]);
    let ours = r#"{"nodeID":"inplace/ro","metadata":{"unschedulable":false},"created":"2026-11-28T08:00:00Z","TTL":0}"#;
    let d = decide(&with_lock(&s, nodes, Some(ours)));
    assert_eq!(granted(&d), ["worker-1", "worker-2"]);
}
