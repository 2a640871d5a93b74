//! The memo (`memo.rs`) changes no decision: over random sequences of what happens to a
//! fleet between rounds (agents reporting, writes carried out or lost, a person holding,
//! skipping or cordoning, nodes turning NotReady, coming and going, the rollout paused and
//! resumed, the clock moving), every round decided with the last rounds' memo is the round
//! decided from scratch. `simulated_rollouts_keep_every_invariant` checks the same in every
//! round of its simulated rollouts.

use super::*;

/// One thing that happens to node `node % fleet` (or to the rollout) before a round.
#[derive(Debug, Clone, Copy)]
enum Happening {
    AgentStep,
    Hold,
    Skip,
    Readiness,
    Cordon,
    CarryOut,
    Pause,
    ComeOrGo,
}

fn happening() -> impl Strategy<Value = Happening> {
    prop_oneof![
        4 => Just(Happening::AgentStep),
        1 => Just(Happening::Hold),
        1 => Just(Happening::Skip),
        1 => Just(Happening::Readiness),
        1 => Just(Happening::Cordon),
        4 => Just(Happening::CarryOut),
        1 => Just(Happening::Pause),
        1 => Just(Happening::ComeOrGo),
    ]
}

/// The agent's next phase for its plan, as the simulated agents of `simulate` move.
fn agent_step(view: &mut NodeView, fails: bool) {
    let Some(plan) = view.plan.as_mut() else {
        return;
    };
    let r = &mut plan.report;
    let next = match (r.phase, plan.intent.desired_state) {
        (None, _) => Phase::Staged,
        (Some(Phase::Staged), DesiredState::Active) => Phase::Activating,
        (Some(Phase::Activating), _) if fails => Phase::RolledBack,
        (Some(Phase::Activating), _) => Phase::Succeeded,
        _ => return,
    };
    r.phase = Some(next);
    r.target_revision = Some(plan.intent.revision.clone());
    if next == Phase::Succeeded {
        r.current_revision = Some(plan.intent.revision.clone());
    }
}

/// The fleet as the rollout's kept view numbers it: a view that changed gets a new number.
#[derive(Default)]
pub(super) struct Numbered {
    last_version: u64,
    seen: BTreeMap<String, (NodeView, u64)>,
}

impl Numbered {
    pub(super) fn number(&mut self, views: &[NodeView]) -> Vec<NodeView> {
        views
            .iter()
            .map(|v| {
                let unnumbered = NodeView {
                    version: 0,
                    drain: None,
                    ..v.clone()
                };
                let version = match self.seen.get(&v.name) {
                    Some((seen, version)) if *seen == unnumbered => *version,
                    _ => {
                        self.last_version += 1;
                        self.seen
                            .insert(v.name.clone(), (unnumbered, self.last_version));
                        self.last_version
                    }
                };
                NodeView {
                    version,
                    ..v.clone()
                }
            })
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]
    #[test]
    fn a_round_decided_with_the_memo_is_the_round_decided_from_scratch(
        workers in 1usize..16,
        cps in 0usize..3,
        max_unavailable in 1i32..5,
        disruption in prop_oneof![Just(Disruption::None), Just(Disruption::Cordon), Just(Disruption::Drain)],
        min_ready_seconds in prop_oneof![Just(0i32), 1i32..4],
        deadline in proptest::option::of(2u64..8),
        failing in proptest::collection::btree_set(0usize..20, 0..3),
        rounds in proptest::collection::vec(
            (proptest::collection::vec((0usize..20, happening()), 0..4), 0i64..3),
            1..40,
        ),
    ) {
        let mut s = spec(IntOrString::Int(max_unavailable), 1);
        s.disruption = disruption;
        s.min_ready_seconds = min_ready_seconds;
        s.progress_deadline = deadline.map(Duration::from_secs);
        // Shorter than every deadline drawn, as a valid rollout's is.
        s.drain_timeout = Duration::from_secs(1);
        let all: Vec<NodeView> = (0..workers + cps)
            .map(|i| if i < cps { cp(&format!("c{i:02}")) } else { node(&format!("w{i:02}")) })
            .collect();
        let mut present: Vec<bool> = vec![true; all.len()];
        let mut views = all.clone();
        let mut numbered = Numbered::default();
        let mut memo = DecisionMemo::default();
        let mut previous: Option<NodeRolloutStatus> = None;
        let mut last_actions: Vec<NodeAction> = Vec::new();
        let mut now = 0;
        let release = ReleaseState::Valid { revision: REV.into() };
        for (happenings, step) in rounds {
            for (k, what) in happenings {
                let k = k % views.len();
                let v = &mut views[k];
                match what {
                    Happening::AgentStep => agent_step(v, failing.contains(&k)),
                    Happening::Hold => v.steering.hold = !v.steering.hold,
                    Happening::Skip => v.steering.skip = !v.steering.skip,
                    Happening::Readiness => {
                        v.readiness = match v.readiness {
                            Readiness::Ready => Readiness::NotReady { why: "KubeletDown".into() },
                            Readiness::NotReady { .. } => Readiness::Ready,
                        }
                    }
                    Happening::Cordon => v.unschedulable = !v.unschedulable,
                    Happening::CarryOut => {
                        let name = v.name.clone();
                        for action in last_actions.iter().filter(|a| a.node() == name) {
                            carry_out(v, action);
                        }
                    }
                    Happening::Pause => s.paused = !s.paused,
                    Happening::ComeOrGo => present[k] = !present[k],
                }
            }
            now += step;
            let fleet: Vec<NodeView> = views
                .iter()
                .zip(&present)
                .filter(|(_, here)| **here)
                .map(|(v, _)| NodeView {
                    drain: needs_drain_pass(&s, &release, v).then(DrainProgress::default),
                    ..v.clone()
                })
                .collect();
            let mut i = input(&s, numbered.number(&fleet));
            i.now = t(now);
            i.previous = previous.as_ref();
            let from_scratch = decide(&i);
            let with_memo = decide_with_memo(&i, &mut memo);
            prop_assert_eq!(&with_memo, &from_scratch, "at t={}", now);
            last_actions = from_scratch.actions;
            previous = Some(from_scratch.status);
        }
    }
}

/// Staging deferred by the batch limit is no "nothing to do": the nodes left over are
/// staged in the next rounds, with the memo as without it.
#[test]
fn nodes_left_unstaged_by_the_batch_limit_are_staged_in_the_next_round() {
    let s = spec(IntOrString::Int(1), 0);
    let fleet: Vec<NodeView> = (0..STAGING_BATCH + 20)
        .map(|i| NodeView {
            version: i as u64 + 1,
            ..node(&format!("n{i:04}"))
        })
        .collect();
    let mut memo = DecisionMemo::default();
    let first = decide_with_memo(&input(&s, fleet.clone()), &mut memo);
    assert_eq!(first.actions.len(), STAGING_BATCH);
    assert_eq!(first.requeue_after, Some(STAGING_REQUEUE));
    // The first round's writes are lost (a failed round is retried as is).
    let again = decide_with_memo(&input(&s, fleet.clone()), &mut memo);
    assert_eq!(again, first);
    // They land: the staged nodes' views change, the rest are the same views.
    let mut fleet = fleet;
    for (n, action) in fleet.iter_mut().zip(&first.actions) {
        carry_out(n, action);
        n.version += 10_000;
    }
    let with_memo = decide_with_memo(&input(&s, fleet.clone()), &mut memo);
    let from_scratch = decide(&input(&s, fleet));
    assert_eq!(with_memo, from_scratch);
    assert_eq!(with_memo.actions.len(), 20, "{:?}", with_memo.actions);
}

/// A soak's start is found from the last status (the node was active) and the time: it is
/// not kept, so a round whose write of `ready-since` did not land finds it again from the
/// time of that round, as from scratch.
#[test]
fn a_soak_start_is_found_again_in_every_round_until_it_is_recorded() {
    let mut s = spec(IntOrString::Int(1), 0);
    s.min_ready_seconds = 30;
    let fleet = vec![
        NodeView {
            version: 1,
            ..succeeded(node("a"))
        },
        NodeView {
            version: 2,
            ..staged(node("b"))
        },
    ];
    let previous = NodeRolloutStatus {
        active_nodes: vec!["a".into()],
        ..NodeRolloutStatus::default()
    };
    let mut memo = DecisionMemo::default();
    for now in [100, 101, 105] {
        let mut i = input(&s, fleet.clone());
        i.previous = Some(&previous);
        i.now = t(now);
        let d = decide_with_memo(&i, &mut memo);
        assert_eq!(d, decide(&i), "at t({now})");
        assert_eq!(applies(&d)[0].1.ready_since, Some(t(now)));
    }
}
