//! A duration written the way Kubernetes writes them (`30s`, `5m`, `1h30m`, `250ms`).
//!
//! The text is kept as written so that a value copied from a release into a plan, or
//! applied twice, serializes to exactly the same bytes (server-side apply compares values).

use std::borrow::Cow;
use std::fmt;
use std::time::Duration as StdDuration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The pattern the API server enforces for every duration field.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";

/// A Go-style duration such as `30s` or `1h30m`, parsed once and kept with its text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Duration {
    text: String,
    value: StdDuration,
}

/// Why a duration string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {text:?}: {why} (expected e.g. 30s, 5m, 1h30m)")]
pub struct ParseDurationError {
    text: String,
    why: &'static str,
}

impl Duration {
    /// Parses a Go-style duration (`300ms`, `1.5h`, `2h45m`). Negative values and bare
    /// numbers are refused: every duration in this API is a positive span of time.
    pub fn parse(text: &str) -> Result<Self, ParseDurationError> {
        let fail = |why| ParseDurationError {
            text: text.to_owned(),
            why,
        };
        if text.is_empty() {
            return Err(fail("empty"));
        }
        if text.len() > 64 {
            return Err(fail("longer than 64 characters"));
        }
        let mut rest = text;
        let mut total_nanos: u128 = 0;
        while !rest.is_empty() {
            let number_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(|| fail("missing unit"))?;
            if number_len == 0 {
                return Err(fail("expected a number"));
            }
            let (number, after) = rest.split_at(number_len);
            let unit_len = after
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(after.len());
            let (unit, next) = after.split_at(unit_len);
            let unit_nanos: u128 = match unit {
                "ns" => 1,
                "us" | "µs" => 1_000,
                "ms" => 1_000_000,
                "s" => 1_000_000_000,
                "m" => 60 * 1_000_000_000,
                "h" => 3_600 * 1_000_000_000,
                _ => return Err(fail("unknown unit")),
            };
            let (whole, fraction) = match number.split_once('.') {
                Some((w, f)) if !w.is_empty() && !f.is_empty() && !f.contains('.') => (w, f),
                Some(_) => return Err(fail("malformed number")),
                None => (number, ""),
            };
            let whole: u128 = whole.parse().map_err(|_| fail("number too large"))?;
            let mut nanos = whole
                .checked_mul(unit_nanos)
                .ok_or_else(|| fail("too large"))?;
            // Fractions are exact up to nanoseconds; further digits are dropped as Go does.
            let mut scale = unit_nanos;
            for digit in fraction.bytes() {
                scale /= 10;
                nanos = nanos
                    .checked_add(u128::from(digit - b'0') * scale)
                    .ok_or_else(|| fail("too large"))?;
            }
            total_nanos = total_nanos
                .checked_add(nanos)
                .ok_or_else(|| fail("too large"))?;
            rest = next;
        }
        let secs = u64::try_from(total_nanos / 1_000_000_000).map_err(|_| fail("too large"))?;
        let value = StdDuration::new(secs, (total_nanos % 1_000_000_000) as u32);
        Ok(Duration {
            text: text.to_owned(),
            value,
        })
    }

    /// The span of time.
    pub fn get(&self) -> StdDuration {
        self.value
    }

    /// The text as it was written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// A duration of whole seconds, written as `<n>s`.
    pub fn from_secs(secs: u64) -> Self {
        Duration {
            text: format!("{secs}s"),
            value: StdDuration::from_secs(secs),
        }
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.text)
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for Duration {
    type Err = ParseDurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Duration::parse(s)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Duration::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": 64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(
            Duration::parse("30s").unwrap().get(),
            StdDuration::from_secs(30)
        );
        assert_eq!(
            Duration::parse("5m").unwrap().get(),
            StdDuration::from_secs(300)
        );
        assert_eq!(
            Duration::parse("1h30m").unwrap().get(),
            StdDuration::from_secs(5400)
        );
        assert_eq!(
            Duration::parse("250ms").unwrap().get(),
            StdDuration::from_millis(250)
        );
        assert_eq!(
            Duration::parse("1.5s").unwrap().get(),
            StdDuration::from_millis(1500)
        );
        assert_eq!(
            Duration::parse("2us").unwrap().get(),
            StdDuration::from_micros(2)
        );
    }

    #[test]
    fn refuses_malformed_durations() {
        for bad in [
            "",
            "10",
            "s",
            "-5s",
            "5 s",
            "1.s",
            ".5s",
            "5d",
            "1..2s",
            "99999999999999999999999h",
        ] {
            assert!(Duration::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    /// The largest whole number of hours that fits, plus a fraction that does not: the CRD
    /// pattern accepts it (29 characters). It panicked in debug builds and read as about 36
    /// minutes in release ones (the sum wrapped).
    #[test]
    fn a_fraction_past_the_largest_value_is_too_large_not_wrapped() {
        let whole = u128::MAX / (3_600 * 1_000_000_000);
        for text in [format!("{whole}.9h"), format!("{whole}.99999999999999h")] {
            let error = Duration::parse(&text).unwrap_err();
            assert!(error.to_string().contains("too large"), "{text}: {error}");
        }
    }

    #[test]
    fn keeps_text_as_written() {
        let d: Duration = serde_json::from_str("\"5m\"").unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"5m\"");
    }
}
