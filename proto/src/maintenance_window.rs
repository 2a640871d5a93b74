//! A NodeRollout's maintenance windows: the weekly spans of time in which a new activation
//! may start. Types only; the controller reads them against its clock
//! (`controller/src/decision/window.rs`), with the time zone database it bundles.

use std::time::Duration as StdDuration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::validate::Collector;

/// The pattern of a window's start time: `HH:MM`, 24-hour clock.
pub const START_PATTERN: &str = r"^([01][0-9]|2[0-3]):[0-5][0-9]$";

/// The shape of an IANA time zone name (`UTC`, `Europe/Berlin`, `America/Argentina/Salta`,
/// `Etc/GMT+5`); whether the name exists is the controller's to say.
pub const TIME_ZONE_PATTERN: &str = r"^[A-Za-z][A-Za-z0-9_+\-]*(/[A-Za-z0-9_+\-]+)*$";

/// A weekly window in which new activations may start. It opens on each of `days` at
/// `start` in `timeZone` and stays open for `duration` of real time, so a window may run
/// past midnight (it belongs to the day it opens on) and, on a day the clocks change, ends
/// an hour earlier or later by the wall clock.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// The days of the week the window opens on.
    #[schemars(length(min = 1, max = 7))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub days: Vec<Weekday>,

    /// When the window opens, `HH:MM` on the 24-hour clock in `timeZone`. A start in the
    /// hour skipped when clocks go forward opens the window that much later (02:30 becomes
    /// 03:30); a start in the hour repeated when clocks go back opens it the first time.
    #[schemars(regex(pattern = START_PATTERN))]
    #[schemars(extend("maxLength" = 5))]
    pub start: String,

    /// How long the window stays open: from 1m to 168h (a week).
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "duration(self) >= duration('1m') && duration(self) <= duration('168h')", "message": "duration must be from 1m to 168h"},
    ]))]
    pub duration: Duration,

    /// The IANA time zone `start` is read in (`Europe/Berlin`, `America/New_York`, `UTC`).
    /// The API server checks only its shape; a name the controller's time zone database
    /// does not know holds the rollout with reason `InvalidMaintenanceWindow`.
    #[serde(default = "default_time_zone")]
    #[schemars(length(min = 1, max = 64))]
    #[schemars(regex(pattern = TIME_ZONE_PATTERN))]
    pub time_zone: String,
}

/// The shortest and the longest window (the CEL rule on `duration` says the same).
pub const DURATION_BOUNDS: (StdDuration, StdDuration) = (
    StdDuration::from_secs(60),
    StdDuration::from_secs(168 * 3600),
);

impl MaintenanceWindow {
    /// `start` as (hour, minute), if it is `HH:MM` on the 24-hour clock.
    pub fn start_hour_minute(&self) -> Option<(i8, i8)> {
        let (hour, minute) = self.start.split_once(':')?;
        if hour.len() != 2 || minute.len() != 2 {
            return None;
        }
        let hour: i8 = hour.parse().ok()?;
        let minute: i8 = minute.parse().ok()?;
        ((0..24).contains(&hour) && (0..60).contains(&minute)).then_some((hour, minute))
    }

    /// What the CRD schema refuses, for objects that never met an API server (`at` is the
    /// window's field path). Whether the time zone exists is the controller's to say.
    pub(crate) fn check(&self, at: &str, out: &mut Collector) {
        if self.days.is_empty() {
            out.invalid(format!("{at}.days"), "at least one day");
        }
        if self.start_hour_minute().is_none() {
            out.invalid(
                format!("{at}.start"),
                format!("{:?} is not HH:MM", self.start),
            );
        }
        let (shortest, longest) = DURATION_BOUNDS;
        if !(shortest..=longest).contains(&self.duration.get()) {
            out.invalid(format!("{at}.duration"), "duration must be from 1m to 168h");
        }
        if self.time_zone.is_empty() || self.time_zone.len() > 64 {
            out.invalid(format!("{at}.timeZone"), "1 to 64 characters");
        }
    }
}

fn default_time_zone() -> String {
    "UTC".to_owned()
}

/// A day of the week.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[allow(missing_docs)]
pub enum Weekday {
    Monday,
    Tuesday,
    Wednesday,
    Thursday,
    Friday,
    Saturday,
    Sunday,
}

impl Weekday {
    /// Days since Monday (Monday is 0), the order `jiff` and ISO 8601 count in.
    pub fn days_from_monday(self) -> i8 {
        self as i8
    }
}
