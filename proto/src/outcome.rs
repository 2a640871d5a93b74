//! One reading of an agent's report: has the node reached a revision, failed it, or is
//! the agent still working on it? The rollout controller, the Cluster API extension and
//! `kubectl inplace` all ask this question of a plan's status, and all answer it here.
//!
//! The rules, in order (`R` is the revision asked about, `G` the plan's generation):
//!
//! 1. **Needs a person.** Phase `Failed` with the `Degraded` condition True (a rollback
//!    failed): the agent does nothing more on this node whatever the plan says, so it is
//!    a failure of `R` even when `currentRevision` is `R`.
//! 2. **Reached.** `currentRevision` is `R` (committed and verified), unless the agent is
//!    in the middle of a disruptive step (`Activating`, `Verifying`, `RollingBack`) towards
//!    another revision: then the node is about to run something else.
//! 3. **Not picked up.** No status, a status about another target revision, or one
//!    written for an older generation of the plan (`observedGeneration < G`; a status
//!    without `observedGeneration` is judged by its target revision alone). Such a status
//!    says nothing about `R` as the plan now asks for it — in particular a `Failed` it
//!    reports may be the refusal of a spec that has since changed, and `failedRevisions`
//!    listing `R` says only that the agent *will* deny `R`, which it then reports itself,
//!    with its own reason.
//! 4. **Failed.** Phase `RolledBack` or `Failed` for `R`.
//! 5. **Reached**, too: phase `Succeeded` for `R` (it means "committed"; the agent writes
//!    `currentRevision` in the same status, so the two disagree only in a status written by
//!    something else).
//! 6. **Working.** Any other phase for `R` (none yet reads as `Pending`).

use crate::condition;
use crate::plan::{NodeUpdatePlanStatus, Phase};
use crate::reason::plan_condition;

/// What a plan's status says about one revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The status does not describe this revision of the plan yet.
    NotPickedUp,
    /// The agent works on the revision; the phase says how far.
    Working(Phase),
    /// The node runs the revision, committed.
    Reached,
    /// The revision failed on the node; the phase is `RolledBack` or `Failed`.
    Failed(Phase),
}

/// The parts of a plan's status that [`Outcome`] is read from, borrowed, for callers that
/// keep a slimmed copy of the status rather than the status itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentReport<'a> {
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// `status.phase`.
    pub phase: Option<Phase>,
    /// `status.targetRevision`.
    pub target_revision: Option<&'a str>,
    /// `status.currentRevision`.
    pub current_revision: Option<&'a str>,
    /// Whether the `Degraded` condition is True.
    pub degraded: bool,
}

impl AgentReport<'_> {
    /// What this report says about `revision` of a plan at `generation` (see the module
    /// documentation for the rules).
    pub fn outcome_for(&self, revision: &str, generation: Option<i64>) -> Outcome {
        if self.phase == Some(Phase::Failed) && self.degraded {
            return Outcome::Failed(Phase::Failed);
        }
        let busy = self.phase.is_some_and(Phase::is_disruptive);
        if self.current_revision == Some(revision) && !busy {
            return Outcome::Reached;
        }
        let stale = matches!(
            (self.observed_generation, generation),
            (Some(observed), Some(generation)) if observed < generation
        );
        if self.target_revision != Some(revision) || stale {
            return Outcome::NotPickedUp;
        }
        match self.phase {
            Some(Phase::Succeeded) => Outcome::Reached,
            Some(phase @ (Phase::RolledBack | Phase::Failed)) => Outcome::Failed(phase),
            phase => Outcome::Working(phase.unwrap_or(Phase::Pending)),
        }
    }
}

impl Phase {
    /// Whether the agent is swapping, restarting or health-checking: what runs is in
    /// flux until the phase ends, whichever revision the plan names meanwhile.
    pub fn is_disruptive(self) -> bool {
        matches!(
            self,
            Phase::Activating | Phase::Verifying | Phase::RollingBack
        )
    }
}

impl NodeUpdatePlanStatus {
    /// The parts of the status [`Outcome`] is read from.
    pub fn agent_report(&self) -> AgentReport<'_> {
        AgentReport {
            observed_generation: self.observed_generation,
            phase: self.phase,
            target_revision: self.target_revision.as_deref(),
            current_revision: self.current_revision.as_deref(),
            degraded: condition::is_true(&self.conditions, plan_condition::DEGRADED),
        }
    }

    /// What the status says about `revision` of a plan at `generation`.
    pub fn outcome_for(&self, revision: &str, generation: Option<i64>) -> Outcome {
        self.agent_report().outcome_for(revision, generation)
    }
}

/// What a plan's status — possibly absent — says about `revision` of the plan at
/// `generation`: no status is [`Outcome::NotPickedUp`].
pub fn outcome_of(
    status: Option<&NodeUpdatePlanStatus>,
    revision: &str,
    generation: Option<i64>,
) -> Outcome {
    status.map_or(Outcome::NotPickedUp, |s| {
        s.outcome_for(revision, generation)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::condition::ConditionUpdate;
    use crate::reason::Reason;
    use k8s_openapi::jiff::Timestamp;

    const R: &str = "rrrrrrrr";
    const OLD: &str = "oooooooo";
    const NEXT: &str = "nnnnnnnn";

    /// A status as the agent writes it: about `target`, for generation 2, running OLD.
    fn status(phase: Phase, target: &str) -> NodeUpdatePlanStatus {
        NodeUpdatePlanStatus {
            observed_generation: Some(2),
            phase: Some(phase),
            target_revision: Some(target.to_owned()),
            current_revision: Some(OLD.to_owned()),
            ..NodeUpdatePlanStatus::default()
        }
    }

    fn degraded(mut s: NodeUpdatePlanStatus) -> NodeUpdatePlanStatus {
        let update = ConditionUpdate::new(
            plan_condition::DEGRADED,
            true,
            Reason::RollbackFailed,
            "needs a person",
        );
        s.conditions
            .push(update.into_condition(&[], Some(2), Timestamp::UNIX_EPOCH));
        s
    }

    /// Every edge case the three former readings (rollout decision, Cluster API extension,
    /// kubectl plugin) had, with the one answer now given; the comment names who read it
    /// otherwise before.
    #[test]
    fn one_reading_of_a_plans_status() {
        let edit = |mut s: NodeUpdatePlanStatus, f: &dyn Fn(&mut NodeUpdatePlanStatus)| {
            f(&mut s);
            s
        };
        let cases: Vec<(&str, Option<NodeUpdatePlanStatus>, Outcome)> = vec![
            ("no status", None, Outcome::NotPickedUp),
            (
                "empty status",
                Some(NodeUpdatePlanStatus::default()),
                Outcome::NotPickedUp,
            ),
            (
                "downloading R",
                Some(status(Phase::Downloading, R)),
                Outcome::Working(Phase::Downloading),
            ),
            (
                "target R, no phase yet",
                Some(edit(status(Phase::Pending, R), &|s| s.phase = None)),
                Outcome::Working(Phase::Pending),
            ),
            (
                "staged R",
                Some(status(Phase::Staged, R)),
                Outcome::Working(Phase::Staged),
            ),
            (
                "committed R",
                Some(edit(status(Phase::Succeeded, R), &|s| {
                    s.current_revision = Some(R.into())
                })),
                Outcome::Reached,
            ),
            // The extension waited for currentRevision as well.
            (
                "Succeeded for R, currentRevision not (yet) R",
                Some(status(Phase::Succeeded, R)),
                Outcome::Reached,
            ),
            (
                "rolled back from R",
                Some(status(Phase::RolledBack, R)),
                Outcome::Failed(Phase::RolledBack),
            ),
            (
                "refused R",
                Some(status(Phase::Failed, R)),
                Outcome::Failed(Phase::Failed),
            ),
            // The controller and the plugin trusted a status written for generation 1.
            (
                "Failed for R, written for an older generation of the plan",
                Some(edit(status(Phase::Failed, R), &|s| {
                    s.observed_generation = Some(1)
                })),
                Outcome::NotPickedUp,
            ),
            (
                "staged R for an older generation",
                Some(edit(status(Phase::Staged, R), &|s| {
                    s.observed_generation = Some(1)
                })),
                Outcome::NotPickedUp,
            ),
            (
                "no observedGeneration: judged by the target revision",
                Some(edit(status(Phase::Staged, R), &|s| {
                    s.observed_generation = None
                })),
                Outcome::Working(Phase::Staged),
            ),
            (
                "status about another revision",
                Some(status(Phase::Staged, NEXT)),
                Outcome::NotPickedUp,
            ),
            // The controller read another revision's failure as R's when R was listed.
            (
                "another revision rolled back, R in failedRevisions",
                Some(edit(status(Phase::RolledBack, NEXT), &|s| {
                    s.failed_revisions = vec![R.into(), NEXT.into()]
                })),
                Outcome::NotPickedUp,
            ),
            (
                "R denied, listed in failedRevisions",
                Some(edit(status(Phase::Failed, R), &|s| {
                    s.failed_revisions = vec![R.into()]
                })),
                Outcome::Failed(Phase::Failed),
            ),
            // The extension waited for the agent to report on R although the node runs it.
            (
                "runs R, status still about a later revision it staged",
                Some(edit(status(Phase::Staged, NEXT), &|s| {
                    s.current_revision = Some(R.into())
                })),
                Outcome::Reached,
            ),
            (
                "runs R, another revision rolled back (to R)",
                Some(edit(status(Phase::RolledBack, NEXT), &|s| {
                    s.current_revision = Some(R.into())
                })),
                Outcome::Reached,
            ),
            // The controller and the plugin read this as done while the node swaps.
            (
                "runs R but is activating another revision",
                Some(edit(status(Phase::Activating, NEXT), &|s| {
                    s.current_revision = Some(R.into())
                })),
                Outcome::NotPickedUp,
            ),
            (
                "runs R but is rolling back another revision",
                Some(edit(status(Phase::RollingBack, NEXT), &|s| {
                    s.current_revision = Some(R.into())
                })),
                Outcome::NotPickedUp,
            ),
            // The controller and the plugin read a degraded node that runs R as done.
            (
                "degraded (rollback failed), committed revision R",
                Some(degraded(edit(status(Phase::Failed, R), &|s| {
                    s.current_revision = Some(R.into())
                }))),
                Outcome::Failed(Phase::Failed),
            ),
            (
                "degraded, status still about the revision whose rollback failed",
                Some(degraded(edit(status(Phase::Failed, NEXT), &|s| {
                    s.current_revision = Some(R.into())
                }))),
                Outcome::Failed(Phase::Failed),
            ),
            (
                "degraded by drift but committed and healthy: R is reached",
                Some(degraded(edit(status(Phase::Succeeded, R), &|s| {
                    s.current_revision = Some(R.into())
                }))),
                Outcome::Reached,
            ),
        ];
        for (name, status, want) in cases {
            assert_eq!(outcome_of(status.as_ref(), R, Some(2)), want, "{name}");
        }
    }

    #[test]
    fn a_plan_without_a_generation_trusts_the_target_revision() {
        let mut s = status(Phase::Staged, R);
        s.observed_generation = Some(1);
        assert_eq!(s.outcome_for(R, None), Outcome::Working(Phase::Staged));
        assert_eq!(s.outcome_for(R, Some(1)), Outcome::Working(Phase::Staged));
        assert_eq!(s.outcome_for(R, Some(5)), Outcome::NotPickedUp);
    }
}
