//! Following a rollout: the watches, the live progress, and the `maxUnavailable` check.

use inplace_proto::reason::rollout_condition;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use anyhow::bail;
use futures::StreamExt as _;
use inplace_proto::{NodeFailure, NodeRollout, NodeUpdatePlan, Phase};
use inplace_tests::nspawn::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kubectl_inplace::render::{self, Style};

use crate::concurrency::Concurrency;
use crate::fleet::{MAX_UNAVAILABLE, Member, PATIENCE};
use crate::measure::KubeletSeen;
use crate::nodes::node_sh;
use crate::render::Screen;

/// Caches of rollouts and plans, kept by watches for the rest of the demo.
pub(crate) struct Watch {
    pub(crate) rollouts: reflector::Store<NodeRollout>,
    pub(crate) plans: reflector::Store<NodeUpdatePlan>,
    _tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Watch {
    pub(crate) fn start(client: &kube::Client) -> Watch {
        let (rollouts, rw) = reflector::store::<NodeRollout>();
        let (plans, pw) = reflector::store::<NodeUpdatePlan>();
        let r = reflector(
            rw,
            watcher(
                Api::<NodeRollout>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff();
        let p = reflector(
            pw,
            watcher(
                Api::<NodeUpdatePlan>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff();
        let tasks = vec![
            tokio::spawn(async move { r.for_each(|_| async {}).await }),
            tokio::spawn(async move { p.for_each(|_| async {}).await }),
        ];
        Watch {
            rollouts,
            plans,
            _tasks: tasks,
        }
    }

    /// The rollout `name` and every plan, as the watches last saw them.
    pub(crate) fn snapshot(&self, name: &str) -> (Option<NodeRollout>, Vec<NodeUpdatePlan>) {
        let rollout = self
            .rollouts
            .state()
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .map(|r| (**r).clone());
        let plans = self.plans.state().iter().map(|p| (**p).clone()).collect();
        (rollout, plans)
    }
}

/// When a node was granted its slot (plan `desiredState: Active` for the release) and when
/// it succeeded, as seen by the demo's watch (resolution: the 250 ms redraw).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeTiming {
    pub(crate) granted: Option<Instant>,
    pub(crate) succeeded: Option<Instant>,
}

/// How a stage of the demo ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Every node's plan Succeeded; a failed node or a halt fails the demo.
    AllSucceeded,
    /// Every node's plan is Staged (downloaded and verified, waiting for its slot); a failed
    /// node or a halt fails the demo.
    AllStaged,
    /// The rollout halts and no node is still activating; a node that succeeds fails it.
    Halted,
}

/// One rollout the demo follows.
pub(crate) struct Stage<'a> {
    /// The NodeRollout.
    pub(crate) rollout: &'a str,
    /// The release the rollout names.
    pub(crate) release: &'a str,
    /// The kubelets' answers, shown under the progress.
    pub(crate) seen: Option<&'a BTreeMap<String, Arc<Mutex<KubeletSeen>>>>,
    /// The `maxUnavailable` watch, checked on every redraw.
    pub(crate) limits: Option<&'a Concurrency>,
    /// When it is over.
    pub(crate) ends: Ending,
}

/// What one node's plan phase means for a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The node is where the stage wants it.
    Done,
    /// Not yet.
    Going,
    /// It ended where the stage must not: the demo fails.
    Fails,
}

/// The verdict on a node in `phase` (`activating`: its plan holds a slot) for a stage that
/// ends as `ends`.
pub(crate) fn verdict(phase: Phase, ends: Ending, activating: bool) -> Verdict {
    match (phase, ends) {
        (Phase::Succeeded, Ending::AllSucceeded) => Verdict::Done,
        // Staged, or already past it: the window may open before every node was seen staged.
        (
            Phase::Staged | Phase::Activating | Phase::Verifying | Phase::Succeeded,
            Ending::AllStaged,
        ) => Verdict::Done,
        (Phase::Failed | Phase::RolledBack, Ending::AllSucceeded | Ending::AllStaged)
        | (Phase::Succeeded, Ending::Halted) => Verdict::Fails,
        // Halting: done once final, or staged and never granted.
        (_, Ending::Halted) if phase.is_final() || (phase == Phase::Staged && !activating) => {
            Verdict::Done
        }
        _ => Verdict::Going,
    }
}

pub(crate) fn halted(rollout: &NodeRollout) -> bool {
    rollout.status.as_ref().is_some_and(|s| {
        inplace_proto::condition::is_true(&s.conditions, rollout_condition::HALTED)
    })
}

/// Draws progress until the stage ends (see [`Ending`]); fails early on anything else, and
/// as soon as more nodes than `maxUnavailable` were activating or cordoned at once.
pub(crate) async fn follow(
    watch: &Watch,
    stage: &Stage<'_>,
    members: &[Member],
    style: &Style,
    tty: bool,
    fleet: &Arc<Mutex<Vec<Node>>>,
) -> anyhow::Result<BTreeMap<String, NodeTiming>> {
    let mut screen = Screen::new(tty);
    let started = Instant::now();
    let mut timings: BTreeMap<String, NodeTiming> = BTreeMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let (rollout, plans) = watch.snapshot(stage.rollout);
        let now = Instant::now();
        let mut all_done = rollout.is_some();
        for m in members {
            let plan = plans.iter().find(|p| {
                p.metadata.name.as_deref() == Some(m.name.as_str())
                    && p.spec.release.as_deref() == Some(stage.release)
            });
            let t = timings.entry(m.name.clone()).or_insert(NodeTiming {
                granted: None,
                succeeded: None,
            });
            let Some(plan) = plan else {
                all_done = false;
                continue;
            };
            if plan.spec.desired_state == inplace_proto::DesiredState::Active && t.granted.is_none()
            {
                t.granted = Some(now);
            }
            let phase = render::effective_phase(plan);
            match verdict(phase, stage.ends, crate::concurrency::is_activating(plan)) {
                Verdict::Done => {
                    if phase == Phase::Succeeded && t.succeeded.is_none() {
                        t.succeeded = Some(now);
                    }
                }
                Verdict::Going => all_done = false,
                Verdict::Fails => {
                    let journal = node_sh(
                        fleet,
                        &m.name,
                        "journalctl -u inplace-agent.service -n 30 --no-pager",
                    )
                    .await
                    .unwrap_or_default();
                    bail!(
                        "{} ended {phase:?}: {}\nagent journal:\n{journal}",
                        m.name,
                        render::ready_summary(plan)
                    );
                }
            }
        }
        let mut frame = Vec::new();
        if let Some(r) = &rollout {
            if r.spec.release == stage.release {
                frame.extend(render::rollout_lines(r, &plans, style));
                all_done &= stage.ends != Ending::Halted || halted(r);
            } else {
                all_done = false;
            }
            if stage.ends != Ending::Halted && halted(r) {
                screen.draw(&frame, &[]);
                bail!("the rollout halted");
            }
        }
        if let Some(seen) = stage.seen {
            let mut kubelets = Vec::new();
            for m in members {
                let v = seen[&m.name]
                    .lock()
                    .ok()
                    .and_then(|s| s.version.clone())
                    .unwrap_or_else(|| "no answer".to_owned());
                kubelets.push(format!("{}={v}", m.name));
            }
            frame.push(format!(
                "  kubelets (as their Nodes report): {}",
                kubelets.join("  ")
            ));
        }
        let clock = vec![format!(
            "  elapsed {}",
            render::human_duration(started.elapsed())
        )];
        screen.draw(&frame, &clock);
        if let Some(limits) = stage.limits {
            limits.check(MAX_UNAVAILABLE).map_err(anyhow::Error::msg)?;
        }
        if all_done {
            screen.finish();
            return Ok(timings);
        }
        if started.elapsed() > PATIENCE {
            bail!(
                "the rollout did not finish within {}",
                render::human_duration(PATIENCE)
            );
        }
    }
}

pub(crate) fn print_limits(limits: &Concurrency) {
    let (activating, cordoned) = limits.peaks();
    println!(
        "  max nodes activating at once: {} (maxUnavailable {MAX_UNAVAILABLE}); max cordoned at once: {}\n\
         \x20   counted on every plan and Node event: a node is activating from its plan's desiredState\n\
         \x20   Active until the agent reports a final phase.",
        activating.count, cordoned.count
    );
}

/// A halted rollout's one failed node and its `Halted` condition, which must name that node
/// and its reason; an error otherwise.
pub(crate) fn the_halt(rollout: Option<&NodeRollout>) -> anyhow::Result<(NodeFailure, Condition)> {
    let rollout = rollout.context("the rollout is gone")?;
    let status = rollout.status.clone().unwrap_or_default();
    let [failure] = status.failed_nodes.as_slice() else {
        bail!(
            "expected exactly one failed node, the rollout reports {:?}",
            status.failed_nodes
        );
    };
    let halt = inplace_proto::condition::find(&status.conditions, rollout_condition::HALTED)
        .filter(|c| c.status == inplace_proto::condition::TRUE)
        .context("the rollout is not Halted")?;
    if !halt.message.contains(&failure.node) || !halt.message.contains(&failure.reason) {
        bail!(
            "Halted does not name {} and {}: {}",
            failure.node,
            failure.reason,
            halt.message
        );
    }
    Ok((failure.clone(), halt.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_past_staged_counts_as_staged() {
        // The window can open by itself before the demo saw every node staged (a `make demo`
        // run waited 10 minutes for a node that had already succeeded).
        for phase in [
            Phase::Staged,
            Phase::Activating,
            Phase::Verifying,
            Phase::Succeeded,
        ] {
            assert_eq!(
                verdict(phase, Ending::AllStaged, true),
                Verdict::Done,
                "{phase:?}"
            );
        }
        for phase in [Phase::Pending, Phase::Downloading] {
            assert_eq!(
                verdict(phase, Ending::AllStaged, false),
                Verdict::Going,
                "{phase:?}"
            );
        }
        assert_eq!(
            verdict(Phase::RolledBack, Ending::AllStaged, false),
            Verdict::Fails
        );
    }

    #[test]
    fn the_other_stages_keep_their_verdicts() {
        assert_eq!(
            verdict(Phase::Succeeded, Ending::AllSucceeded, false),
            Verdict::Done
        );
        assert_eq!(
            verdict(Phase::Staged, Ending::AllSucceeded, false),
            Verdict::Going
        );
        assert_eq!(
            verdict(Phase::Failed, Ending::AllSucceeded, true),
            Verdict::Fails
        );
        assert_eq!(
            verdict(Phase::Succeeded, Ending::Halted, false),
            Verdict::Fails
        );
        assert_eq!(verdict(Phase::Staged, Ending::Halted, false), Verdict::Done);
        assert_eq!(verdict(Phase::Staged, Ending::Halted, true), Verdict::Going);
        assert_eq!(
            verdict(Phase::RolledBack, Ending::Halted, false),
            Verdict::Done
        );
    }
}
