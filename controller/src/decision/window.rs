//! The maintenance-window rule of the grant phase: whether a new activation may start at
//! `now` under `spec.maintenanceWindows`, and if not, when the next window opens.
//!
//! A window opens on each of its days at `start` on the wall clock of its time zone and
//! stays open for `duration` of real time. The wall-clock start is turned into an instant
//! as RFC 5545 (iCalendar) does: a start in the hour skipped when clocks go forward opens
//! the window as much later as the gap (02:30 → 03:30), a start in the hour repeated when
//! they go back opens it the first time. Time zones come from the IANA database bundled
//! into the controller (`jiff`), so the answer does not depend on the host or container.

use inplace_proto::MaintenanceWindow;
use inplace_proto::maintenance_window::DURATION_BOUNDS;
use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Span, Timestamp};

/// What the windows say about starting an activation now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WindowVerdict {
    /// No windows are set, or one is open. `closes_at`: when the open window ends (the
    /// rollout is looked at again then), if any.
    Open { closes_at: Option<Timestamp> },
    /// Every window is closed; the earliest opens at `opens_at`. `local` says when in the
    /// window's own time zone, for the status message.
    Closed { opens_at: Timestamp, local: String },
    /// A window cannot be read (a time zone the database does not know, a length outside
    /// 1m to 168h); the message names the field. No activation starts until it is fixed.
    Invalid { message: String },
}

impl WindowVerdict {
    /// Whether a new activation may start.
    pub(crate) fn allows_grants(&self) -> bool {
        matches!(self, WindowVerdict::Open { .. })
    }

    /// When the verdict changes next, so the rollout is looked at again then.
    pub(crate) fn changes_at(&self) -> Option<Timestamp> {
        match self {
            WindowVerdict::Open { closes_at } => *closes_at,
            WindowVerdict::Closed { opens_at, .. } => Some(*opens_at),
            WindowVerdict::Invalid { .. } => None,
        }
    }
}

/// The verdict of `windows` at `now`.
pub(crate) fn window_verdict(windows: &[MaintenanceWindow], now: Timestamp) -> WindowVerdict {
    if windows.is_empty() {
        return WindowVerdict::Open { closes_at: None };
    }
    let mut open = false;
    let mut closes_at: Option<Timestamp> = None;
    let mut next: Option<(Timestamp, String)> = None;
    for (i, window) in windows.iter().enumerate() {
        let read = match ReadWindow::read(window, i) {
            Ok(read) => read,
            Err(message) => return WindowVerdict::Invalid { message },
        };
        for (opens, closes) in read.openings_around(now) {
            // `None`: the window closes past the last instant there is: it stays open.
            if opens <= now && closes.is_none_or(|closes| now < closes) {
                if let Some(closes) = closes {
                    closes_at = Some(closes_at.map_or(closes, |c| c.min(closes)));
                }
                open = true;
            } else if opens > now && next.as_ref().is_none_or(|(n, _)| opens < *n) {
                next = Some((opens, read.local(opens)));
            }
        }
    }
    match (open, next) {
        (true, _) => WindowVerdict::Open { closes_at },
        (false, Some((opens_at, local))) => WindowVerdict::Closed { opens_at, local },
        // Unreachable with at least one day per window (the API server requires one):
        // some opening always lies within the next eight days.
        (false, None) => WindowVerdict::Invalid {
            message: "spec.maintenanceWindows: no window ever opens".to_owned(),
        },
    }
}

/// One window with its time zone looked up and its start parsed.
struct ReadWindow<'a> {
    window: &'a MaintenanceWindow,
    zone: TimeZone,
    start: Time,
    length: SignedDuration,
}

impl<'a> ReadWindow<'a> {
    fn read(window: &'a MaintenanceWindow, index: usize) -> Result<Self, String> {
        let field = |name: &str| format!("spec.maintenanceWindows[{index}].{name}");
        let zone = TimeZone::get(&window.time_zone).map_err(|_| {
            format!(
                "{}: unknown time zone {:?} (an IANA name such as Europe/Berlin or UTC)",
                field("timeZone"),
                window.time_zone
            )
        })?;
        let start = window
            .start_hour_minute()
            .and_then(|(hour, minute)| Time::new(hour, minute, 0, 0).ok())
            .ok_or_else(|| format!("{}: {:?} is not HH:MM", field("start"), window.start))?;
        // The CRD's CEL rule refuses other lengths, but an object stored before that rule
        // reaches the controller as it is: the controller checks what it relies on.
        let (shortest, longest) = DURATION_BOUNDS;
        if !(shortest..=longest).contains(&window.duration.get()) {
            return Err(format!(
                "{}: {} is not from 1m to 168h",
                field("duration"),
                window.duration.as_str()
            ));
        }
        let length = SignedDuration::try_from(window.duration.get())
            .map_err(|_| format!("{}: too long", field("duration")))?;
        Ok(ReadWindow {
            window,
            zone,
            start,
            length,
        })
    }

    /// Every (opens, closes) of this window whose opening day lies from a window's length
    /// (at most eight days) before `now` (a window still open now may have opened days ago)
    /// to eight days after (the next opening of a weekly window). Eight days back are
    /// enough for any length: a window opens at least weekly, so one that lasts longer is
    /// open now by an opening of the last eight days. `closes` is `None` past the last
    /// instant `jiff` represents (a window far longer than the API's 168h).
    fn openings_around(&self, now: Timestamp) -> Vec<(Timestamp, Option<Timestamp>)> {
        let today = now.to_zoned(self.zone.clone()).date();
        let back = (self.length.as_secs() / 86_400 + 1).min(8);
        (-back..=8)
            .filter_map(|offset| today.checked_add(Span::new().try_days(offset).ok()?).ok())
            .filter(|day| self.opens_on(*day))
            .filter_map(|day| {
                let opens = day
                    .to_datetime(self.start)
                    .to_zoned(self.zone.clone())
                    .ok()?
                    .timestamp();
                Some((opens, opens.checked_add(self.length).ok()))
            })
            .collect()
    }

    fn opens_on(&self, day: Date) -> bool {
        let weekday = day.weekday().to_monday_zero_offset();
        self.window
            .days
            .iter()
            .any(|d| d.days_from_monday() == weekday)
    }

    /// `opens` as the window's own wall clock shows it, e.g. `Sun 2026-03-29 03:30 Europe/Berlin`.
    fn local(&self, opens: Timestamp) -> String {
        let zoned = opens.to_zoned(self.zone.clone());
        format!(
            "{} {}",
            zoned.strftime("%a %Y-%m-%d %H:%M"),
            self.window.time_zone
        )
    }
}

#[cfg(test)]
mod tests;
