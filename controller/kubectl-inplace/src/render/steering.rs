//! The lines of `kubectl inplace status` about what holds a rollout back by a person's or
//! the spec's word: its maintenance windows (and, while all are closed, when the next one
//! opens, as the controller reported it), the nodes held or skipped, and the slots others'
//! disruption uses. Pure, like
//! [`crate::render`]; what the rollout's conditions say (pause, gates, halts) is drawn there.

use inplace_proto::{ForeignDisruption, MaintenanceWindow, NodeRollout};

use crate::render::{Style, current_status};

/// `Mon,Tue 22:00 for 6h Europe/Berlin`.
pub fn window_text(w: &MaintenanceWindow) -> String {
    let days: Vec<String> = w
        .days
        .iter()
        .map(|d| format!("{d:?}").chars().take(3).collect())
        .collect();
    format!(
        "{} {} for {} {}",
        days.join(","),
        w.start,
        w.duration.as_str(),
        w.time_zone
    )
}

/// The windows line (none when the rollout sets no window) and the held and skipped nodes.
pub fn steering_lines(rollout: &NodeRollout, style: &Style) -> Vec<String> {
    let mut lines = Vec::new();
    let status = current_status(rollout);
    let windows = &rollout.spec.maintenance_windows;
    if !windows.is_empty() {
        let list: Vec<String> = windows.iter().map(window_text).collect();
        let state = match status.and_then(|s| s.next_window_opens_at.as_ref()) {
            Some(at) => style.paint("33", &format!("closed, next opens {}", at.0)),
            None => "open".to_owned(),
        };
        lines.push(format!("  windows: {} — {state}", list.join("; ")));
    }
    if let Some(status) = status {
        if !status.held_nodes.is_empty() {
            lines.push(format!(
                "  {} {} (kubectl inplace release NODE)",
                style.paint("33", "held:"),
                status.held_nodes.join(", ")
            ));
        }
        if !status.skipped_nodes.is_empty() {
            lines.push(format!(
                "  skipped: {} (kept at the revision they run)",
                status.skipped_nodes.join(", ")
            ));
        }
        if let Some(line) = foreign_line(&status.foreign_disruptions) {
            lines.push(style.paint("33", &line));
        }
    }
    lines
}

/// `  2 slots used by others: worker-4 cordoned, worker-9 NotReady (Ready=Unknown)`: the
/// selected nodes someone else took down (`spec.countForeignDisruption`).
pub fn foreign_line(found: &[ForeignDisruption]) -> Option<String> {
    if found.is_empty() {
        return None;
    }
    let named: Vec<String> = found
        .iter()
        .map(|d| format!("{} {}", d.node, d.why))
        .collect();
    let slots = if found.len() == 1 { "slot" } else { "slots" };
    Some(format!(
        "  {} {slots} used by others: {}",
        found.len(),
        named.join(", ")
    ))
}
