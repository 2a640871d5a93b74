//! The decision's table tests, one file per phase under `tests/`, and the fixtures they
//! share: a rollout's spec, nodes at each step of an update, the decision's input and what
//! to read from its output.

use super::*;
use std::collections::BTreeMap;

use inplace_proto::{
    Disruption, Duration, NodeCounts, NodeRolloutSpec, Phase, TopologySpread,
    rollout_slots::activation_slots,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::SignedDuration;
use proptest::prelude::*;

const REV: &str = "aaaaaaaaaaaa";
const OLD: &str = "bbbbbbbbbbbb";

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn spec(max_unavailable: IntOrString, max_failures: i32) -> NodeRolloutSpec {
    NodeRolloutSpec {
        release: "rel".into(),
        node_selector: Default::default(),
        max_unavailable,
        max_failures,
        disruption: Disruption::None,
        drain_timeout: Duration::from_secs(60),
        drain: Default::default(),
        paused: false,
        allow_downgrade: false,
        allow_version_skew: false,
        maintenance_windows: Vec::new(),
        min_ready_seconds: 0,
        progress_deadline: None,
        max_unavailable_per_topology: None,
        gates: Default::default(),
        count_foreign_disruption: true,
        staging: None,
    }
}

pub(super) fn node(name: &str) -> NodeView {
    NodeView::ready_worker(name)
}

pub(super) fn cp(name: &str) -> NodeView {
    NodeView {
        control_plane: true,
        ..node(name)
    }
}

fn report(phase: Phase, target: &str, current: Option<&str>) -> PlanReport {
    PlanReport {
        phase: Some(phase),
        target_revision: Some(target.into()),
        current_revision: current.map(Into::into),
        ..PlanReport::default()
    }
}

fn plan(desired: DesiredState, report: PlanReport) -> PlanView {
    PlanView {
        intent: PlanIntent {
            revision: REV.into(),
            desired_state: desired,
            granted_at: None,
            ready_since: None,
            cordoned: false,
            drain_timeout: None,
            allow_downgrade: false,
        },
        retry_pending: false,
        report,
    }
}

/// Plan staged, waiting for a slot.
fn staged(mut n: NodeView) -> NodeView {
    n.plan = Some(plan(
        DesiredState::Staged,
        report(Phase::Staged, REV, Some(OLD)),
    ));
    n
}

/// Holding a slot, agent activating.
fn activating(mut n: NodeView) -> NodeView {
    let mut p = plan(
        DesiredState::Active,
        report(Phase::Activating, REV, Some(OLD)),
    );
    p.intent.granted_at = Some(t(0));
    n.plan = Some(p);
    n
}

fn succeeded(mut n: NodeView) -> NodeView {
    let mut p = plan(
        DesiredState::Active,
        report(Phase::Succeeded, REV, Some(REV)),
    );
    p.intent.granted_at = Some(t(0));
    n.plan = Some(p);
    n
}

fn failed(mut n: NodeView, phase: Phase, reason: &str) -> NodeView {
    let mut r = report(phase, REV, Some(OLD));
    r.reason = Some(reason.into());
    r.message = Some(format!("{reason} on {}", n.name));
    let mut p = plan(DesiredState::Active, r);
    p.intent.granted_at = Some(t(0));
    n.plan = Some(p);
    n
}

fn input<'a>(spec: &'a NodeRolloutSpec, nodes: Vec<NodeView>) -> RolloutInput<'a> {
    RolloutInput {
        name: "ro",
        generation: Some(3),
        spec,
        previous: None,
        release: ReleaseState::Valid {
            revision: REV.into(),
        },
        architectures: None,
        nodes,
        order: NodeOrder::Any,
        alerts: AlertObservation::NotAsked,
        versions: KubernetesVersions::default(),
        kured: None,
        now: t(100),
    }
}

fn condition<'a>(d: &'a Decision, type_: &str) -> &'a Condition {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

/// The nodes granted a slot by `d`, decided at `t(100)` as the table tests are.
fn granted(d: &Decision) -> Vec<String> {
    granted_at(d, t(100))
}

/// The nodes granted a slot by `d`, decided at `now`: plans written with `grantedAt` = now.
/// A plan rewritten later keeps its grant time (a failed node uncordoned, say), so only the
/// decision's own `now` tells a new grant.
fn granted_at(d: &Decision, now: Timestamp) -> Vec<String> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            NodeAction::ApplyPlan { node, intent } if intent.granted_at == Some(now) => {
                Some(node.clone())
            }
            _ => None,
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn applies(d: &Decision) -> Vec<(&str, &PlanIntent)> {
    d.actions
        .iter()
        .filter_map(|a| match a {
            NodeAction::ApplyPlan { node, intent } => Some((node.as_str(), intent)),
            _ => None,
        })
        .collect()
}

/// The round's writes but the autoscaler's annotation (`tests/autoscaler.rs`).
fn without_scale_down(d: &Decision) -> Vec<&NodeAction> {
    d.actions
        .iter()
        .filter(|a| {
            !matches!(
                a,
                NodeAction::DisableScaleDown { .. } | NodeAction::RestoreScaleDown { .. }
            )
        })
        .collect()
}

fn has_event(d: &Decision, reason: &str) -> bool {
    d.events.iter().any(|e| e.reason == reason)
}

fn draining(name: &str, granted_at: i64) -> NodeView {
    let mut n = staged(node(name));
    n.unschedulable = true;
    // Marked with its grant (`autoscaler.rs`).
    n.scale_down = ScaleDownMark {
        disabled: true,
        ours: true,
    };
    let p = n.plan.as_mut().unwrap();
    p.intent.granted_at = Some(t(granted_at));
    p.intent.cordoned = true;
    n
}

/// What a write does to the simulated node.
fn carry_out(v: &mut NodeView, action: &NodeAction) {
    match action {
        NodeAction::ApplyPlan { intent, .. } => {
            let p = v.plan.get_or_insert_with(PlanView::default);
            p.intent.revision = std::sync::Arc::clone(&intent.revision);
            p.intent.desired_state = intent.desired_state;
            p.intent.granted_at = intent.granted_at;
            p.intent.ready_since = intent.ready_since;
            p.intent.cordoned = intent.cordoned;
            p.intent.drain_timeout = intent.drain_timeout.clone();
        }
        NodeAction::Cordon { .. } => v.unschedulable = true,
        NodeAction::Uncordon { .. } => v.unschedulable = false,
        NodeAction::DisableScaleDown { .. } => {
            v.scale_down = ScaleDownMark {
                disabled: true,
                ours: true,
            }
        }
        NodeAction::RestoreScaleDown { .. } => v.scale_down = ScaleDownMark::default(),
    }
}

mod architecture;
mod autoscaler;
mod cordon;
mod drain;
mod foreign;
mod grant;
mod guard;
mod health;
mod kured;
mod memo;
mod outcome;
mod ownership;
mod simulation;
mod staging;
mod status;
mod steering;
mod timing;
mod topology;
mod version_skew;
