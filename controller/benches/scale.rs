//! Scale benchmark (not a timed test): one rollout over many simulated nodes.
//!
//! ```text
//! CARGO_TARGET_DIR=/work/target-controller \
//!   INPLACE_BENCH_NODES=30000 INPLACE_BENCH_UPDATE_MS=2000 \
//!   cargo bench -p inplace-controller --bench scale
//! ```
//!
//! With `INPLACE_BENCH_API=real` the API is the real kube-apiserver + etcd of `tests/kube`
//! (their peak memory is reported too); by default it is the API emulator.
//!
//! The API server and the simulated agents run in this process; the controller runs as
//! its own process (the real `inplace-controller run` binary) so that its peak memory
//! (VmHWM) and its own metrics (reconcile latency, API writes by kind, scraped from
//! `/metrics`) are measured alone. The rollout uses `maxUnavailable: 10%`
//! (`INPLACE_BENCH_MAX_UNAVAILABLE` sets another count or percentage); every node's
//! update (Activating → Succeeded) takes exactly T. Reported: wall time from the
//! rollout's creation to `Complete=True` against the ideal `ceil(N / slots) × T` (plus
//! the staging time) and against the API-bound lower limit (the plan and agent status
//! writes divided by the server's write rate, measured while creating the nodes), the
//! controller's CPU time over the rollout (utime + stime of its process, per 1,000 nodes),
//! its API requests per node by verb, API writes per node, peak memory, reconcile latency
//! and the machine's load average. The test bed's own CPU over the rollout (this process:
//! the emulator and the simulated agents; the real server's processes) divided by the
//! machine's cores is a third lower limit: on a machine the bed saturates, the rollout
//! cannot end sooner, whatever the controller costs.

#[path = "../tests/support/sim_agent.rs"]
mod sim_agent;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use inplace_api_emulator::EmulatorConfig;
use inplace_proto::NodeRollout;
use inplace_tests::apiserver::ApiServer;
use inplace_tests::test_api::TestApi;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, PostParams};
use serde_json::json;
use sim_agent::{Fleet, SimConfig};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn peak_memory_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The process's CPU time so far (user + system), from `/proc/PID/stat`.
fn cpu_seconds(pid: u32, ticks_per_second: f64) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces, so split after its ')'):
    // state is field 3, utime 14 and stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks_per_second)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on Linux when unknown).
fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The test bed's processes, whose CPU is not the controller's: this one (the API
/// emulator, or the real server's clients, and the simulated agents) and the real server's.
fn bed_processes(api: &TestApi) -> anyhow::Result<Vec<(&'static str, u32)>> {
    let Some(server) = api.real() else {
        return Ok(vec![(
            "API emulator + simulated agents",
            std::process::id(),
        )]);
    };
    let mut bed = vec![("simulated agents", std::process::id())];
    bed.extend(server.processes()?);
    Ok(bed)
}

/// Each of `processes`' CPU time so far, in order (0 for one that is gone).
fn bed_cpu_seconds(processes: &[(&str, u32)], ticks_per_second: f64) -> Vec<f64> {
    processes
        .iter()
        .map(|(_, pid)| cpu_seconds(*pid, ticks_per_second).unwrap_or(0.0))
        .collect()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `inplace_controller_api_requests_total` by verb.
fn requests_by_verb(metrics: &str) -> BTreeMap<String, f64> {
    samples(metrics, "inplace_controller_api_requests_total")
        .into_iter()
        .filter_map(|(labels, v)| {
            let verb = labels
                .split("verb=\"")
                .nth(1)?
                .split('"')
                .next()?
                .to_owned();
            Some((verb, v))
        })
        .collect()
}

async fn scrape(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return String::new();
    };
    let _ = stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await;
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body).await;
    body
}

/// `name{labels} value` lines of one metric, as (labels, value).
fn samples(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let labels = key.strip_prefix(name)?.to_owned();
            Some((labels, value.parse().ok()?))
        })
        .collect()
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let nodes = env_number("INPLACE_BENCH_NODES", 30_000) as usize;
    let update = Duration::from_millis(env_number("INPLACE_BENCH_UPDATE_MS", 2_000));
    let download = Duration::from_millis(env_number("INPLACE_BENCH_STAGE_MS", 500));
    // A count ("30") or a percentage ("10%"): with few slots, a rollout runs many rounds
    // per node, which is where a decision's pass over the fleet would show.
    let max_unavailable = match std::env::var("INPLACE_BENCH_MAX_UNAVAILABLE") {
        Ok(text) => match text.parse::<i32>() {
            Ok(count) => IntOrString::Int(count),
            Err(_) => IntOrString::String(text),
        },
        Err(_) => IntOrString::String("10%".to_owned()),
    };
    println!(
        "scale bench: {nodes} nodes, maxUnavailable {}, update time T = {update:?}",
        serde_json::to_string(&max_unavailable)?
    );

    let api = if std::env::var("INPLACE_BENCH_API").is_ok_and(|v| v == "real") {
        println!("API: the real kube-apiserver + etcd (tests/kube)");
        TestApi::Real(ApiServer::start().await?)
    } else {
        println!("API: the emulator");
        TestApi::start_emulator(EmulatorConfig {
            history_window: 400_000,
            ..EmulatorConfig::default()
        })
        .await?
    };
    let crds =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/crds");
    api.apply_crd_dir(&crds).await?;
    let client = api.client().await?;

    let started = Instant::now();
    let node_api: Api<Node> = Api::all(client.clone());
    stream::iter(0..nodes)
        .map(|i| {
            let api = node_api.clone();
            async move {
                let node: Node = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": format!("node-{i:05}"), "labels": {"pool": "bench"}},
                    "spec": {},
                    "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
                }))?;
                api.create(&PostParams::default(), &node).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
    let created_in = started.elapsed();
    // The server's write rate on this machine now, at the bench's 64 writes in flight:
    // what the API-bound lower limit below divides by.
    let writes_per_second = nodes as f64 / created_in.as_secs_f64();
    println!(
        "created {nodes} nodes in {created_in:?}: the API server's write rate {writes_per_second:.0} writes/s"
    );
    let load_start = load_average();

    let fleet = Fleet::start(
        client.clone(),
        SimConfig {
            download,
            activate: update / 2,
            verify: update - update / 2,
            every_phase: false,
            ..SimConfig::default()
        },
    );

    let dir = std::env::temp_dir().join(format!("inplace-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let kubeconfig = dir.join("kubeconfig");
    api.write_admin_kubeconfig(&kubeconfig)?;
    let metrics_addr = {
        let probe = TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?.to_string()
    };
    let controller = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_inplace-controller"))
            .args(["run", "--no-leader-election", "--no-node-events"])
            .arg("--metrics-addr")
            .arg(&metrics_addr)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()?,
    );
    let pid = controller.0.id();
    let ticks = ticks_per_second();

    let release: inplace_proto::NodeRelease = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
        "metadata": {"name": "bench"},
        "spec": {"version": "v1", "artifacts": [{
            "name": "kubernetes", "type": "Sysext",
            "url": "https://extensions.example/kubernetes.raw",
            "sha256": "4f0c".repeat(16),
        }]},
    }))?;
    Api::<inplace_proto::NodeRelease>::all(client.clone())
        .create(&PostParams::default(), &release)
        .await?;
    let rollout: NodeRollout = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": "bench"},
        "spec": {"release": "bench", "maxUnavailable": max_unavailable,
                 "nodeSelector": {"matchLabels": {"pool": "bench"}}},
    }))?;
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    // The controller has listed everything once it watches its five streams (nodes, plans,
    // releases twice, rollouts); its CPU and requests are counted from the rollout's
    // creation, after that.
    let listed = Instant::now();
    while requests_by_verb(&scrape(&metrics_addr).await)
        .get("watch")
        .copied()
        .unwrap_or(0.0)
        < 5.0
        && listed.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cpu_before = cpu_seconds(pid, ticks).unwrap_or(0.0);
    let bed = bed_processes(&api)?;
    let bed_before = bed_cpu_seconds(&bed, ticks);
    let requests_before = requests_by_verb(&scrape(&metrics_addr).await);
    let rollout_started = Instant::now();
    rollouts.create(&PostParams::default(), &rollout).await?;

    let mut last_print = Instant::now();
    let mut peak_kib = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak_kib = peak_kib.max(peak_memory_kib(pid).unwrap_or(0));
        let r = rollouts.get("bench").await?;
        let status = r.status.unwrap_or_default();
        let complete = status.nodes.total > 0
            && inplace_proto::condition::is_true(
                &status.conditions,
                inplace_proto::reason::rollout_condition::COMPLETE,
            );
        if last_print.elapsed() > Duration::from_secs(5) || complete {
            println!(
                "t={:>6.1}s total={} pending={} staged={} updating={} succeeded={} (agents activating now: {})",
                rollout_started.elapsed().as_secs_f64(),
                status.nodes.total,
                status.nodes.pending,
                status.nodes.staged,
                status.nodes.updating,
                status.nodes.succeeded,
                fleet
                    .stats
                    .activating_now
                    .load(std::sync::atomic::Ordering::SeqCst),
            );
            last_print = Instant::now();
        }
        if complete {
            break;
        }
        anyhow::ensure!(
            rollout_started.elapsed() < Duration::from_secs(3600),
            "the rollout did not complete within an hour"
        );
    }
    let wall = rollout_started.elapsed();
    let cpu_rollout = cpu_seconds(pid, ticks).unwrap_or(0.0) - cpu_before;
    let cpu_total = cpu_seconds(pid, ticks).unwrap_or(0.0);
    let bed_rollout: Vec<(&str, f64)> = bed
        .iter()
        .zip(bed_cpu_seconds(&bed, ticks).iter().zip(&bed_before))
        .map(|((name, _), (after, before))| (*name, after - before))
        .collect();
    let metrics = scrape(&metrics_addr).await;
    peak_kib = peak_kib.max(peak_memory_kib(pid).unwrap_or(0));
    let load_end = load_average();
    let requests: BTreeMap<String, f64> = requests_by_verb(&metrics)
        .into_iter()
        .map(|(verb, v)| {
            let before = requests_before.get(&verb).copied().unwrap_or(0.0);
            (verb, v - before)
        })
        .collect();

    let slots = inplace_proto::rollout_slots::activation_slots(&max_unavailable, nodes);
    let waves = nodes.div_ceil(slots);
    let ideal = update * waves as u32;
    let writes: BTreeMap<String, f64> = samples(&metrics, "inplace_controller_api_writes_total")
        .into_iter()
        .collect();
    let controller_writes: f64 = writes.values().sum();
    let agent_writes = fleet
        .stats
        .status_writes
        .load(std::sync::atomic::Ordering::SeqCst);
    let buckets = samples(
        &metrics,
        "inplace_controller_reconcile_duration_seconds_bucket",
    );
    let rollout_buckets: Vec<(f64, f64)> = buckets
        .iter()
        .filter(|(l, _)| l.contains("controller=\"rollout\""))
        .filter_map(|(l, v)| {
            let le = l.split("le=\"").nth(1)?.trim_end_matches("\"}");
            Some((le.parse().unwrap_or(f64::INFINITY), *v))
        })
        .collect();
    let sum = samples(
        &metrics,
        "inplace_controller_reconcile_duration_seconds_sum",
    )
    .into_iter()
    .find(|(l, _)| l.contains("rollout"))
    .map_or(0.0, |(_, v)| v);
    let count = samples(
        &metrics,
        "inplace_controller_reconcile_duration_seconds_count",
    )
    .into_iter()
    .find(|(l, _)| l.contains("rollout"))
    .map_or(0.0, |(_, v)| v);
    let quantile = |q: f64| {
        rollout_buckets
            .iter()
            .find(|(_, c)| *c >= (count * q).ceil())
            .map_or(f64::INFINITY, |(le, _)| *le)
    };

    println!("\n== results ({nodes} nodes, {slots} slots, T = {update:?}) ==");
    println!(
        "wall time to Complete: {:.1}s; ideal ceil(N/slots) x T = {waves} x {:?} = {:.1}s \
         (+ staging {:?}): ratio {:.2}",
        wall.as_secs_f64(),
        update,
        ideal.as_secs_f64(),
        download,
        wall.as_secs_f64() / (ideal + download).as_secs_f64()
    );
    let agent_writes_now = fleet
        .stats
        .status_writes
        .load(std::sync::atomic::Ordering::SeqCst) as f64;
    let plan_and_status_writes =
        writes.get("{kind=\"plan_apply\"}").copied().unwrap_or(0.0) + agent_writes_now;
    let api_bound = plan_and_status_writes / writes_per_second;
    println!(
        "API-bound lower limit: {plan_and_status_writes} plan and agent status writes / \
         {writes_per_second:.0} writes/s = {api_bound:.1}s; ideal {:.1}s; wall / max(ideal, API-bound) = {:.2}",
        (ideal + download).as_secs_f64(),
        wall.as_secs_f64() / api_bound.max((ideal + download).as_secs_f64())
    );
    let bed_total: f64 = bed_rollout.iter().map(|(_, s)| s).sum();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let bed_bound = bed_total / cores as f64;
    println!(
        "test bed CPU: {bed_total:.1}s over the rollout ({}) on {cores} cores: the bed alone \
         needs {bed_bound:.1}s; wall / max(ideal, API-bound, test bed) = {:.2}; the controller's \
         share of the rollout's CPU {:.0} %",
        bed_rollout
            .iter()
            .map(|(name, s)| format!("{name} {s:.1}s"))
            .collect::<Vec<_>>()
            .join(", "),
        wall.as_secs_f64()
            / api_bound
                .max((ideal + download).as_secs_f64())
                .max(bed_bound),
        cpu_rollout / (cpu_rollout + bed_total) * 100.0
    );
    println!(
        "controller CPU: {cpu_rollout:.2}s over the rollout = {:.3}s per 1,000 nodes ({cpu_total:.2}s since start, the initial lists included)",
        cpu_rollout / nodes as f64 * 1000.0
    );
    let total_requests: f64 = requests.values().sum();
    println!(
        "controller API requests over the rollout: {total_requests} = {:.2} per node; per node by verb: {}",
        total_requests / nodes as f64,
        requests
            .iter()
            .map(|(verb, v)| format!("{verb} {:.3}", v / nodes as f64))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("load average at start / end: {load_start} / {load_end}");
    println!(
        "most agents activating at once: {} (slots {slots})",
        fleet.max_activating()
    );
    println!(
        "controller API writes: {controller_writes} = {:.2} per node; by kind: {writes:?}",
        controller_writes / nodes as f64
    );
    println!(
        "simulated agents' status writes: {agent_writes} = {:.2} per node",
        agent_writes as f64 / nodes as f64
    );
    println!(
        "controller peak memory (VmHWM): {:.1} MiB",
        peak_kib as f64 / 1024.0
    );
    println!(
        "rollout reconciles: {count}; latency mean {:.1} ms, p50 <= {} s, p99 <= {} s (histogram buckets)",
        if count > 0.0 {
            sum / count * 1000.0
        } else {
            0.0
        },
        quantile(0.5),
        quantile(0.99)
    );
    if let Some(server) = api.real() {
        for (name, pid) in server.processes()? {
            println!(
                "{name} peak memory (VmHWM): {:.1} MiB",
                peak_memory_kib(pid).unwrap_or(0) as f64 / 1024.0
            );
        }
    }
    drop(controller);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
