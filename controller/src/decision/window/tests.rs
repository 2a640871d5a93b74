use inplace_proto::{Duration, Weekday};

use super::*;

fn window(days: &[Weekday], start: &str, duration: &str, zone: &str) -> MaintenanceWindow {
    MaintenanceWindow {
        days: days.to_vec(),
        start: start.into(),
        duration: Duration::parse(duration).unwrap(),
        time_zone: zone.into(),
    }
}

fn at(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn open_until(closes: &str) -> WindowVerdict {
    WindowVerdict::Open {
        closes_at: Some(at(closes)),
    }
}

fn closed(opens: &str, local: &str) -> WindowVerdict {
    WindowVerdict::Closed {
        opens_at: at(opens),
        local: local.into(),
    }
}

use Weekday::*;

/// (what the row shows, windows, now, verdict)
#[test]
fn windows_open_and_close_by_the_wall_clock_of_their_zone() {
    let berlin_sunday_0230 = || vec![window(&[Sunday], "02:30", "1h", "Europe/Berlin")];
    let rows: Vec<(&str, Vec<MaintenanceWindow>, &str, WindowVerdict)> = vec![
        (
            "no windows: always open",
            vec![],
            "2026-11-25T23:00:00Z",
            WindowVerdict::Open { closes_at: None },
        ),
        (
            "winter: 02:30 CET is 01:30Z",
            berlin_sunday_0230(),
            "2026-11-29T01:00:00Z",
            closed("2026-11-29T01:30:00Z", "Sun 2026-11-29 02:30 Europe/Berlin"),
        ),
        (
            "summer: 02:30 CEST is 00:30Z, open for one hour",
            berlin_sunday_0230(),
            "2026-07-05T00:45:00Z",
            open_until("2026-07-05T01:30:00Z"),
        ),
        (
            "spring forward (2026-03-29, 02:00 → 03:00): a start in the skipped hour opens an hour later, at 03:30 CEST",
            berlin_sunday_0230(),
            "2026-03-29T01:00:00Z",
            closed("2026-03-29T01:30:00Z", "Sun 2026-03-29 03:30 Europe/Berlin"),
        ),
        (
            "spring forward: open from 03:30 CEST for one hour",
            berlin_sunday_0230(),
            "2026-03-29T01:30:00Z",
            open_until("2026-03-29T02:30:00Z"),
        ),
        (
            "fall back (2026-10-25, 03:00 → 02:00): 02:30 happens twice, the window opens the first time (CEST)",
            berlin_sunday_0230(),
            "2026-10-25T00:30:00Z",
            open_until("2026-10-25T01:30:00Z"),
        ),
        (
            "fall back: at the second 02:30 (CET) the one-hour window is over; next Sunday's opens",
            vec![window(&[Sunday], "02:30", "30m", "Europe/Berlin")],
            "2026-10-25T01:35:00Z",
            closed("2026-11-01T01:30:00Z", "Sun 2026-11-01 02:30 Europe/Berlin"),
        ),
        (
            "a window over the spring-forward night lasts its duration of real time (4h = 5h on the wall clock)",
            vec![window(&[Saturday], "23:00", "4h", "Europe/Berlin")],
            "2026-03-29T01:59:00Z",
            open_until("2026-03-29T02:00:00Z"),
        ),
        (
            "across midnight: Friday 22:00 for 4h is open early on Saturday",
            vec![window(&[Friday], "22:00", "4h", "UTC")],
            "2026-11-28T01:00:00Z",
            open_until("2026-11-28T02:00:00Z"),
        ),
        (
            "across midnight: closed once it ends; it opens on Fridays only",
            vec![window(&[Friday], "22:00", "4h", "UTC")],
            "2026-11-28T02:00:00Z",
            closed("2026-12-04T22:00:00Z", "Fri 2026-12-04 22:00 UTC"),
        ),
        (
            "across midnight in a zone west of UTC: Monday 23:00 New York is Tuesday 04:00Z",
            vec![window(&[Monday], "23:00", "2h", "America/New_York")],
            "2026-11-24T05:00:00Z",
            open_until("2026-11-24T06:00:00Z"),
        ),
        (
            "New York's spring forward (2026-03-08): 02:15 does not exist, the window opens at 03:15 EDT",
            vec![window(&[Sunday], "02:15", "1h", "America/New_York")],
            "2026-03-08T06:00:00Z",
            closed(
                "2026-03-08T07:15:00Z",
                "Sun 2026-03-08 03:15 America/New_York",
            ),
        ),
        (
            "several windows: the earliest next opening is reported (Thursday 01:00 Tokyo is Wednesday 16:00Z)",
            vec![
                window(&[Thursday], "09:00", "1h", "UTC"),
                window(&[Thursday, Tuesday], "01:00", "1h", "Asia/Tokyo"),
            ],
            "2026-11-25T10:00:00Z",
            closed("2026-11-25T16:00:00Z", "Thu 2026-11-26 01:00 Asia/Tokyo"),
        ),
        (
            "several windows: open in Tokyo's",
            vec![
                window(&[Wednesday], "09:00", "1h", "UTC"),
                window(&[Thursday, Tuesday], "01:00", "1h", "Asia/Tokyo"),
            ],
            "2026-11-25T16:30:00Z",
            open_until("2026-11-25T17:00:00Z"),
        ),
        (
            "a week-long window that opened days ago is still open",
            vec![window(&[Monday], "00:00", "168h", "UTC")],
            "2026-11-29T23:00:00Z",
            open_until("2026-11-30T00:00:00Z"),
        ),
    ];
    for (what, windows, now, want) in rows {
        assert_eq!(window_verdict(&windows, at(now)), want, "{what}");
    }
}

#[test]
fn an_unknown_time_zone_holds_the_rollout_and_names_the_field() {
    let windows = vec![
        window(&[Monday], "01:00", "1h", "UTC"),
        window(&[Monday], "01:00", "1h", "Europe/Berln"),
    ];
    let verdict = window_verdict(&windows, at("2026-11-30T01:30:00Z"));
    let WindowVerdict::Invalid { message } = &verdict else {
        panic!("{verdict:?}");
    };
    assert!(
        message
            .starts_with("spec.maintenanceWindows[1].timeZone: unknown time zone \"Europe/Berln\""),
        "{message}"
    );
    assert!(!verdict.allows_grants());
}

#[test]
fn the_verdict_changes_when_a_window_opens_or_closes() {
    let windows = vec![window(&[Friday], "22:00", "4h", "UTC")];
    let open = window_verdict(&windows, at("2026-11-27T23:00:00Z"));
    assert!(open.allows_grants());
    assert_eq!(open.changes_at(), Some(at("2026-11-28T02:00:00Z")));
    let shut = window_verdict(&windows, at("2026-11-28T03:00:00Z"));
    assert!(!shut.allows_grants());
    assert_eq!(shut.changes_at(), Some(at("2026-12-04T22:00:00Z")));
}

/// A window longer than the API allows (168h; the CRD's CEL rule refuses it, an object
/// stored before that rule does not) holds the rollout naming the field, as an unknown time
/// zone does. Longer than jiff's span limit, it panicked, and the release profile aborts on
/// panic.
#[test]
fn a_window_longer_than_the_api_allows_holds_the_rollout_and_never_panics() {
    for duration in ["200000000h", "2000000h", "170h"] {
        let windows = vec![window(&[Monday], "01:00", duration, "UTC")];
        let verdict = window_verdict(&windows, at("2026-11-27T23:00:00Z"));
        let WindowVerdict::Invalid { message } = &verdict else {
            panic!("{duration}: {verdict:?}");
        };
        assert_eq!(
            message,
            &format!("spec.maintenanceWindows[0].duration: {duration} is not from 1m to 168h")
        );
    }
}

/// Behind that check, the openings of a window of any length never panic: eight days back
/// are enough (a window opens at least weekly), and one that ends past the last instant jiff
/// represents stays open.
#[test]
fn the_openings_of_a_window_of_any_length_never_panic() {
    let window = window(&[Monday], "01:00", "1h", "UTC");
    let read = ReadWindow {
        window: &window,
        zone: TimeZone::UTC,
        start: Time::new(1, 0, 0, 0).unwrap(),
        length: SignedDuration::from_secs(200_000_000 * 3600),
    };
    let openings = read.openings_around(at("2026-11-27T23:00:00Z"));
    assert!(!openings.is_empty());
    assert!(openings.iter().all(|(_, closes)| closes.is_none()));
}
