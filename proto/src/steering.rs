//! Per-node steering: annotations a person sets on a Node with `kubectl annotate` (or
//! `kubectl inplace hold|release|skip NODE`) to steer the rollout that owns the node. They
//! live on the Node, not on its plan: they are a person's word about the machine, they may
//! be set before any rollout has written a plan, and the controller never writes them.

use std::collections::BTreeMap;

/// On a Node: not activated until the annotation is removed (staging goes on; a node held
/// while its drain runs gives its slot back and is uncordoned).
pub const HOLD_ANNOTATION: &str = "inplace.dev/hold";

/// On a Node: left at the revision it runs; counted as skipped in the rollout's status,
/// never as failed (a failed node that is skipped no longer counts toward `maxFailures`).
pub const SKIP_ANNOTATION: &str = "inplace.dev/skip";

/// On a NodeUpdatePlan (not the Node: the agent reads only its plan): retry the plan's
/// revision once although it failed on the node. The value is a token a person chooses
/// (`kubectl inplace retry NODE` writes the time); a new token asks for a new retry. The
/// agent honours a token once, while the plan asks for `Staged` (the controller moves a
/// failed node's plan there when it sees the token): it forgets the revision's failure and
/// reports the token in `status.retryHonoured`, from where a token is never honoured again.
pub const RETRY_ANNOTATION: &str = "inplace.dev/retry";

/// The retry token on a plan that its agent has not honoured yet: `None` without one, or
/// once `status.retryHonoured` shows it. An empty value asks for nothing.
pub fn pending_retry<'a>(
    annotations: Option<&'a BTreeMap<String, String>>,
    honoured: Option<&str>,
) -> Option<&'a str> {
    annotations
        .and_then(|a| a.get(RETRY_ANNOTATION))
        .map(|token| token.trim())
        .filter(|token| !token.is_empty() && Some(*token) != honoured)
}

/// The steering a person asked for on one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Steering {
    /// [`HOLD_ANNOTATION`] is set.
    pub hold: bool,
    /// [`SKIP_ANNOTATION`] is set.
    pub skip: bool,
}

impl Steering {
    /// Reads a Node's annotations: an annotation is set when present with any value but
    /// `false` (so `kubectl annotate node N inplace.dev/hold=false --overwrite` also
    /// releases).
    pub fn of(annotations: Option<&BTreeMap<String, String>>) -> Steering {
        let set = |key: &str| {
            annotations
                .and_then(|a| a.get(key))
                .is_some_and(|v| v.trim() != "false")
        };
        Steering {
            hold: set(HOLD_ANNOTATION),
            skip: set(SKIP_ANNOTATION),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_annotation_counts_unless_it_says_false() {
        let cases = [
            (vec![], Steering::default()),
            (
                vec![(HOLD_ANNOTATION, "true")],
                Steering {
                    hold: true,
                    skip: false,
                },
            ),
            (
                vec![(HOLD_ANNOTATION, "")],
                Steering {
                    hold: true,
                    skip: false,
                },
            ),
            (vec![(HOLD_ANNOTATION, "false")], Steering::default()),
            (
                vec![(SKIP_ANNOTATION, "yes")],
                Steering {
                    hold: false,
                    skip: true,
                },
            ),
            (
                vec![(HOLD_ANNOTATION, "true"), (SKIP_ANNOTATION, "true")],
                Steering {
                    hold: true,
                    skip: true,
                },
            ),
        ];
        for (set, want) in cases {
            let map: BTreeMap<String, String> = set
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            assert_eq!(Steering::of(Some(&map)), want, "{set:?}");
        }
    }

    #[test]
    fn a_retry_token_is_pending_until_it_is_honoured() {
        let with = |token: &str| BTreeMap::from([(RETRY_ANNOTATION.to_owned(), token.to_owned())]);
        let cases = [
            (None, None, None),
            (Some(with("t1")), None, Some("t1")),
            (Some(with(" t1 ")), None, Some("t1")),
            (Some(with("t1")), Some("t1"), None),
            (Some(with("t2")), Some("t1"), Some("t2")),
            (Some(with("")), None, None),
        ];
        for (annotations, honoured, want) in cases {
            assert_eq!(
                pending_retry(annotations.as_ref(), honoured),
                want,
                "{annotations:?} honoured {honoured:?}"
            );
        }
    }
}
