//! Small helpers: medians, timed shell commands, /proc readings.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The median of some samples (the lower middle for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// Runs `sh -c cmd`, returns its wall time; fails on a non-zero exit.
pub async fn timed_sh(cmd: &str) -> Result<(Duration, String)> {
    let started = Instant::now();
    let out = tokio::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .await
        .with_context(|| format!("sh -c {cmd}"))?;
    let took = started.elapsed();
    if !out.status.success() {
        bail!(
            "`{cmd}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((took, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// A `Key:   123 kB` field of /proc/<pid>/status, in its own unit.
pub fn status_field(pid: &str, key: &str) -> Option<u64> {
    status_field_text(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        key,
    )
}

/// A `Key:   123 kB` field of a /proc/<pid>/status text.
pub fn status_field_text(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// utime + stime, in clock ticks, from a /proc/<pid>/stat text.
pub fn cpu_ticks_text(stat: &str) -> Option<u64> {
    // The command name may contain spaces; fields after the closing parenthesis.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts with field 3 (state); utime is field 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Seconds, three decimals.
pub fn secs(d: f64) -> String {
    format!("{d:.3}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_texts() {
        let stat = "42 (a b) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 2 0 1 0 0";
        assert_eq!(cpu_ticks_text(stat), Some(12));
        let status = "Name:\tx\nVmRSS:\t  5120 kB\nvoluntary_ctxt_switches:\t3\n";
        assert_eq!(status_field_text(status, "VmRSS"), Some(5120));
        assert_eq!(
            status_field_text(status, "voluntary_ctxt_switches"),
            Some(3)
        );
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }
}
