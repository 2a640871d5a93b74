//! Pure rendering of rollouts and plans into lines of text: per-node phase and reason, a
//! progress bar for downloads (`status.artifacts` bytes) and one for the rollout
//! (succeeded / total). No I/O: the caller fetches objects and decides where lines go, so
//! `kubectl inplace` and the demo fleet draw the same picture. Colours are ANSI escapes,
//! only when [`Style::color`] is set (the caller sets it when stdout is a terminal).

use inplace_proto::{NodeRollout, NodeUpdatePlan, Outcome, Phase, Reason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The label the controller puts on the plans a rollout owns.
pub const ROLLOUT_LABEL: &str = "inplace.dev/rollout";

/// How to draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// ANSI colours.
    pub color: bool,
    /// Width of a progress bar, in cells.
    pub bar_width: usize,
}

impl Style {
    /// Plain text (logs, files, tests).
    pub fn plain() -> Self {
        Style {
            color: false,
            bar_width: 20,
        }
    }

    /// Colours when `tty` (stdout is a terminal).
    pub fn for_terminal(tty: bool) -> Self {
        Style {
            color: tty,
            ..Style::plain()
        }
    }

    pub(crate) fn paint(&self, code: &str, text: &str) -> String {
        if self.color && !code.is_empty() {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
}

/// `[########------------]  40%`; `total == 0` draws an empty bar at 0%.
pub fn bar(done: u64, total: u64, width: usize) -> String {
    let done = done.min(total);
    let (filled, percent) = if total == 0 {
        (0, 0)
    } else {
        (
            (done as u128 * width as u128 / total as u128) as usize,
            (done as u128 * 100 / total as u128) as u64,
        )
    };
    format!(
        "[{}{}] {percent:>3}%",
        "#".repeat(filled),
        "-".repeat(width - filled)
    )
}

/// `1.5 MiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    format!("{value:.1} {unit}")
}

/// `4.2s`, `1m05s`.
pub fn human_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let whole = d.as_secs();
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

/// The first 8 characters of a revision (they are hex hashes).
pub fn short_revision(revision: &str) -> &str {
    revision.get(..8).unwrap_or(revision)
}

fn phase_color(phase: Phase) -> &'static str {
    match phase {
        Phase::Succeeded => "32",
        Phase::Failed | Phase::RolledBack => "31",
        Phase::RollingBack => "33",
        Phase::Activating | Phase::Verifying => "36",
        Phase::Downloading | Phase::Staged => "34",
        Phase::Pending => "",
    }
}

/// The condition of `type_`, if the plan has one.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// What a plan's node is doing with the plan's *current spec*, as one word, from proto's
/// one reading of the agent's report ([`Outcome`]): `Succeeded` when the node runs the
/// spec's revision, `Pending` when the agent has not picked up this revision and generation
/// yet, else the phase it reports on them (`Failed` for a node that needs a person).
pub fn effective_phase(plan: &NodeUpdatePlan) -> Phase {
    let Some(status) = plan.status.as_ref() else {
        return Phase::Pending;
    };
    // A hand-written plan may leave the revision to the agent, which reports it as target.
    let Some(wanted) = plan
        .spec
        .revision
        .as_deref()
        .or(status.target_revision.as_deref())
    else {
        return status.phase.unwrap_or(Phase::Pending);
    };
    match status.outcome_for(wanted, plan.metadata.generation) {
        Outcome::Reached => Phase::Succeeded,
        Outcome::NotPickedUp => Phase::Pending,
        Outcome::Working(phase) | Outcome::Failed(phase) => phase,
    }
}

/// `(bytes done, bytes total)` over the plan's artifacts, when the agent reported sizes.
pub fn download_progress(plan: &NodeUpdatePlan) -> Option<(u64, u64)> {
    let status = plan.status.as_ref()?;
    if status.artifacts.is_empty() {
        return None;
    }
    let mut done = 0u64;
    let mut total = 0u64;
    for a in &status.artifacts {
        let d = u64::try_from(a.bytes_done).unwrap_or(0);
        // The agent may not know the total before the server says; the plan's size does.
        let planned = plan
            .spec
            .content
            .artifacts
            .iter()
            .find(|s| s.name == a.name)
            .and_then(|s| s.size);
        let t = a
            .bytes_total
            .and_then(|t| u64::try_from(t).ok())
            .or(planned)
            .unwrap_or(d);
        done += d.min(t);
        total += t;
    }
    Some((done, total))
}

/// The Ready condition as `Reason: message` (the reason alone when there is no message).
pub fn ready_summary(plan: &NodeUpdatePlan) -> String {
    let Some(status) = plan.status.as_ref() else {
        return "the agent has not reported yet".to_owned();
    };
    match condition(&status.conditions, "Ready") {
        Some(c) if c.message.is_empty() => c.reason.clone(),
        Some(c) => format!("{}: {}", c.reason, c.message),
        None => status.progress.clone().unwrap_or_default(),
    }
}

/// One line for one node: name, phase, download bar, and what the agent says.
pub fn plan_line(plan: &NodeUpdatePlan, name_width: usize, style: &Style) -> String {
    let name = plan
        .metadata
        .name
        .as_deref()
        .unwrap_or(&plan.spec.node_name);
    let phase = effective_phase(plan);
    let phase_text = style.paint(phase_color(phase), &format!("{:<11}", format!("{phase:?}")));
    let stale = phase == Phase::Pending
        && plan
            .status
            .as_ref()
            .is_some_and(|s| s.target_revision.is_some());
    let (done, total) = match (phase, download_progress(plan)) {
        (Phase::Pending, _) if stale => (0, 0),
        (Phase::Pending, None) => (0, 0),
        (_, Some(p)) => p,
        (_, None) => (1, 1),
    };
    let bytes = if total > 1 {
        format!("{:>9} / {:<9}", human_bytes(done), human_bytes(total))
    } else {
        " ".repeat(21)
    };
    let message = if stale {
        format!(
            "waiting for the agent to pick up revision {}",
            short_revision(plan.spec.revision.as_deref().unwrap_or("?"))
        )
    } else {
        ready_summary(plan)
    };
    format!(
        "  {name:<name_width$}  {phase_text}  {}  {bytes}  {message}",
        bar(done, total, style.bar_width)
    )
}

/// Counts of a rollout's nodes: `(succeeded, total)`, from the rollout's status when the
/// controller has written one, else from the plans.
pub fn rollout_counts(rollout: &NodeRollout, plans: &[&NodeUpdatePlan]) -> (u64, u64) {
    if let Some(status) = current_status(rollout)
        && status.nodes.total > 0
        && status.revision.is_some()
    {
        let ok = |n: i32| u64::try_from(n).unwrap_or(0);
        return (ok(status.nodes.succeeded), ok(status.nodes.total));
    }
    let succeeded = plans
        .iter()
        .filter(|p| effective_phase(p) == Phase::Succeeded)
        .count();
    (succeeded as u64, plans.len() as u64)
}

/// The rollout's status when the controller has caught up with its spec (a status written
/// for an older generation describes the previous release).
pub fn current_status(rollout: &NodeRollout) -> Option<&inplace_proto::NodeRolloutStatus> {
    let status = rollout.status.as_ref()?;
    match (status.observed_generation, rollout.metadata.generation) {
        (Some(seen), Some(now)) if seen < now => None,
        _ => Some(status),
    }
}

/// The plans a rollout owns (by the controller's label), sorted by name.
pub fn plans_of<'a>(rollout: &NodeRollout, plans: &'a [NodeUpdatePlan]) -> Vec<&'a NodeUpdatePlan> {
    let name = rollout.metadata.name.as_deref().unwrap_or_default();
    let mut owned: Vec<&NodeUpdatePlan> = plans
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLLOUT_LABEL))
                .is_some_and(|owner| owner == name)
        })
        .collect();
    owned.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    owned
}

fn condition_line(c: &Condition) -> String {
    if c.message.is_empty() {
        format!("{}={} {}", c.type_, c.status, c.reason)
    } else {
        format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message)
    }
}

/// A rollout with its nodes: header, rollout bar, conditions, one line per node.
pub fn rollout_lines(
    rollout: &NodeRollout,
    plans: &[NodeUpdatePlan],
    style: &Style,
) -> Vec<String> {
    let owned = plans_of(rollout, plans);
    let name = rollout.metadata.name.as_deref().unwrap_or_default();
    let mut lines = Vec::new();
    let revision = current_status(rollout)
        .and_then(|s| s.revision.as_deref())
        .map(|r| format!(" (revision {})", short_revision(r)))
        .unwrap_or_default();
    lines.push(format!(
        "{} → release {}{revision}, maxUnavailable {}, disruption {:?}{}",
        style.paint("1", &format!("NodeRollout {name}")),
        rollout.spec.release,
        match &rollout.spec.max_unavailable {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => n.to_string(),
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
        },
        rollout.spec.disruption,
        if rollout.spec.paused { ", PAUSED" } else { "" },
    ));
    let (succeeded, total) = rollout_counts(rollout, &owned);
    let counts = current_status(rollout)
        .map(|s| {
            let skipped = if s.nodes.skipped > 0 {
                format!(", skipped {}", s.nodes.skipped)
            } else {
                String::new()
            };
            format!(
                "  updating {}, staged {}, pending {}, failed {}{skipped}",
                s.nodes.updating, s.nodes.staged, s.nodes.pending, s.nodes.failed
            )
        })
        .unwrap_or_default();
    lines.push(format!(
        "  rollout {}  {succeeded}/{total} nodes succeeded{counts}",
        bar(succeeded, total, style.bar_width)
    ));
    if let Some(status) = current_status(rollout) {
        for c in &status.conditions {
            if c.status == "True" || c.type_ == "Progressing" {
                let code = match (c.type_.as_str(), c.status.as_str()) {
                    ("Halted", "True") => "31",
                    ("Complete", "True") => "32",
                    _ => "",
                };
                lines.push(format!("  {}", style.paint(code, &condition_line(c))));
            }
        }
        for f in &status.failed_nodes {
            lines.push(format!(
                "  {} {}: {}: {}",
                style.paint("31", "failed"),
                f.node,
                f.reason,
                f.message
            ));
        }
    }
    lines.extend(crate::steering_view::steering_lines(rollout, style));
    let width = owned
        .iter()
        .filter_map(|p| p.metadata.name.as_ref().map(String::len))
        .max()
        .unwrap_or(4)
        .max(4);
    if owned.is_empty() {
        lines.push("  (no plans yet)".to_owned());
    }
    for plan in owned {
        lines.push(plan_line(plan, width, style));
    }
    lines
}

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
    let hc = &spec.content.health_checks;
    let mut checks: Vec<String> = hc.units.iter().map(|u| format!("unit {u}")).collect();
    checks.extend(hc.http.iter().map(|h| format!("GET {}", h.url)));
    if hc.node_kubelet_version {
        checks.push("Node kubeletVersion".to_owned());
    }
    lines.push(format!(
        "  health checks: {} (healthy for {}, give up after {})",
        if checks.is_empty() {
            "none".to_owned()
        } else {
            checks.join(", ")
        },
        hc.window.as_str(),
        hc.timeout.as_str()
    ));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn plan(name: &str, status: serde_json::Value) -> NodeUpdatePlan {
        serde_json::from_value(json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan",
            "metadata": {"name": name, "labels": {"inplace.dev/rollout": "demo"}},
            "spec": {
                "nodeName": name, "revision": "abcdef0123456789", "release": "kubelet-v2",
                "desiredState": "Active",
                "artifacts": [{"name": "kubernetes", "type": "Sysext",
                    "url": "http://127.0.0.1:1/v2/kubernetes-v2.raw",
                    "sha256": "a".repeat(64), "size": 2097152}],
                "activation": {"restartUnits": ["kubelet.service"]},
                "healthChecks": {"units": ["kubelet.service"], "window": "5s", "timeout": "2m"},
            },
            "status": status,
        }))
        .unwrap()
    }

    fn rollout(status: serde_json::Value) -> NodeRollout {
        serde_json::from_value(json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
            "metadata": {"name": "demo"},
            "spec": {"release": "kubelet-v2", "maxUnavailable": 1, "disruption": "Cordon"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn bars_and_sizes() {
        assert_eq!(bar(0, 0, 10), "[----------]   0%");
        assert_eq!(bar(5, 10, 10), "[#####-----]  50%");
        assert_eq!(bar(12, 10, 10), "[##########] 100%");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(
            human_duration(std::time::Duration::from_millis(4200)),
            "4.2s"
        );
        assert_eq!(human_duration(std::time::Duration::from_secs(65)), "1m05s");
    }

    #[test]
    fn downloading_node_shows_bytes_and_bar() {
        let p = plan(
            "node-1",
            json!({"phase": "Downloading", "targetRevision": "abcdef0123456789",
                   "artifacts": [{"name": "kubernetes", "bytesDone": 1048576, "bytesTotal": 2097152}],
                   "conditions": [{"type": "Ready", "status": "False", "reason": "Downloading",
                     "message": "kubernetes 50%", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
        );
        let line = plan_line(&p, 6, &Style::plain());
        assert_eq!(
            line,
            "  node-1  Downloading  [##########----------]  50%    1.0 MiB / 2.0 MiB    Downloading: kubernetes 50%"
        );
    }

    #[test]
    fn a_plan_whose_revision_the_agent_has_not_seen_is_pending() {
        let p = plan(
            "node-1",
            json!({"phase": "Succeeded", "targetRevision": "0000", "currentRevision": "0000"}),
        );
        assert_eq!(effective_phase(&p), Phase::Pending);
        let line = plan_line(&p, 6, &Style::plain());
        assert!(line.contains("Pending"), "{line}");
        assert!(
            line.contains("waiting for the agent to pick up revision abcdef01"),
            "{line}"
        );
        let done = plan(
            "node-2",
            json!({"phase": "Succeeded", "targetRevision": "abcdef0123456789", "currentRevision": "abcdef0123456789"}),
        );
        assert_eq!(effective_phase(&done), Phase::Succeeded);
    }

    #[test]
    fn a_degraded_node_that_runs_the_revision_is_failed_not_succeeded() {
        // A rollback failed; the committed revision is the plan's. The node needs a person.
        let p = plan(
            "node-1",
            json!({"phase": "Failed", "targetRevision": "abcdef0123456789", "currentRevision": "abcdef0123456789",
                   "conditions": [{"type": "Degraded", "status": "True", "reason": "RollbackFailed",
                     "message": "needs a person", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
        );
        assert_eq!(effective_phase(&p), Phase::Failed);
    }

    #[test]
    fn a_report_for_an_older_generation_of_the_plan_is_pending() {
        let mut p = plan(
            "node-1",
            json!({"phase": "Failed", "targetRevision": "abcdef0123456789", "observedGeneration": 1}),
        );
        p.metadata.generation = Some(2);
        assert_eq!(effective_phase(&p), Phase::Pending);
        p.metadata.generation = Some(1);
        assert_eq!(effective_phase(&p), Phase::Failed);
    }

    #[test]
    fn rollout_view_has_a_bar_and_one_line_per_owned_node() {
        let plans = vec![
            plan(
                "node-2",
                json!({"phase": "Verifying", "targetRevision": "abcdef0123456789",
                "conditions": [{"type": "Ready", "status": "False", "reason": "Verifying",
                  "message": "kubelet.service healthy for 2s of 5s", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
            ),
            plan(
                "node-1",
                json!({"phase": "Succeeded", "targetRevision": "abcdef0123456789", "currentRevision": "abcdef0123456789"}),
            ),
        ];
        let r = rollout(json!({"revision": "abcdef0123456789",
            "nodes": {"total": 2, "succeeded": 1, "updating": 1, "staged": 0, "pending": 0, "failed": 0}}));
        let lines = rollout_lines(&r, &plans, &Style::plain());
        assert_eq!(
            lines[0],
            "NodeRollout demo → release kubelet-v2 (revision abcdef01), maxUnavailable 1, disruption Cordon"
        );
        assert!(
            lines[1].contains("[##########----------]  50%  1/2 nodes succeeded"),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains("node-1  Succeeded"), "{lines:?}");
        assert!(lines[3].contains("node-2  Verifying"), "{lines:?}");
        assert!(
            lines[3].contains("kubelet.service healthy for 2s of 5s"),
            "{lines:?}"
        );
        assert!(lines.iter().all(|l| !l.contains('\x1b')));
        let mut moved = r.clone();
        moved.metadata.generation = Some(2);
        moved.status.as_mut().unwrap().observed_generation = Some(1);
        let stale = rollout_lines(&moved, &plans, &Style::plain());
        assert!(
            stale[1].contains("1/2 nodes succeeded") && !stale[0].contains("revision"),
            "a status for an older generation is not shown: {stale:?}"
        );
        let coloured = rollout_lines(&r, &plans, &Style::for_terminal(true));
        assert!(coloured.iter().any(|l| l.contains("\x1b[32mSucceeded")));
    }

    #[test]
    fn explain_a_rolled_back_plan() {
        let p = plan(
            "node-1",
            json!({"phase": "RolledBack", "targetRevision": "abcdef0123456789",
                   "currentRevision": "1111111122222222",
                   "failedRevisions": ["abcdef0123456789"], "attempts": 1,
                   "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:30Z",
                   "conditions": [{"type": "Ready", "status": "False", "reason": "RolledBack",
                     "message": "HealthCheckFailed: kubelet.service failed", "lastTransitionTime": "2026-01-01T00:00:30Z"}]}),
        );
        let now: Timestamp = "2026-01-01T00:01:30Z".parse().unwrap();
        let text = plan_explain(&p, now, &Style::plain()).join("\n");
        for want in [
            "NodeUpdatePlan node-1",
            "owner:         NodeRollout demo",
            "release:       kubelet-v2",
            "desired state: Active (swap, restart and verify)",
            "kubernetes (Sysext, 2.0 MiB, sha256 aaaaaaaa)",
            "health checks: unit kubelet.service (healthy for 5s, give up after 2m)",
            "phase:         RolledBack",
            "current:       1111111122222222",
            "denied revisions: abcdef0123456789",
            "Ready=False RolledBack: HealthCheckFailed: kubelet.service failed",
            "RolledBack means:",
            "finished:      2026-01-01T00:00:30Z (1m00s ago)",
            "next: The revision is denied on node-1",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
