//! systemd's notification protocol: READY, STATUS= text, and the watchdog. No-ops when the
//! agent does not run under systemd (no `NOTIFY_SOCKET`).

use sd_notify::NotifyState;

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

/// Sets the one-line status `systemctl status` shows.
pub fn status(text: &str) {
    // STATUS= is one line; keep it short.
    let line: String = text
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect();
    let _ = sd_notify::notify(&[NotifyState::Status(&line)]);
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
