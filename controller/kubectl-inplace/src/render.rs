//! Pure rendering of rollouts and plans into lines of text: per-node phase and reason, a
//! progress bar for downloads (`status.artifacts` bytes) and one for the rollout
//! (succeeded / total). No I/O: the caller fetches objects and decides where lines go, so
//! `kubectl inplace` and the demo fleet draw the same picture. Colours are ANSI escapes,
//! only when [`Style::color`] is set (the caller sets it when stdout is a terminal).

use inplace_proto::condition::find as condition;
use inplace_proto::reason::plan_condition;
use inplace_proto::{NodeRollout, NodeUpdatePlan, Outcome, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

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
    match condition(&status.conditions, plan_condition::READY) {
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
    lines.extend(crate::render::steering::steering_lines(rollout, style));
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

mod explain;
pub use explain::{next_step, plan_explain};
pub mod steering;

#[cfg(test)]
mod tests;
