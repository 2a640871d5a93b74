//! (4) Fleet: the controller's rollout simulation (`controller/benches/scale.rs`: the API
//! emulator and simulated agents in one process, the real controller binary in another),
//! run under `/usr/bin/time -v`; its printed results are parsed into rows.

use anyhow::{Context, Result, bail};

use crate::report::repo_root;
use crate::{Opts, Row};

/// The number after `key` in `text` (up to the next character that is not part of a number).
fn number_after(text: &str, key: &str) -> Option<f64> {
    let rest = &text[text.find(key)? + key.len()..];
    let rest = rest.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines().find(|l| l.trim_start().starts_with(prefix))
}

async fn build_exe() -> Result<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("fleet: building the controller's scale bench");
    let build = tokio::process::Command::new(&cargo)
        .args([
            "bench",
            "-p",
            "inplace-controller",
            "--bench",
            "scale",
            "--no-run",
        ])
        .current_dir(repo_root())
        .output()
        .await
        .context("cargo bench --no-run")?;
    let stderr = String::from_utf8_lossy(&build.stderr);
    if !build.status.success() {
        bail!("building the scale bench failed: {stderr}");
    }
    let exe = stderr
        .lines()
        .find(|l| l.contains("benches/scale.rs"))
        .and_then(|l| l.rsplit_once('(')?.1.strip_suffix(')'))
        .map(str::to_owned)
        .context("cargo did not name the scale bench executable")?;
    Ok(exe)
}

/// The fleet rows.
pub async fn run(o: &Opts) -> Result<Vec<Row>> {
    let n = o.fleet_nodes;
    let (stdout, time) = if let Some(log) = &o.fleet_log {
        let stdout =
            std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
        let time_path = format!("{}.time", log.display());
        let time =
            std::fs::read_to_string(&time_path).with_context(|| format!("reading {time_path}"))?;
        (stdout, time)
    } else {
        let exe = match &o.fleet_exe {
            Some(exe) => exe.display().to_string(),
            None => build_exe().await?,
        };
        eprintln!("fleet: {exe} with {n} nodes");
        let out = tokio::process::Command::new("/usr/bin/time")
            .arg("-v")
            .arg(&exe)
            .arg("--bench")
            .env("INPLACE_BENCH_NODES", n.to_string())
            .current_dir(repo_root().join("controller"))
            .output()
            .await
            .context("/usr/bin/time -v <scale bench>")?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let time = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            bail!("the scale bench failed: {stdout}\n{time}");
        }
        (stdout, time)
    };
    // The bench names its own size.
    let n = line(&stdout, "scale bench:")
        .and_then(|l| number_after(l, "scale bench:"))
        .map_or(n, |v| v as u64);
    let reproduce = format!(
        "INPLACE_BENCH_NODES={n} /usr/bin/time -v cargo bench -p inplace-controller --bench scale"
    );
    let mut rows = Vec::new();
    let wall_line = line(&stdout, "wall time to Complete").context("no wall time line")?;
    let wall = number_after(wall_line, "Complete:").context("wall time")?;
    let ratio = number_after(wall_line, "ratio").context("ratio")?;
    let ideal_text = wall_line
        .split_once("ideal")
        .map(|(_, r)| r.split(':').next().unwrap_or("").trim().to_owned())
        .unwrap_or_default();
    rows.push(
        Row::reference(
            "4 fleet",
            format!("{n} simulated nodes, maxUnavailable 10 %: wall time to Complete"),
            format!("{wall:.1} (ideal {ideal_text}; ratio {ratio:.2})"),
            "s",
            reproduce.clone(),
        )
        .target("close to ideal (ratio ≤ 1.2)", ratio <= 1.2),
    );
    if let Some(l) = line(&stdout, "controller API writes") {
        let per = number_after(l, "=").unwrap_or(f64::NAN);
        rows.push(Row::reference(
            "4 fleet",
            "controller API writes per node",
            format!("{per:.2}"),
            "writes/node",
            reproduce.clone(),
        ));
    }
    if let Some(l) = line(&stdout, "simulated agents' status writes") {
        let per = number_after(l, "=").unwrap_or(f64::NAN);
        rows.push(Row::reference(
            "4 fleet",
            "agent status writes per node (simulated agents)",
            format!("{per:.2}"),
            "writes/node",
            reproduce.clone(),
        ));
    }
    if let Some(l) = line(&stdout, "controller peak memory") {
        let mib = number_after(l, "(VmHWM):").unwrap_or(f64::NAN);
        rows.push(Row::reference(
            "4 fleet",
            "controller peak memory (VmHWM)",
            format!("{mib:.1}"),
            "MiB",
            reproduce.clone(),
        ));
    }
    if let Some(kib) = number_after(&time, "Maximum resident set size (kbytes):") {
        rows.push(Row::reference(
            "4 fleet",
            "API emulator + simulated agents peak memory (one process; max RSS)",
            format!("{:.1}", kib / 1024.0),
            "MiB",
            reproduce.clone(),
        ));
    }
    if let Some(l) = line(&stdout, "rollout reconciles") {
        rows.push(Row::reference(
            "4 fleet",
            "rollout reconcile latency",
            l.split_once(';').map_or(l, |(_, r)| r).trim().to_owned(),
            "",
            reproduce,
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_scale_bench_lines() {
        let l = "wall time to Complete: 31.2s; ideal ceil(N/slots) x T = 10 x 2s = 20.0s (+ staging 500ms): ratio 1.52";
        assert_eq!(number_after(l, "Complete:"), Some(31.2));
        assert_eq!(number_after(l, "ratio"), Some(1.52));
        let w = "controller API writes: 60000 = 2.00 per node; by kind: {}";
        assert_eq!(number_after(w, "="), Some(2.0));
    }
}
