//! What the summary reports, measured from outside the agent: a client polling each node's
//! kubelet (`GET /version` every 100 ms over host loopback, which the nodes share), and
//! systemd's own timestamps for the kubelet unit.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// How often the kubelet is asked for its version.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// What one node's kubelet answered over time.
#[derive(Debug, Default, Clone)]
pub struct KubeletSeen {
    /// The last version it answered.
    pub version: Option<String>,
    /// The last time it answered `from`.
    pub last_old: Option<Instant>,
    /// The first time it answered `to`.
    pub first_new: Option<Instant>,
    /// The longest run of failed polls while it answered `from` before and `to` after.
    pub longest_gap: Duration,
    gap_started: Option<Instant>,
}

impl KubeletSeen {
    /// How long the kubelet answered nobody between its last old answer and its first new
    /// one (resolution: [`POLL_EVERY`]).
    pub fn swap_gap(&self) -> Option<Duration> {
        Some(self.first_new?.saturating_duration_since(self.last_old?))
    }
}

/// One GET of `/version` on `127.0.0.1:port`, answering `gitVersion`.
pub async fn kubelet_version(port: u16) -> Option<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream
            .write_all(b"GET /version HTTP/1.0\r\nHost: kubelet\r\n\r\n")
            .await
            .ok()?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await.ok()?;
        let (head, body) = body.split_once("\r\n\r\n")?;
        if head.split_whitespace().nth(1) != Some("200") {
            return None;
        }
        let value: serde_json::Value = serde_json::from_str(body).ok()?;
        value["gitVersion"].as_str().map(str::to_owned)
    };
    tokio::time::timeout(Duration::from_secs(1), fetch)
        .await
        .ok()
        .flatten()
}

/// Polls a kubelet until dropped (abort the task), recording the old → new handover.
pub fn poll_kubelet(
    port: u16,
    from: String,
    to: String,
    seen: Arc<Mutex<KubeletSeen>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let answer = kubelet_version(port).await;
            let now = Instant::now();
            let Ok(mut s) = seen.lock() else { return };
            match answer.as_deref() {
                Some(v) if v == from => {
                    s.last_old = Some(now);
                    s.gap_started = None;
                }
                Some(v) if v == to => {
                    if s.first_new.is_none() {
                        s.first_new = Some(now);
                    }
                    if let Some(start) = s.gap_started.take() {
                        s.longest_gap = s.longest_gap.max(now - start);
                    }
                }
                Some(_) => {}
                None => {
                    if s.gap_started.is_none() && s.last_old.is_some() && s.first_new.is_none() {
                        s.gap_started = Some(now);
                    }
                }
            }
            if let Some(v) = answer {
                s.version = Some(v);
            }
        }
    })
}

/// systemd's view of the last kubelet restart: from leaving `active`
/// (`ActiveExitTimestampMonotonic`) to entering it again (`ActiveEnterTimestampMonotonic`),
/// and `NRestarts` (restarts by `Restart=`, i.e. crashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitRestart {
    /// Time between leaving and re-entering `active`.
    pub down: Duration,
    /// Automatic restarts so far.
    pub n_restarts: u64,
}

/// Parses `systemctl show -p ActiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic
/// -p NRestarts` output.
pub fn parse_unit_restart(show: &str) -> Option<UnitRestart> {
    let mut exit = None;
    let mut enter = None;
    let mut restarts = 0;
    for line in show.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match key.trim() {
            "ActiveExitTimestampMonotonic" => exit = value.trim().parse::<u64>().ok(),
            "ActiveEnterTimestampMonotonic" => enter = value.trim().parse::<u64>().ok(),
            "NRestarts" => restarts = value.trim().parse::<u64>().unwrap_or(0),
            _ => {}
        }
    }
    let (exit, enter) = (exit?, enter?);
    if exit == 0 || enter < exit {
        return None;
    }
    Some(UnitRestart {
        down: Duration::from_micros(enter - exit),
        n_restarts: restarts,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn unit_restart_from_systemctl_show() {
        let show = "NRestarts=0\nActiveEnterTimestampMonotonic=5000300\nActiveExitTimestampMonotonic=5000000\n";
        assert_eq!(
            parse_unit_restart(show),
            Some(UnitRestart {
                down: Duration::from_micros(300),
                n_restarts: 0
            })
        );
        assert_eq!(
            parse_unit_restart("ActiveEnterTimestampMonotonic=5\nActiveExitTimestampMonotonic=0\n"),
            None,
            "never restarted"
        );
    }

    #[test]
    fn gap_between_last_old_and_first_new_answer() {
        let t = Instant::now();
        let seen = KubeletSeen {
            last_old: Some(t),
            first_new: Some(t + Duration::from_millis(300)),
            ..KubeletSeen::default()
        };
        assert_eq!(seen.swap_gap(), Some(Duration::from_millis(300)));
        assert_eq!(KubeletSeen::default().swap_gap(), None);
    }

    #[tokio::test]
    async fn a_closed_port_answers_nothing() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        assert_eq!(kubelet_version(port).await, None);
    }
}
