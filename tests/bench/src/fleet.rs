//! (4) Fleet: the controller's rollout simulation (`controller/benches/scale.rs`: the API
//! and simulated agents in one process, the real controller binary in another), run under
//! `/usr/bin/time -v`; its printed results are parsed into rows. It runs on the API
//! emulator at each size asked for (3,000 and 30,000), and on the real kube-apiserver + etcd
//! (`tests/kube`) at the N this 2-core machine sustains beside other work in minutes
//! (3,000).

use anyhow::{Context, Result, bail};

use crate::report::repo_root;
use crate::{Opts, Row};

/// The number after `key` in `text` (up to the next character that is not part of a number).
pub(crate) fn number_after(text: &str, key: &str) -> Option<f64> {
    let rest = &text[text.find(key)? + key.len()..];
    let rest = rest.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

pub(crate) fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines().find(|l| l.trim_start().starts_with(prefix))
}

pub(crate) async fn build_exe() -> Result<String> {
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
            "--message-format=json",
        ])
        .current_dir(repo_root())
        .output()
        .await
        .context("cargo bench --no-run")?;
    if !build.status.success() {
        bail!(
            "building the scale bench failed: {}",
            String::from_utf8_lossy(&build.stderr)
        );
    }
    scale_bench_executable(&String::from_utf8_lossy(&build.stdout))
}

/// The scale bench's executable from cargo's JSON messages: the `executable` of the
/// `scale` bench artifact, an absolute path wherever the target directory is (cargo's human
/// output names it relative to the workspace, which broke runs from another directory).
fn scale_bench_executable(messages: &str) -> Result<String> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "scale")
        .find_map(|m| m["executable"].as_str().map(str::to_owned))
        .context("cargo's JSON messages name no executable for the scale bench")
}

/// Which API server a fleet run uses.
#[derive(Clone, Copy, PartialEq)]
enum Api {
    Emulator,
    Real,
}

/// The fleet rows: the emulator run, then the real-server run.
pub async fn run(o: &Opts) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &n in &o.fleet_nodes {
        rows.extend(run_on(o, Api::Emulator, n).await?);
    }
    if o.real_fleet_nodes > 0 {
        rows.extend(run_on(o, Api::Real, o.real_fleet_nodes).await?);
    }
    Ok(rows)
}

async fn run_on(o: &Opts, api: Api, n: u64) -> Result<Vec<Row>> {
    let saved_log = o.fleet_log.as_ref().filter(|_| api == Api::Emulator);
    let (stdout, time) = if let Some(log) = saved_log {
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
            .env(
                "INPLACE_BENCH_API",
                if api == Api::Real { "real" } else { "emulator" },
            )
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
    rows_from(&stdout, &time, n, api)
}

/// The rows of one run's printed results.
fn rows_from(stdout: &str, time: &str, n: u64, api: Api) -> Result<Vec<Row>> {
    // The bench names its own size.
    let n = line(stdout, "scale bench:")
        .and_then(|l| number_after(l, "scale bench:"))
        .map_or(n, |v| v as u64);
    let (section, server, env) = match api {
        Api::Emulator => ("4 fleet", "API emulator", ""),
        Api::Real => (
            "4 fleet, real API",
            "kube-apiserver + etcd",
            "INPLACE_BENCH_API=real ",
        ),
    };
    let reproduce = format!(
        "{env}INPLACE_BENCH_NODES={n} /usr/bin/time -v cargo bench -p inplace-controller --bench scale"
    );
    // Every row names its N: one section holds the runs of every size.
    let row = |what: String, value: String, unit: &str| {
        let what = if what.starts_with(&n.to_string()) {
            what
        } else {
            format!("{what} ({n})")
        };
        Row::reference(section, what, value, unit, reproduce.clone())
    };
    let mut rows = Vec::new();
    let load = line(stdout, "load average at start / end:")
        .and_then(|l| l.split_once(':'))
        .map(|(_, r)| r.trim().to_owned());
    let wall_line = line(stdout, "wall time to Complete").context("no wall time line")?;
    let wall = number_after(wall_line, "Complete:").context("wall time")?;
    let ratio = number_after(wall_line, "ratio").context("ratio")?;
    let ideal_text = wall_line
        .split_once("ideal")
        .map(|(_, r)| r.split(':').next().unwrap_or("").trim().to_owned())
        .unwrap_or_default();
    rows.push(
        row(
            format!(
                "{n} simulated nodes on the {server}, maxUnavailable 10 %: wall time to Complete"
            ),
            format!("{wall:.1} (ideal {ideal_text}; ratio {ratio:.2})"),
            "s",
        )
        .target("close to ideal (ratio ≤ 1.2)", ratio <= 1.2),
    );
    if let Some(l) = line(stdout, "API-bound lower limit:") {
        let limit = number_after(l, "writes/s =").unwrap_or(f64::NAN);
        let ratio = number_after(l, "API-bound) =").unwrap_or(f64::NAN);
        rows.push(
            row(
                "API-bound lower limit (plan + agent status writes / the server's write rate) and wall / max(ideal, limit)".into(),
                format!("{limit:.1} (ratio {ratio:.2})"),
                "s",
            )
            .target("ratio ≤ 1.2", ratio <= 1.2),
        );
    }
    if let Some(l) = line(stdout, "test bed CPU:") {
        let needs = number_after(l, "needs").unwrap_or(f64::NAN);
        let ratio = number_after(l, "test bed) =").unwrap_or(f64::NAN);
        let share = number_after(l, "share of the rollout's CPU").unwrap_or(f64::NAN);
        rows.push(row(
            format!("test-bed-bound lower limit (CPU of the {server} and the simulated agents over the rollout / cores), wall / max(ideal, API-bound, test bed), the controller's share of the rollout's CPU"),
            format!("{needs:.1} (ratio {ratio:.2}; controller {share:.0} %)"),
            "s",
        ));
    }
    rows.extend(cost_rows(stdout, time, api, load, &row));
    Ok(rows)
}

/// The rows of what the rollout cost: the controller's CPU, requests, writes and memory, the
/// agents' writes, the bed's memory, the load and the reconcile latency.
fn cost_rows(
    stdout: &str,
    time: &str,
    api: Api,
    load: Option<String>,
    row: &dyn Fn(String, String, &str) -> Row,
) -> Vec<Row> {
    let mut rows = Vec::new();
    if let Some(l) = line(stdout, "controller CPU:") {
        let per = number_after(l, "=").unwrap_or(f64::NAN);
        rows.push(
            row(
                "controller CPU (utime + stime of its process) over the rollout, per 1,000 nodes"
                    .into(),
                format!("{per:.3}"),
                "s",
            )
            .target("≤ 0.2", per <= 0.2),
        );
    }
    if let Some(l) = line(stdout, "controller API requests over the rollout:") {
        let per = number_after(l, "=").unwrap_or(f64::NAN);
        let by_verb = l.split_once("by verb:").map_or("", |(_, r)| r.trim());
        rows.push(row(
            "controller API requests per node (by verb)".into(),
            format!("{per:.2} ({by_verb})"),
            "requests/node",
        ));
    }
    if let Some(load) = load {
        rows.push(row(
            "load average (1, 5, 15 min) at the run's start / end".into(),
            load,
            "",
        ));
    }
    if let Some(l) = line(stdout, "controller API writes") {
        let per = number_after(l, "=").unwrap_or(f64::NAN);
        rows.push(row(
            "controller API writes per node".into(),
            format!("{per:.2}"),
            "writes/node",
        ));
    }
    if let Some(l) = line(stdout, "simulated agents' status writes") {
        let per = number_after(l, "=").unwrap_or(f64::NAN);
        rows.push(row(
            "agent status writes per node (simulated agents)".into(),
            format!("{per:.2}"),
            "writes/node",
        ));
    }
    if let Some(l) = line(stdout, "controller peak memory") {
        let mib = number_after(l, "(VmHWM):").unwrap_or(f64::NAN);
        rows.push(
            row(
                "controller peak memory (VmHWM)".into(),
                format!("{mib:.1}"),
                "MiB",
            )
            .target("≤ 300 at 30,000 nodes", mib <= 300.0),
        );
    }
    for process in ["kube-apiserver", "etcd"] {
        if let Some(l) = line(stdout, &format!("{process} peak memory")) {
            let mib = number_after(l, "(VmHWM):").unwrap_or(f64::NAN);
            rows.push(row(
                format!("{process} peak memory (VmHWM)"),
                format!("{mib:.1}"),
                "MiB",
            ));
        }
    }
    if let Some(kib) = number_after(time, "Maximum resident set size (kbytes):") {
        let what = match api {
            Api::Emulator => "API emulator + simulated agents peak memory (one process; max RSS)",
            Api::Real => {
                "simulated agents (+ etcd, embedded) peak memory (one process tree's largest; max RSS)"
            }
        };
        rows.push(row(what.into(), format!("{:.1}", kib / 1024.0), "MiB"));
    }
    if let Some(l) = line(stdout, "rollout reconciles") {
        rows.push(row(
            "rollout reconcile latency".into(),
            l.split_once(';').map_or(l, |(_, r)| r).trim().to_owned(),
            "",
        ));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_bench_is_named_by_cargos_absolute_executable_path() {
        // The shape of `cargo bench --no-run --message-format=json` output: libraries have
        // no executable, build scripts another reason, the bench its absolute path.
        let messages = [
            r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"inplace_proto"},"executable":null}"#,
            r#"{"reason":"build-script-executed","package_id":"x"}"#,
            "not JSON: a line another tool printed",
            r#"{"reason":"compiler-artifact","target":{"kind":["bench"],"name":"scale"},"executable":"/clone/target/release/deps/scale-0123abcd"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        assert_eq!(
            scale_bench_executable(&messages).unwrap(),
            "/clone/target/release/deps/scale-0123abcd"
        );
        let none = scale_bench_executable(messages.lines().next().unwrap()).unwrap_err();
        assert!(
            none.to_string()
                .contains("no executable for the scale bench")
        );
    }

    #[test]
    fn a_runs_printed_results_become_rows_naming_its_size() {
        let stdout = "scale bench: 3000 nodes, maxUnavailable 10%, update time T = 2s
wall time to Complete: 30.0s; ideal ceil(N/slots) x T = 10 x 2s = 20.0s (+ staging 500ms): ratio 1.46
API-bound lower limit: 15000 plan and agent status writes / 500 writes/s = 30.0s; ideal 20.5s; wall / max(ideal, API-bound) = 1.00
test bed CPU: 40.2s over the rollout (API emulator + simulated agents 40.2s) on 2 cores: the bed alone needs 20.1s; wall / max(ideal, API-bound, test bed) = 1.00; the controller's share of the rollout's CPU 2 %
controller CPU: 0.90s over the rollout = 0.300s per 1,000 nodes (2.00s since start, the initial lists included)
controller API requests over the rollout: 6100 = 2.03 per node; per node by verb: create 0.001, patch 2.030, watch 0.002
load average at start / end: 3.1 2.9 2.5 / 4.0 3.2 2.6
controller peak memory (VmHWM): 40.5 MiB
";
        let rows = rows_from(stdout, "", 3000, Api::Emulator).unwrap();
        let value = |what: &str| {
            rows.iter()
                .find(|r| r.name.starts_with(what))
                .map(|r| (r.name.clone(), r.value.clone(), r.verdict.clone()))
                .unwrap()
        };
        let (name, cpu, verdict) = value("controller CPU");
        assert!(name.ends_with("(3000)"), "{name}");
        assert_eq!((cpu.as_str(), verdict.as_str()), ("0.300", "MISSED"));
        let (_, limit, verdict) = value("API-bound lower limit");
        assert_eq!(
            (limit.as_str(), verdict.as_str()),
            ("30.0 (ratio 1.00)", "ok")
        );
        let (name, bed, verdict) = value("test-bed-bound lower limit");
        assert!(
            name.contains("CPU of the API emulator and the simulated agents"),
            "{name}"
        );
        assert_eq!(
            (bed.as_str(), verdict.as_str()),
            ("20.1 (ratio 1.00; controller 2 %)", "ref")
        );
        let (_, requests, _) = value("controller API requests per node");
        assert!(
            requests.starts_with("2.03 (create 0.001, patch 2.030"),
            "{requests}"
        );
        let (_, load, _) = value("load average");
        assert_eq!(load, "3.1 2.9 2.5 / 4.0 3.2 2.6");
    }
}
