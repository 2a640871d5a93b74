//! One shared copy of each revision string among a rollout's node views. The decision
//! compares every owned node's plan revisions (spec, the agent's target and current) with
//! the rollout's revision in every round; with a copy per plan each comparison read a
//! string of its own (a cache miss apiece, the largest share of a round at 30,000 nodes).
//! Shared, equal revisions are the same `Arc` and `Arc`'s `==` compares pointers first;
//! the few distinct ones stay hot in the cache. The decision itself only sees equal
//! strings compare equal, so interning changes no result, only the cost.

use std::collections::HashSet;
use std::sync::Arc;

use crate::decision::{NodeView, ReleaseState};

/// How many distinct revisions a view keeps at most: a rollout sees two or three (the
/// release's and what nodes ran before). Past it (an agent reporting odd revisions) the
/// set starts over; values stay correct, only the sharing of older copies is lost.
const AT_MOST: usize = 64;

/// The revisions a rollout's views share.
#[derive(Debug, Default)]
pub(super) struct Revisions {
    known: HashSet<Arc<str>>,
}

impl Revisions {
    /// The shared copy of `revision`.
    fn share(&mut self, revision: &mut Arc<str>) {
        if let Some(known) = self.known.get(&**revision) {
            *revision = Arc::clone(known);
            return;
        }
        if self.known.len() >= AT_MOST {
            self.known.clear();
        }
        self.known.insert(Arc::clone(revision));
    }

    /// Makes the view's plan revisions the shared copies.
    pub(super) fn share_node(&mut self, view: &mut NodeView) {
        let Some(plan) = &mut view.plan else {
            return;
        };
        self.share(&mut plan.intent.revision);
        for revision in [
            &mut plan.report.target_revision,
            &mut plan.report.current_revision,
        ]
        .into_iter()
        .flatten()
        {
            self.share(revision);
        }
    }

    /// The release with its revision's shared copy.
    pub(super) fn share_release(&mut self, mut release: ReleaseState) -> ReleaseState {
        if let ReleaseState::Valid { revision } = &mut release {
            self.share(revision);
        }
        release
    }

    /// Forgets every revision (the view is rebuilt from scratch).
    pub(super) fn clear(&mut self) {
        self.known.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{NodeView, PlanIntent, PlanReport, PlanView};

    fn node(revision: &str, current: &str) -> NodeView {
        NodeView {
            plan: Some(PlanView {
                intent: PlanIntent {
                    revision: revision.into(),
                    ..PlanIntent::default()
                },
                report: PlanReport {
                    target_revision: Some(revision.into()),
                    current_revision: Some(current.into()),
                    ..PlanReport::default()
                },
                ..PlanView::default()
            }),
            ..NodeView::ready_worker("n")
        }
    }

    #[test]
    fn equal_revisions_become_one_copy_and_keep_their_value() {
        let mut revisions = Revisions::default();
        let release = revisions.share_release(ReleaseState::Valid {
            revision: "new".into(),
        });
        let ReleaseState::Valid { revision: new } = &release else {
            panic!("the release stays valid");
        };
        let (mut a, mut b) = (node("new", "old"), node("new", "old"));
        let unshared = a.clone();
        revisions.share_node(&mut a);
        revisions.share_node(&mut b);
        assert_eq!(a, unshared);
        let (pa, pb) = (a.plan.unwrap(), b.plan.unwrap());
        assert!(Arc::ptr_eq(&pa.intent.revision, new));
        assert!(Arc::ptr_eq(
            pa.report.target_revision.as_ref().unwrap(),
            new
        ));
        let (old_a, old_b) = (pa.report.current_revision, pb.report.current_revision);
        assert!(Arc::ptr_eq(
            old_a.as_ref().unwrap(),
            old_b.as_ref().unwrap()
        ));
    }

    #[test]
    fn odd_revisions_past_the_limit_start_the_set_over() {
        let mut revisions = Revisions::default();
        for i in 0..AT_MOST * 3 {
            revisions.share_node(&mut node(&format!("r{i}"), "old"));
        }
        assert!(revisions.known.len() <= AT_MOST);
    }
}
