//! What the summary reports, measured from outside the agent: a client polling each node's
//! kubelet (`GET /healthz` every 100 ms over host loopback, which the nodes share) and its
//! Node (`Ready` and the kubelet version, as the API server has them, every 500 ms), and
//! systemd's own timestamps for the kubelet unit.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inplace_tests::kube_node::{healthz_ok, node_state};

use crate::fleet::Member;

/// How often the kubelet's `/healthz` is asked.
pub const POLL_EVERY: Duration = Duration::from_millis(100);
/// How often the Node is read, in polls of `/healthz`.
const NODE_EVERY: u32 = 5;

/// How long something was down, at most, in one stretch.
#[derive(Debug, Default, Clone)]
pub struct Outage {
    /// The longest stretch so far.
    pub longest: Duration,
    since: Option<Instant>,
}

impl Outage {
    /// One observation at `now`.
    pub fn observe(&mut self, up: bool, now: Instant) {
        if up {
            self.since = None;
        } else {
            let since = *self.since.get_or_insert(now);
            self.longest = self.longest.max(now - since);
        }
    }
}

/// What one node's kubelet and Node showed over time.
#[derive(Debug, Default, Clone)]
pub struct KubeletSeen {
    /// The kubelet version its Node last reported.
    pub version: Option<String>,
    /// `/healthz` not answering `ok` (resolution: [`POLL_EVERY`]).
    pub unanswered: Outage,
    /// The Node's `Ready` condition not `True` (resolution: [`NODE_EVERY`] polls).
    pub not_ready: Outage,
}

/// Polls a node's kubelet and Node until dropped (abort the task).
pub fn poll_kubelet(
    client: &kube::Client,
    member: &Member,
    seen: Arc<Mutex<KubeletSeen>>,
) -> tokio::task::JoinHandle<()> {
    let (client, name, port) = (client.clone(), member.name.clone(), member.ports.healthz);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for n in 0u32.. {
            tick.tick().await;
            let healthy = healthz_ok(port).await;
            let node = match n % NODE_EVERY {
                0 => node_state(&client, &name).await.ok().flatten(),
                _ => None,
            };
            let now = Instant::now();
            let Ok(mut s) = seen.lock() else { return };
            s.unanswered.observe(healthy, now);
            if let Some((ready, version)) = node {
                s.not_ready.observe(ready == "True", now);
                s.version = Some(version);
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
    fn an_outage_is_the_longest_stretch_down() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut outage = Outage::default();
        for (at, up) in [
            (0, true),
            (100, false),
            (400, false),
            (500, true),
            (600, false),
            (700, true),
        ] {
            outage.observe(up, t + ms(at));
        }
        assert_eq!(outage.longest, ms(300));
        assert_eq!(Outage::default().longest, Duration::ZERO);
    }
}
