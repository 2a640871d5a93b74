//! The machine description at the top of docs/benchmarks.md.

use std::fmt::Write as _;

fn first_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

fn sh(cmd: &str) -> String {
    std::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// `/proc/loadavg`'s first three fields.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether the CPU advertises the SHA extensions.
pub fn sha_ni() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| l.split_whitespace().any(|f| f == "sha_ni"))
}

/// A markdown list describing the machine.
pub fn describe() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let model = first_value(&cpuinfo, "model name").unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = first_value(&meminfo, "MemTotal").unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "- date: {}",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    let _ = writeln!(out, "- CPU: {model}, {cores} cores available");
    let _ = writeln!(
        out,
        "- SHA extensions (`sha_ni` in /proc/cpuinfo): {}",
        if sha_ni() { "yes" } else { "no" }
    );
    let _ = writeln!(out, "- memory: {mem}");
    let _ = writeln!(out, "- kernel: {}", sh("uname -srm"));
    let _ = writeln!(
        out,
        "- disk (bench directory): {}",
        sh("df -hT /var/tmp | tail -n1 | awk '{print $1\", \"$2\", \"$3\" total, \"$5\" free\"}'")
    );
    let _ = writeln!(
        out,
        "- tools: {}; {}; {}; {}",
        sh("curl --version | head -n1 | cut -d' ' -f1-2"),
        sh("openssl version"),
        sh("nginx -v 2>&1"),
        sh("sha256sum --version | head -n1")
    );
    out
}
