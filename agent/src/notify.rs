//! systemd's notification protocol: READY, STATUS= text, and the watchdog. No-ops when the
//! agent does not run under systemd (no `NOTIFY_SOCKET`).
//!
//! `systemctl status inplace-agent` shows the STATUS= line: the phase and what the agent
//! does in it, with download progress. [`Notifier`] keeps that from turning into a stream
//! of datagrams: a new kind of line goes out at once, updates of the same kind at most
//! once per [`MIN_INTERVAL`].

use std::sync::Mutex;
use std::time::{Duration, Instant};

use inplace_proto::Phase;
use sd_notify::NotifyState;

/// The shortest time between two STATUS= lines of the same kind.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Tells systemd the agent is up.
pub fn ready() {
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready]) {
        tracing::warn!(error = %e, "sd_notify READY failed");
    }
}

/// Tells systemd the agent is stopping.
pub fn stopping() {
    let _ = sd_notify::notify(&[NotifyState::Stopping]);
}

/// Sets the one-line status `systemctl status` shows, unconditionally.
pub fn status(text: &str) {
    let _ = sd_notify::notify(&[NotifyState::Status(&one_line(text))]);
}

/// STATUS= is one line; keep it short.
fn one_line(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect()
}

/// The status line for a report: the phase, how far a download got, the message.
/// `download` is bytes done and, when every artifact declares its size, the total.
pub fn status_line(phase: Phase, message: &str, download: Option<(u64, Option<u64>)>) -> String {
    match (phase, download) {
        (Phase::Downloading, Some((done, Some(total)))) if total > 0 => format!(
            "Downloading {}% ({} of {}): {message}",
            done.saturating_mul(100) / total,
            human_bytes(done),
            human_bytes(total)
        ),
        (Phase::Downloading, Some((done, _))) => {
            format!("Downloading {}: {message}", human_bytes(done))
        }
        _ => format!("{phase:?}: {message}"),
    }
}

/// Bytes in binary units with one decimal: `512 B`, `1.5 KiB`, `283.4 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The kind of a status line: its text before the first `:` or digit, so that
/// "Downloading 41% …" and "Downloading 42% …" are one kind, "Activating: …" another.
fn kind(line: &str) -> &str {
    let end = line
        .find(|c: char| c == ':' || c.is_ascii_digit())
        .unwrap_or(line.len());
    line[..end].trim_end()
}

/// Whether `line` goes out at `now`, given the last line sent and when. Pure.
pub fn due(last: Option<(&str, Instant)>, line: &str, now: Instant) -> bool {
    match last {
        None => true,
        Some((sent, _)) if sent == line => false,
        Some((sent, _)) if kind(sent) != kind(line) => true,
        Some((_, at)) => now.saturating_duration_since(at) >= MIN_INTERVAL,
    }
}

/// Sends STATUS= lines through [`due`]'s rate limit.
#[derive(Debug, Default)]
pub struct Notifier {
    last: Mutex<Option<(String, Instant)>>,
}

impl Notifier {
    /// Sets the status line, unless it repeats or updates the last one too soon.
    pub fn status(&self, text: &str) {
        let line = one_line(text);
        let now = Instant::now();
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        if due(last.as_ref().map(|(l, at)| (l.as_str(), *at)), &line, now) {
            status(&line);
            *last = Some((line, now));
        }
    }
}

/// Pings the watchdog at half its interval, for as long as the runtime runs (a stuck
/// runtime stops the pings and systemd restarts the agent).
pub fn spawn_watchdog() -> Option<tokio::task::JoinHandle<()>> {
    let interval = sd_notify::watchdog_enabled()? / 2;
    Some(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        loop {
            ticker.tick().await;
            let _ = sd_notify::notify(&[NotifyState::Watchdog]);
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn download_lines_show_percent_and_bytes() {
        assert_eq!(
            status_line(
                Phase::Downloading,
                "2 artifact(s) of revision abc",
                Some((150 << 20, Some(300 << 20)))
            ),
            "Downloading 50% (150.0 MiB of 300.0 MiB): 2 artifact(s) of revision abc"
        );
        assert_eq!(
            status_line(Phase::Downloading, "m", Some((1536, None))),
            "Downloading 1.5 KiB: m"
        );
        assert_eq!(
            status_line(Phase::Verifying, "kubelet healthy for 3s of 30s", None),
            "Verifying: kubelet healthy for 3s of 30s"
        );
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn new_kinds_go_out_at_once_updates_at_most_once_a_second() {
        let t0 = Instant::now();
        let soon = t0 + Duration::from_millis(200);
        let later = t0 + MIN_INTERVAL;
        let first = "Downloading 41% (1 of 2): x";
        assert!(due(None, first, t0));
        assert!(!due(Some((first, t0)), first, later), "a repeat never");
        assert!(!due(Some((first, t0)), "Downloading 42% (1 of 2): x", soon));
        assert!(due(Some((first, t0)), "Downloading 42% (1 of 2): x", later));
        assert!(due(Some((first, t0)), "Activating: revision x", soon));
        assert!(due(
            Some(("rolling back: waiting", t0)),
            "RolledBack: done",
            soon
        ));
        assert!(!due(
            Some(("rolling back: kubelet healthy for 1s", t0)),
            "rolling back: kubelet healthy for 2s",
            soon
        ));
    }
}
