//! A NodeRollout's health gates: what must hold in the cluster before a new activation
//! starts. Types only; the controller asks Prometheus which alerts fire
//! (`controller/src/rollout/alert_gate.rs`) and judges the answer (`controller/src/decision/health.rs`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validate::Collector;

/// The shape of an alert name: Prometheus' classic metric-name characters (alerting rules
/// are named that way; `alertname` is the rule's name).
pub const ALERT_NAME_PATTERN: &str = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$";

/// The longest alert name accepted.
pub const ALERT_NAME_MAX: usize = 256;

/// The most alerts one rollout may list.
pub const ALERTS_MAX: usize = 64;

/// `spec.gates`: cluster health that must hold before a new activation starts. Empty (the
/// default): no gate beyond the one every rollout has (each node that already runs the
/// release must be `Ready`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutGates {
    /// Prometheus alert names (the `alertname` label): while any of them fires, no new
    /// activation starts (staging goes on; activations already started finish). The
    /// controller asks the Prometheus named by its `--prometheus-url`; when it cannot get an
    /// answer (unset, down, too slow, not Prometheus' JSON) the gate stays closed, with
    /// reason `GateUnavailable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[schemars(extend("items" = {"type": "string", "minLength": 1, "maxLength": 256, "pattern": ALERT_NAME_PATTERN}))]
    pub alerts: Vec<String>,
}

impl RolloutGates {
    /// Whether no gate is set.
    pub fn is_empty(&self) -> bool {
        self.alerts.is_empty()
    }

    /// What the CRD schema refuses, for objects that never met an API server.
    pub(crate) fn check(&self, at: &str, out: &mut Collector) {
        if self.alerts.len() > ALERTS_MAX {
            out.invalid(
                format!("{at}.alerts"),
                format!("at most {ALERTS_MAX} alerts"),
            );
        }
        for (i, name) in self.alerts.iter().enumerate() {
            let field = format!("{at}.alerts[{i}]");
            if !is_alert_name(name) {
                out.invalid(
                    field.clone(),
                    format!("{name:?} is not an alert name (letters, digits, '_' and ':', not starting with a digit, at most {ALERT_NAME_MAX})"),
                );
            }
            if self.alerts[..i].contains(name) {
                out.invalid(field, format!("{name:?} is listed twice"));
            }
        }
    }
}

fn is_alert_name(name: &str) -> bool {
    name.len() <= ALERT_NAME_MAX
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || matches!(c, '_' | ':'))
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(alerts: &[&str]) -> Vec<String> {
        let gates = RolloutGates {
            alerts: alerts.iter().map(|a| (*a).to_owned()).collect(),
        };
        let mut out = Collector::default();
        gates.check("spec.gates", &mut out);
        match out.finish() {
            Ok(()) => Vec::new(),
            Err(problems) => problems.0.iter().map(|p| p.path.clone()).collect(),
        }
    }

    #[test]
    fn alert_names_are_checked_by_shape_and_once_each() {
        assert!(problems(&["KubeNodeNotReady", "job:errors:high", "_x"]).is_empty());
        assert_eq!(
            problems(&["", "9lives", "has space"]),
            [
                "spec.gates.alerts[0]",
                "spec.gates.alerts[1]",
                "spec.gates.alerts[2]"
            ]
        );
        assert_eq!(problems(&["A", "A"]), ["spec.gates.alerts[1]"]);
        assert_eq!(problems(&[&"a".repeat(257)]), ["spec.gates.alerts[0]"]);
    }
}
