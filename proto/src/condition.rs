//! Writing a condition: one rule for every controller and the agent. A condition's
//! `lastTransitionTime` moves only when its status changes; a new reason or message under
//! the same status keeps the time (as the Kubernetes API conventions ask).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::reason::Reason;

/// `status: "True"`.
pub const TRUE: &str = "True";
/// `status: "False"`.
pub const FALSE: &str = "False";

/// The condition status for `status`: `"True"` or `"False"`.
pub fn status_text(status: bool) -> &'static str {
    if status { TRUE } else { FALSE }
}

/// What a writer wants one condition to say; [`ConditionUpdate::into_condition`] turns it
/// into the condition to write, with its transition time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionUpdate {
    /// The condition type, one of the constants in [`crate::reason`].
    pub type_: &'static str,
    /// True or False (inplace never writes `Unknown`).
    pub status: bool,
    /// Why, from the closed set.
    pub reason: Reason,
    /// The human message.
    pub message: String,
}

impl ConditionUpdate {
    /// A condition of `type_` with this status, reason and message.
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: Reason,
        message: impl Into<String>,
    ) -> Self {
        ConditionUpdate {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }

    /// The condition to write, given the conditions the object carries now: the
    /// `lastTransitionTime` of the condition of the same type is kept while the status is
    /// the same, and is `now` otherwise (a new condition, or a changed status).
    pub fn into_condition(
        self,
        previous: &[Condition],
        observed_generation: Option<i64>,
        now: Timestamp,
    ) -> Condition {
        let status = status_text(self.status);
        let last_transition_time = find(previous, self.type_)
            .filter(|c| c.status == status)
            .map_or(Time(now), |c| c.last_transition_time.clone());
        Condition {
            type_: self.type_.to_owned(),
            status: status.to_owned(),
            reason: self.reason.as_str().to_owned(),
            message: self.message,
            observed_generation,
            last_transition_time,
        }
    }
}

/// Sets one condition in place: replaces the condition of the same type (keeping its
/// `lastTransitionTime` while the status holds, see [`ConditionUpdate::into_condition`]) or
/// appends it.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    update: ConditionUpdate,
    observed_generation: Option<i64>,
    now: Timestamp,
) {
    let condition = update.into_condition(conditions, observed_generation, now);
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(slot) => *slot = condition,
        None => conditions.push(condition),
    }
}

/// The condition of `type_`, if there is one.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is there with status True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == TRUE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reason::{plan_condition, rollout_condition};

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("in range")
    }

    fn existing(status: bool, at: i64) -> Vec<Condition> {
        vec![
            ConditionUpdate::new(plan_condition::READY, status, Reason::Staged, "staged")
                .into_condition(&[], Some(1), t(at)),
        ]
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_changes() {
        struct Case {
            name: &'static str,
            previous: Vec<Condition>,
            status: bool,
            reason: Reason,
            transition_at: i64,
        }
        let cases = [
            Case {
                name: "new condition",
                previous: Vec::new(),
                status: true,
                reason: Reason::Succeeded,
                transition_at: 50,
            },
            Case {
                name: "same status, same reason",
                previous: existing(false, 10),
                status: false,
                reason: Reason::Staged,
                transition_at: 10,
            },
            Case {
                name: "same status, new reason and message",
                previous: existing(false, 10),
                status: false,
                reason: Reason::Activating,
                transition_at: 10,
            },
            Case {
                name: "status changed",
                previous: existing(false, 10),
                status: true,
                reason: Reason::Succeeded,
                transition_at: 50,
            },
            Case {
                name: "only another type carries the status",
                previous: vec![
                    ConditionUpdate::new(plan_condition::DEGRADED, true, Reason::Drifted, "x")
                        .into_condition(&[], None, t(10)),
                ],
                status: true,
                reason: Reason::Succeeded,
                transition_at: 50,
            },
        ];
        for case in cases {
            let c = ConditionUpdate::new(plan_condition::READY, case.status, case.reason, "now")
                .into_condition(&case.previous, Some(2), t(50));
            assert_eq!(
                c.last_transition_time,
                Time(t(case.transition_at)),
                "{}",
                case.name
            );
            assert_eq!(c.status, status_text(case.status), "{}", case.name);
            assert_eq!(c.reason, case.reason.as_str(), "{}", case.name);
            assert_eq!(c.message, "now", "{}", case.name);
            assert_eq!(c.observed_generation, Some(2), "{}", case.name);
        }
    }

    #[test]
    fn set_condition_replaces_its_type_and_leaves_the_others() {
        let mut conditions = existing(false, 10);
        let halted = ConditionUpdate::new(rollout_condition::HALTED, false, Reason::AsExpected, "");
        set_condition(&mut conditions, halted, Some(3), t(20));
        let ready = ConditionUpdate::new(plan_condition::READY, false, Reason::Verifying, "12s");
        set_condition(&mut conditions, ready, Some(3), t(30));
        assert_eq!(conditions.len(), 2);
        let ready = find(&conditions, plan_condition::READY).expect("ready");
        assert_eq!(ready.reason, "Verifying");
        assert_eq!(ready.last_transition_time, Time(t(10)));
        assert!(!is_true(&conditions, rollout_condition::HALTED));
        let now_true = ConditionUpdate::new(plan_condition::READY, true, Reason::Succeeded, "");
        set_condition(&mut conditions, now_true, Some(3), t(40));
        assert!(is_true(&conditions, plan_condition::READY));
        assert_eq!(
            find(&conditions, plan_condition::READY).map(|c| &c.last_transition_time),
            Some(&Time(t(40)))
        );
    }
}
