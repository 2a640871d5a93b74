//! The Prometheus text exposition format (version 0.0.4), written by hand: the controller
//! and the agent own their metrics in plain structs and render them with this writer, so
//! neither needs a metrics registry.
//!
//! The writer only formats. Metric and label names are the caller's constants and must
//! match `[a-zA-Z_:][a-zA-Z0-9_:]*`; label values and help texts are escaped as the format
//! requires, so any string (a rollout name, a revision) is safe to pass.

use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The `Content-Type` of a scrape answer.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The kind of a metric family, as written on its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// Only goes up (and back to zero when the process restarts).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations counted into cumulative buckets, with their sum and count.
    Histogram,
}

impl MetricType {
    fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
}

/// A sample value: integers print as integers, floats in Rust's shortest round-trip form
/// (`0.25`, `5`), infinities and NaN as the format spells them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A whole number.
    Int(i128),
    /// A floating-point number.
    Float(f64),
}

macro_rules! int_value {
    ($($t:ty),+) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::Int(i128::from(v))
            }
        }
    )+};
}
int_value!(u8, u32, u64, i32, i64);

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) if v.is_nan() => f.write_str("NaN"),
            Value::Float(v) if v == f64::INFINITY => f.write_str("+Inf"),
            Value::Float(v) if v == f64::NEG_INFINITY => f.write_str("-Inf"),
            Value::Float(v) => write!(f, "{v}"),
        }
    }
}

/// Cumulative histogram data: for each upper bound, how many observations were at most it.
#[derive(Debug, Clone, Copy)]
pub struct HistogramData<'a> {
    /// Upper bounds, ascending, without `+Inf`.
    pub bounds: &'a [f64],
    /// Cumulative counts, one per bound.
    pub cumulative: &'a [u64],
    /// Sum of every observation.
    pub sum: f64,
    /// Number of observations (the `+Inf` bucket).
    pub count: u64,
}

/// Builds one exposition text, family after family.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty exposition.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts a family: writes its `# HELP` and `# TYPE` lines. Its samples follow through
    /// the returned [`Family`].
    pub fn family<'a>(&'a mut self, name: &'a str, help: &str, kind: MetricType) -> Family<'a> {
        let _ = writeln!(
            self.out,
            "# HELP {name} {}\n# TYPE {name} {}",
            escape_help(help),
            kind.as_str()
        );
        Family {
            out: &mut self.out,
            name,
        }
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// The samples of one family.
#[derive(Debug)]
pub struct Family<'a> {
    out: &'a mut String,
    name: &'a str,
}

impl Family<'_> {
    /// One sample: `name{labels} value`.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: impl Into<Value>) -> &mut Self {
        write_sample(self.out, self.name, "", labels, None, value.into());
        self
    }

    /// One histogram series: its `_bucket` lines (the caller's labels, then `le`), the
    /// `+Inf` bucket, `_sum` and `_count`.
    pub fn histogram(&mut self, labels: &[(&str, &str)], data: HistogramData<'_>) -> &mut Self {
        for (bound, count) in data.bounds.iter().zip(data.cumulative) {
            let le = Value::Float(*bound).to_string();
            write_sample(
                self.out,
                self.name,
                "_bucket",
                labels,
                Some(&le),
                Value::from(*count),
            );
        }
        write_sample(
            self.out,
            self.name,
            "_bucket",
            labels,
            Some("+Inf"),
            Value::from(data.count),
        );
        write_sample(
            self.out,
            self.name,
            "_sum",
            labels,
            None,
            Value::Float(data.sum),
        );
        write_sample(
            self.out,
            self.name,
            "_count",
            labels,
            None,
            Value::from(data.count),
        );
        self
    }
}

fn write_sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(&str, &str)],
    le: Option<&str>,
    value: Value,
) {
    out.push_str(name);
    out.push_str(suffix);
    let le = le.map(|le| ("le", le));
    let mut all = labels.iter().copied().chain(le).peekable();
    if all.peek().is_some() {
        out.push('{');
        for (i, (label, value)) in all.enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{label}=\"{}\"", escape_label_value(value));
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// The families declared in an exposition text, as `(name, type)` from its `# TYPE` lines.
pub fn declared_families(text: &str) -> Vec<(&str, &str)> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .collect()
}

/// The table rows (`` | `name` | type | ``) a Markdown guide lacks for the families of an
/// exposition text: the check that keeps a metrics reference in step with the code.
pub fn undocumented_families(text: &str, guide: &str) -> Vec<String> {
    declared_families(text)
        .into_iter()
        .map(|(name, kind)| format!("| `{name}` | {kind} |"))
        .filter(|row| !guide.contains(row.as_str()))
        .collect()
}

/// Locks metric state behind a mutex, poisoned or not: a panic while the lock was held
/// leaves plain counters behind, still worth exporting.
pub fn lock_state<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A label value as the format requires: backslash, double quote and line feed escaped.
pub fn escape_label_value(value: &str) -> String {
    escape(value, true)
}

/// A help text as the format requires: backslash and line feed escaped.
fn escape_help(help: &str) -> String {
    escape(help, false)
}

fn escape(text: &str, quote: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_counters_gauges_and_histograms_render_exactly() {
        let mut text = Exposition::new();
        text.family("jobs_total", "Jobs run.", MetricType::Counter)
            .sample(&[("queue", "a")], 3u64)
            .sample(&[("queue", "b"), ("result", "ok")], 0u64);
        text.family("up", "1 while up.", MetricType::Gauge)
            .sample(&[], 1u8)
            .sample(&[("x", "neg")], -2i64);
        text.family("took_seconds", "Time taken.", MetricType::Histogram)
            .histogram(
                &[("step", "s")],
                HistogramData {
                    bounds: &[0.5, 1.0],
                    cumulative: &[1, 2],
                    sum: 1.25,
                    count: 3,
                },
            );
        assert_eq!(
            text.finish(),
            "# HELP jobs_total Jobs run.\n# TYPE jobs_total counter\n\
             jobs_total{queue=\"a\"} 3\n\
             jobs_total{queue=\"b\",result=\"ok\"} 0\n\
             # HELP up 1 while up.\n# TYPE up gauge\n\
             up 1\n\
             up{x=\"neg\"} -2\n\
             # HELP took_seconds Time taken.\n# TYPE took_seconds histogram\n\
             took_seconds_bucket{step=\"s\",le=\"0.5\"} 1\n\
             took_seconds_bucket{step=\"s\",le=\"1\"} 2\n\
             took_seconds_bucket{step=\"s\",le=\"+Inf\"} 3\n\
             took_seconds_sum{step=\"s\"} 1.25\n\
             took_seconds_count{step=\"s\"} 3\n"
        );
    }

    #[test]
    fn histogram_without_labels_has_only_le() {
        let mut text = Exposition::new();
        text.family("h", "H.", MetricType::Histogram).histogram(
            &[],
            HistogramData {
                bounds: &[0.001],
                cumulative: &[0],
                sum: 0.0,
                count: 0,
            },
        );
        let text = text.finish();
        assert!(
            text.contains(
                "h_bucket{le=\"0.001\"} 0\nh_bucket{le=\"+Inf\"} 0\nh_sum 0\nh_count 0\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut text = Exposition::new();
        text.family("m", "a \\ b\nc \"q\"", MetricType::Gauge)
            .sample(&[("v", "x\\y\"z\nw")], 1u8);
        assert_eq!(
            text.finish(),
            "# HELP m a \\\\ b\\nc \"q\"\n# TYPE m gauge\nm{v=\"x\\\\y\\\"z\\nw\"} 1\n"
        );
    }

    #[test]
    fn declared_families_are_read_back() {
        let mut text = Exposition::new();
        text.family("a_total", "A.", MetricType::Counter)
            .sample(&[], 1u8);
        text.family("b", "B.", MetricType::Gauge);
        let text = text.finish();
        assert_eq!(
            declared_families(&text),
            vec![("a_total", "counter"), ("b", "gauge")]
        );
        assert_eq!(
            undocumented_families(&text, "| `a_total` | counter | x |\n| `b` | counter |"),
            vec!["| `b` | gauge |"]
        );
    }

    #[test]
    fn special_floats_use_the_format_spelling() {
        assert_eq!(Value::from(f64::INFINITY).to_string(), "+Inf");
        assert_eq!(Value::from(f64::NEG_INFINITY).to_string(), "-Inf");
        assert_eq!(Value::from(f64::NAN).to_string(), "NaN");
        assert_eq!(Value::from(0.0025).to_string(), "0.0025");
        assert_eq!(Value::from(5.0).to_string(), "5");
        assert_eq!(Value::from(u64::MAX).to_string(), "18446744073709551615");
    }

    proptest::proptest! {
        /// Whatever a label value holds, the sample stays one line and the value reads
        /// back unchanged after unescaping.
        #[test]
        fn any_label_value_round_trips(value in "\\PC*|[\\\\\"\n]{0,8}") {
            let mut text = Exposition::new();
            text.family("m", "M.", MetricType::Gauge).sample(&[("v", &value)], 1u8);
            let text = text.finish();
            let line = text.lines().nth(2).unwrap_or_default();
            proptest::prop_assert_eq!(text.lines().count(), 3);
            let quoted = line
                .strip_prefix("m{v=\"")
                .and_then(|rest| rest.strip_suffix("\"} 1"))
                .unwrap_or_default();
            let mut back = String::new();
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    match chars.next() {
                        Some('n') => back.push('\n'),
                        Some(other) => back.push(other),
                        None => {}
                    }
                } else {
                    back.push(c);
                }
            }
            proptest::prop_assert_eq!(back, value);
        }
    }
}
