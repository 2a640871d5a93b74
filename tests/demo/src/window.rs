//! The demo's maintenance window: v2 is rolled out under a window that opens about a minute
//! after the rollout is pointed at it, so the controller holds the rollout
//! (`Progressing=False, OutsideMaintenanceWindow`) while the nodes stage; the demo prints
//! what `kubectl inplace status` prints then. Once every node is staged the demo does not
//! wait for the opening: it moves the window to one open now, as an operator would, and the
//! controller lets the rollout go (no clock of the product's is bent for the demo).

use inplace_proto::reason::rollout_condition;
use std::time::Duration;

use anyhow::Context as _;
use inplace_proto::NodeRollout;
use inplace_proto::reason::Reason;
use k8s_openapi::jiff::{RoundMode, Timestamp, TimestampRound, ToSpan as _, Unit, tz::TimeZone};
use kube::Api;
use kubectl_inplace::render::Style;
use serde_json::{Value, json};

/// At least this long before the window opens: time for the controller to hold the rollout
/// and for the demo to show it.
const LEAD: i64 = 30;

/// A one-hour window in UTC on the whole minute at least [`LEAD`] seconds after `now`,
/// on the day it opens (a window belongs to the day it opens on), and when it opens.
pub fn opening_soon(now: Timestamp) -> anyhow::Result<(Value, Timestamp)> {
    let earliest = now
        .checked_add(LEAD.seconds())?
        .round(
            TimestampRound::new()
                .smallest(Unit::Minute)
                .mode(RoundMode::Ceil),
        )
        .context("rounding the window's start")?;
    let opens = earliest.to_zoned(TimeZone::UTC);
    let window = json!({
        "days": [format!("{:?}", opens.weekday())],
        "start": format!("{:02}:{:02}", opens.hour(), opens.minute()),
        "duration": "1h",
        "timeZone": "UTC",
    });
    Ok((window, opens.timestamp()))
}

/// A one-hour window in UTC that is open at `now`: from the whole minute `now` is in.
pub fn open_now(now: Timestamp) -> anyhow::Result<Value> {
    let start = now
        .round(
            TimestampRound::new()
                .smallest(Unit::Minute)
                .mode(RoundMode::Floor),
        )
        .context("rounding the window's start")?
        .to_zoned(TimeZone::UTC);
    Ok(json!({
        "days": [format!("{:?}", start.weekday())],
        "start": format!("{:02}:{:02}", start.hour(), start.minute()),
        "duration": "1h",
        "timeZone": "UTC",
    }))
}

/// Waits until the controller holds `rollout` outside its window, then prints what
/// `kubectl inplace status ROLLOUT` prints.
pub async fn show_the_hold(
    client: &kube::Client,
    rollout: &str,
    opens: Timestamp,
    style: &Style,
) -> anyhow::Result<()> {
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    let held = |r: &NodeRollout| {
        r.status.as_ref().is_some_and(|s| {
            inplace_proto::condition::find(&s.conditions, rollout_condition::PROGRESSING)
                .is_some_and(|c| {
                    c.status == inplace_proto::condition::FALSE
                        && c.reason == Reason::OutsideMaintenanceWindow.as_str()
                })
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(LEAD as u64);
    loop {
        if held(&rollouts.get(rollout).await?) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("the controller did not hold NodeRollout {rollout} outside its window");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("    held outside its maintenance window; `kubectl inplace status {rollout}` says:");
    for line in kubectl_inplace::status(client, Some(rollout), style).await? {
        println!("      {line}");
    }
    println!(
        "    the window opens at {opens}; the nodes download and stage meanwhile (a held rollout still stages)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_open_now_starts_on_the_minute_it_is_in_on_that_day() {
        for (now, start, day) in [
            ("2026-11-26T06:30:59Z", "06:30", "Thursday"),
            ("2026-11-26T23:59:40Z", "23:59", "Thursday"),
            ("2026-11-27T00:00:00Z", "00:00", "Friday"),
        ] {
            let window = open_now(now.parse().unwrap()).unwrap();
            assert_eq!(window["start"], start, "{now}");
            assert_eq!(window["days"][0], day, "{now}");
        }
    }

    #[test]
    fn the_window_opens_on_a_whole_minute_at_least_the_lead_ahead_on_its_own_day() {
        let cases = [
            // (now, start, day, opens)
            (
                "2026-11-26T06:30:00Z",
                "06:31",
                "Thursday",
                "2026-11-26T06:31:00Z",
            ),
            (
                "2026-11-26T06:30:29Z",
                "06:31",
                "Thursday",
                "2026-11-26T06:31:00Z",
            ),
            (
                "2026-11-26T06:30:31Z",
                "06:32",
                "Thursday",
                "2026-11-26T06:32:00Z",
            ),
            // Across midnight the window belongs to the next day.
            (
                "2026-11-26T23:59:40Z",
                "00:01",
                "Friday",
                "2026-11-27T00:01:00Z",
            ),
        ];
        for (now, start, day, opens) in cases {
            let now: Timestamp = now.parse().unwrap();
            let (window, at) = opening_soon(now).unwrap();
            assert_eq!(window["start"], start, "{now}");
            assert_eq!(window["days"][0], day, "{now}");
            assert_eq!(at, opens.parse::<Timestamp>().unwrap(), "{now}");
            assert!(at.duration_since(now).as_secs() >= LEAD, "{now}");
        }
    }
}
