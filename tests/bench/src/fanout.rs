//! (4, fan-out) The staging fan-out: the controller's rollout simulation (`controller/benches/
//! scale.rs`) with every node's staging a real download from one artifact server whose
//! uplink all downloads share (`controller/benches/scale/fanout.rs`), run without
//! `spec.staging.maxConcurrent` and with it: when the fleet was staged against the link's
//! own limit, the most downloads at once counted by the server, and how long one node's
//! download took.

use anyhow::{Context, Result, bail};

use crate::fleet::{build_exe, line, number_after};
use crate::report::repo_root;
use crate::{Opts, Row};

/// The fan-out rows: one run without a limit, one with `--fanout-max-concurrent`.
pub async fn run(o: &Opts) -> Result<Vec<Row>> {
    if o.fanout_nodes == 0 {
        return Ok(Vec::new());
    }
    let exe = match &o.fleet_exe {
        Some(exe) => exe.display().to_string(),
        None => build_exe().await?,
    };
    let mut rows = Vec::new();
    for limit in [None, Some(o.fanout_max_concurrent.as_str())] {
        rows.extend(run_one(o, &exe, limit).await?);
    }
    Ok(rows)
}

async fn run_one(o: &Opts, exe: &str, limit: Option<&str>) -> Result<Vec<Row>> {
    let n = o.fanout_nodes;
    eprintln!(
        "fan-out: {exe} with {n} nodes, {} MiB each, maxConcurrent {}",
        o.fanout_mib,
        limit.unwrap_or("none")
    );
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("--bench")
        .env("INPLACE_BENCH_NODES", n.to_string())
        .env("INPLACE_BENCH_API", "emulator")
        .env("INPLACE_BENCH_FANOUT_MIB", o.fanout_mib.to_string())
        .env("INPLACE_BENCH_LINK_MIBPS", o.fanout_link_mibps.to_string())
        // Activation out of the way: the rows are about staging.
        .env("INPLACE_BENCH_MAX_UNAVAILABLE", "100%")
        .env("INPLACE_BENCH_UPDATE_MS", "200")
        .env_remove("INPLACE_BENCH_MAX_CONCURRENT")
        .current_dir(repo_root().join("controller"));
    if let Some(limit) = limit {
        command.env("INPLACE_BENCH_MAX_CONCURRENT", limit);
    }
    let out = command
        .output()
        .await
        .context("the scale bench (fan-out)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "the scale bench (fan-out) failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    rows_from(o, &stdout, limit)
}

fn rows_from(o: &Opts, stdout: &str, limit: Option<&str>) -> Result<Vec<Row>> {
    let l = line(stdout, "fan-out:").context("the scale bench printed no fan-out line")?;
    let value = |key: &str| number_after(l, &format!("{key}=")).unwrap_or(f64::NAN);
    let n = o.fanout_nodes;
    let limit_env = limit.map_or(String::new(), |l| {
        format!("INPLACE_BENCH_MAX_CONCURRENT={l} ")
    });
    let reproduce = format!(
        "INPLACE_BENCH_NODES={n} INPLACE_BENCH_FANOUT_MIB={} INPLACE_BENCH_LINK_MIBPS={} \
         INPLACE_BENCH_MAX_UNAVAILABLE=100% INPLACE_BENCH_UPDATE_MS=200 {limit_env}\
         cargo bench -p inplace-controller --bench scale",
        o.fanout_mib, o.fanout_link_mibps
    );
    let which = match limit {
        Some(l) => format!("staging.maxConcurrent {l}"),
        None => "no staging limit".to_owned(),
    };
    let what = |measure: &str| {
        format!(
            "{n} simulated nodes × {} MiB through one {} MiB/s link, {which}: {measure}",
            o.fanout_mib, o.fanout_link_mibps
        )
    };
    let row = |name: String, value: String, unit: &str| {
        Row::reference(
            "4 fleet, staging fan-out",
            name,
            value,
            unit,
            reproduce.clone(),
        )
    };
    let peak = value("peak_downloads");
    let mut peak_row = row(
        what("most downloads at once (counted by the server)"),
        format!("{peak:.0}"),
        "downloads",
    );
    if let Some(l) = limit.and_then(|l| l.parse::<f64>().ok()) {
        peak_row = peak_row.target(format!("≤ maxConcurrent ({l:.0})"), peak <= l);
    }
    let staged = value("staged_all_s");
    let link_limit = value("link_limit_s");
    Ok(vec![
        row(
            what(
                "every node staged, from the rollout's creation (the link's limit: all bytes / cap)",
            ),
            format!(
                "{staged:.1} (limit {link_limit:.1}; ratio {:.2})",
                staged / link_limit
            ),
            "s",
        ),
        peak_row,
        row(
            what("one node's download, median / slowest (failed attempts)"),
            format!(
                "{:.1} / {:.1} ({:.0})",
                value("median_download_s"),
                value("slowest_download_s"),
                value("failed_attempts")
            ),
            "s",
        ),
    ])
}
