//! The checks of each API object as a whole (release, plan, rollout) and the parts only a
//! rollout has (drain settings, label selectors); the field checks they share are in the
//! parent module.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{Collector, Problems, check_content, check_object_name};

impl crate::NodeRelease {
    /// Every problem with this release that the CRD schema cannot catch.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut out = Collector::default();
        if self.spec.version.trim().is_empty() {
            out.invalid("spec.version", "must not be empty");
        }
        check_content(&self.spec.content, "spec", &mut out);
        out.finish()
    }
}

impl crate::NodeUpdatePlan {
    /// Every problem with this plan that the CRD schema cannot catch. The agent runs this
    /// before any I/O, then its node-local policy.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut out = Collector::default();
        let name = self.metadata.name.as_deref().unwrap_or_default();
        if self.spec.node_name != name {
            out.invalid(
                "spec.nodeName",
                format!(
                    "{:?} differs from metadata.name {name:?}",
                    self.spec.node_name
                ),
            );
        }
        check_content(&self.spec.content, "spec", &mut out);
        if let Some(stated) = &self.spec.revision {
            let computed = crate::revision_of(&self.spec.content);
            if *stated != computed {
                out.invalid(
                    "spec.revision",
                    format!(
                        "{stated:?} does not match the content, whose revision is {computed:?}"
                    ),
                );
            }
        }
        out.finish()
    }
}

impl crate::NodeRollout {
    /// Every problem with this rollout that the CRD schema cannot catch (all in its spec).
    pub fn validate(&self) -> Result<(), Problems> {
        self.spec.validate()
    }
}

impl crate::NodeRolloutSpec {
    /// Every problem with a rollout's spec that the CRD schema cannot catch, the fields
    /// named from the rollout (`spec.…`): the controller's decision checks it every round,
    /// where only the spec is at hand.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut out = Collector::default();
        if let Err(message) = check_object_name(&self.release) {
            out.invalid("spec.release", message);
        }
        check_count_or_percent(&self.max_unavailable, "spec.maxUnavailable", &mut out);
        if let Some(staging) = &self.staging {
            check_count_or_percent(
                &staging.max_concurrent,
                "spec.staging.maxConcurrent",
                &mut out,
            );
        }
        if self.max_failures < 0 {
            out.invalid("spec.maxFailures", "must not be negative");
        }
        if self.drain_timeout.get().is_zero() {
            out.invalid("spec.drainTimeout", "must be positive");
        }
        check_label_selector(&self.node_selector, "spec.nodeSelector", &mut out);
        self.drain.check(&mut out);
        for (i, window) in self.maintenance_windows.iter().enumerate() {
            window.check(&format!("spec.maintenanceWindows[{i}]"), &mut out);
        }
        if !(0..=86_400).contains(&self.min_ready_seconds) {
            out.invalid("spec.minReadySeconds", "must be from 0 to 86400");
        }
        if let Some(deadline) = &self.progress_deadline
            && deadline.get() <= self.drain_timeout.get()
        {
            out.invalid(
                "spec.progressDeadline",
                "progressDeadline must be longer than drainTimeout: it counts from the grant, drain included",
            );
        }
        self.gates.check("spec.gates", &mut out);
        if let Some(spread) = &self.max_unavailable_per_topology {
            if let Err(message) = check_label_key(&spread.key) {
                out.invalid("spec.maxUnavailablePerTopology.key", message);
            }
            if !(1..=100_000).contains(&spread.max) {
                out.invalid(
                    "spec.maxUnavailablePerTopology.max",
                    "must be from 1 to 100000",
                );
            }
        }
        out.finish()
    }
}

impl crate::DrainSpec {
    /// What the CRD's schema and CEL refuse of `spec.drain`.
    fn check(&self, out: &mut Collector) {
        if let Some(selector) = &self.pod_selector {
            check_label_selector(selector, "spec.drain.podSelector", out);
            let empty = selector.match_labels.as_ref().is_none_or(|l| l.is_empty())
                && selector
                    .match_expressions
                    .as_ref()
                    .is_none_or(|e| e.is_empty());
            if empty {
                out.invalid(
                    "spec.drain.podSelector",
                    "an empty podSelector would leave every pod alone; use disruption: Cordon for that",
                );
            }
        }
        if let Some(seconds) = self.grace_period_seconds
            && !(1..=86_400).contains(&seconds)
        {
            out.invalid("spec.drain.gracePeriodSeconds", "must be from 1 to 86400");
        }
        if self.on_timeout == crate::OnDrainTimeout::Force && !self.allow_force {
            out.invalid(
                "spec.drain.onTimeout",
                "onTimeout: Force deletes pods without eviction, ignoring PodDisruptionBudgets; it needs allowForce: true",
            );
        }
    }
}

fn check_label_selector(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    at: &str,
    out: &mut Collector,
) {
    for (key, value) in selector.match_labels.iter().flatten() {
        if let Err(message) = check_label_key(key) {
            out.invalid(format!("{at}.matchLabels[{key}]"), message);
        }
        if let Err(message) = check_label_value(value) {
            out.invalid(format!("{at}.matchLabels[{key}]"), message);
        }
    }
    for (i, requirement) in selector.match_expressions.iter().flatten().enumerate() {
        let path = format!("{at}.matchExpressions[{i}]");
        if let Err(message) = check_label_key(&requirement.key) {
            out.invalid(format!("{path}.key"), message);
        }
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => out.invalid(
                format!("{path}.values"),
                "In and NotIn need at least one value",
            ),
            "Exists" | "DoesNotExist" if !values.is_empty() => out.invalid(
                format!("{path}.values"),
                "Exists and DoesNotExist take no values",
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => out.invalid(
                format!("{path}.operator"),
                format!("{other:?} is not one of In, NotIn, Exists, DoesNotExist"),
            ),
        }
        for (j, value) in values.iter().enumerate() {
            if let Err(message) = check_label_value(value) {
                out.invalid(format!("{path}.values[{j}]"), message);
            }
        }
    }
}

fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_object_name(prefix).map_err(|_| format!("{key:?} has an invalid prefix"))?;
    }
    if name.is_empty() || name.len() > 63 || !is_label_token(name) {
        return Err(format!("{key:?} is not a valid label key"));
    }
    Ok(())
}

fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 || !is_label_token(value) {
        return Err(format!("{value:?} is not a valid label value"));
    }
    Ok(())
}

fn is_label_token(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A count of nodes (at least 1) or a percentage of them (1% to 100%), at `path`.
fn check_count_or_percent(value: &IntOrString, path: &str, out: &mut Collector) {
    match value {
        IntOrString::Int(n) if *n < 1 => out.invalid(path, format!("{n} must be at least 1")),
        IntOrString::String(s) if crate::rollout_slots::parse_percent(s).is_none() => out.invalid(
            path,
            format!("{s:?} is not a number or a percentage from 1% to 100%"),
        ),
        _ => {}
    }
}
