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
//! `/metrics`) are measured alone. The rollout uses `maxUnavailable: 10%`; every node's
//! update (Activating → Succeeded) takes exactly T. Reported: wall time from the
//! rollout's creation to `Complete=True` against the ideal `ceil(N / slots) × T` (plus
//! the staging time), API writes per node, peak memory and reconcile latency.

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
    println!("scale bench: {nodes} nodes, maxUnavailable 10%, update time T = {update:?}");

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
    println!("created {nodes} nodes in {:?}", started.elapsed());

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
        "spec": {"release": "bench", "maxUnavailable": "10%",
                 "nodeSelector": {"matchLabels": {"pool": "bench"}}},
    }))?;
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    let rollout_started = Instant::now();
    rollouts.create(&PostParams::default(), &rollout).await?;

    let mut last_print = Instant::now();
    let mut peak_kib = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak_kib = peak_kib.max(peak_memory_kib(pid).unwrap_or(0));
        let r = rollouts.get("bench").await?;
        let status = r.status.unwrap_or_default();
        let complete = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True" && status.nodes.total > 0);
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
    let metrics = scrape(&metrics_addr).await;
    peak_kib = peak_kib.max(peak_memory_kib(pid).unwrap_or(0));

    let slots = (nodes / 10).max(1);
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
