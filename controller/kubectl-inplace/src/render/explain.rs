//! The long form of one plan (`kubectl inplace plan NODE`): every field a person needs to
//! tell why the node is where it is, and what to do next.

use inplace_proto::{HealthChecks, NodeUpdatePlan, Phase, Reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{
    ROLLOUT_LABEL, Style, bar, condition, condition_line, effective_phase, human_bytes,
    human_duration, phase_color, short_revision,
};

fn time_text(t: Option<&Time>, now: Timestamp) -> String {
    match t {
        None => "-".to_owned(),
        Some(t) => {
            let ago = now.duration_since(t.0);
            let ago = std::time::Duration::try_from(ago).unwrap_or_default();
            format!("{} ({} ago)", t.0, human_duration(ago))
        }
    }
}

fn reason_meaning(reason: &str) -> Option<&'static str> {
    Reason::parse(reason).map(Reason::description)
}

/// What to do next, given the plan's phase and Ready reason.
pub fn next_step(plan: &NodeUpdatePlan) -> String {
    let phase = effective_phase(plan);
    let reason = plan
        .status
        .as_ref()
        .and_then(|s| condition(&s.conditions, "Ready"))
        .map(|c| c.reason.as_str())
        .unwrap_or("");
    let node = plan.spec.node_name.as_str();
    match phase {
        Phase::Succeeded => "Nothing: the node runs the plan's revision.".to_owned(),
        Phase::Pending if plan.status.is_none() => format!(
            "Check that the agent runs on {node}: `systemctl status inplace-agent` and \
             `journalctl -u inplace-agent` on the node."
        ),
        Phase::Pending => "Wait: the agent has not started on this revision yet.".to_owned(),
        Phase::Downloading | Phase::Activating | Phase::Verifying | Phase::RollingBack => {
            "Wait: the agent is working; `kubectl inplace plan <node> --watch` follows it."
                .to_owned()
        }
        Phase::Staged => "Wait for the rollout to grant this node an activation slot \
                          (desiredState: Active)."
            .to_owned(),
        Phase::RolledBack | Phase::Failed => {
            let mut s = format!(
                "The revision is denied on {node}; the node keeps its current revision. \
                 Fix the cause ({reason}), then publish a new NodeRelease and point the \
                 rollout at it."
            );
            if reason == "RollbackFailed" {
                s.push_str(&format!(
                    " The node is Degraded: inspect it, then run `inplace-agent clear-degraded` \
                     on {node}."
                ));
            }
            s
        }
    }
}

/// `  health checks: unit kubelet.service, Node Ready (healthy for 30s, give up after 5m)`.
fn health_checks_line(hc: &HealthChecks) -> String {
    let mut checks: Vec<String> = hc.units.iter().map(|u| format!("unit {u}")).collect();
    checks.extend(hc.http.iter().map(|h| format!("GET {}", h.url)));
    if hc.node_kubelet_version {
        checks.push("Node kubeletVersion".to_owned());
    }
    if hc.node_ready {
        checks.push("Node Ready".to_owned());
    }
    format!(
        "  health checks: {} (healthy for {}, give up after {})",
        if checks.is_empty() {
            "none".to_owned()
        } else {
            checks.join(", ")
        },
        hc.window.as_str(),
        hc.timeout.as_str()
    )
}

/// `kubectl inplace plan <node>`: the plan's spec, status and what to do next.
pub fn plan_explain(plan: &NodeUpdatePlan, now: Timestamp, style: &Style) -> Vec<String> {
    let mut lines = Vec::new();
    let name = plan.metadata.name.as_deref().unwrap_or_default();
    let spec = &plan.spec;
    lines.push(style.paint("1", &format!("NodeUpdatePlan {name}")));
    let owner = plan
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ROLLOUT_LABEL))
        .map(|r| format!("NodeRollout {r}"))
        .unwrap_or_else(|| "written by hand (no owning rollout)".to_owned());
    lines.push(format!("  node:          {}", spec.node_name));
    lines.push(format!("  owner:         {owner}"));
    lines.push(format!(
        "  release:       {}",
        spec.release.as_deref().unwrap_or("-")
    ));
    lines.push(format!(
        "  revision:      {}",
        spec.revision.as_deref().unwrap_or("-")
    ));
    lines.push(format!(
        "  desired state: {:?}{}",
        spec.desired_state,
        match spec.desired_state {
            inplace_proto::DesiredState::Staged => " (download, verify and stage only)",
            inplace_proto::DesiredState::Active => " (swap, restart and verify)",
        }
    ));
    lines.push("  artifacts:".to_owned());
    let progress = plan.status.as_ref().map(|s| &s.artifacts);
    for a in &spec.content.artifacts {
        let size = a
            .size
            .map(human_bytes)
            .unwrap_or_else(|| "size ?".to_owned());
        let target = a
            .path
            .as_deref()
            .map(|p| format!(" → {p}"))
            .unwrap_or_default();
        lines.push(format!(
            "    {} ({}, {size}, sha256 {}){target}",
            a.name,
            a.kind.as_str(),
            short_revision(&a.sha256),
        ));
        lines.push(format!("      {}", a.url));
        if let Some(p) = progress.and_then(|p| p.iter().find(|p| p.name == a.name)) {
            let done = u64::try_from(p.bytes_done).unwrap_or(0);
            let total = p
                .bytes_total
                .and_then(|t| u64::try_from(t).ok())
                .unwrap_or(done);
            lines.push(format!(
                "      downloaded {} {} / {}",
                bar(done, total, style.bar_width),
                human_bytes(done),
                human_bytes(total)
            ));
        }
    }
    let act = &spec.content.activation;
    if !act.restart_units.is_empty() {
        let units: Vec<String> = act.restart_units.iter().map(|u| u.to_string()).collect();
        lines.push(format!("  restarts:      {}", units.join(", ")));
    }
    lines.push(health_checks_line(&spec.content.health_checks));
    lines.push(String::new());
    let phase = effective_phase(plan);
    match plan.status.as_ref() {
        None => lines.push("  status:        none yet (the agent has not reported)".to_owned()),
        Some(status) => {
            lines.push(format!(
                "  phase:         {}",
                style.paint(phase_color(phase), &format!("{phase:?}"))
            ));
            if let Some(p) = status.phase
                && p != phase
            {
                lines.push(format!(
                    "                 (agent reports {p:?} for revision {})",
                    short_revision(status.target_revision.as_deref().unwrap_or("-"))
                ));
            }
            lines.push(format!(
                "  current:       {}",
                status.current_revision.as_deref().unwrap_or("-")
            ));
            lines.push(format!(
                "  target:        {}",
                status.target_revision.as_deref().unwrap_or("-")
            ));
            if let Some(p) = status.progress.as_deref() {
                lines.push(format!("  progress:      {p}"));
            }
            if let Some(a) = status.attempts {
                lines.push(format!("  attempts:      {a}"));
            }
            lines.push(format!(
                "  started:       {}",
                time_text(status.started_at.as_ref(), now)
            ));
            lines.push(format!(
                "  finished:      {}",
                time_text(status.finished_at.as_ref(), now)
            ));
            if let Some(v) = status.agent_version.as_deref() {
                lines.push(format!("  agent:         {v}"));
            }
            if !status.failed_revisions.is_empty() {
                lines.push(format!(
                    "  {}",
                    style.paint(
                        "31",
                        &format!("denied revisions: {}", status.failed_revisions.join(", "))
                    )
                ));
            }
            lines.push("  conditions:".to_owned());
            for c in &status.conditions {
                lines.push(format!("    {}", condition_line(c)));
                if let Some(meaning) = reason_meaning(&c.reason) {
                    lines.push(format!("      {} means: {meaning}", c.reason));
                }
            }
        }
    }
    lines.push(String::new());
    lines.push(format!("  next: {}", next_step(plan)));
    lines
}
