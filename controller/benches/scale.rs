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
//!
//! With `INPLACE_BENCH_FANOUT_MIB` the staging is real downloads through one capped link
//! (`scale/fanout.rs`).

#[path = "scale/fanout.rs"]
mod fanout;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use inplace_api_emulator::EmulatorConfig;
use inplace_proto::NodeRollout;
use inplace_tests::apiserver::ApiServer;
use inplace_tests::fixtures::ReleaseFixture;
use inplace_tests::sim_agent::{Fleet, SimConfig};
use inplace_tests::test_api::TestApi;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, PostParams};
use serde_json::json;

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

/// One run's settings, from the environment.
struct Settings {
    nodes: usize,
    /// Every node's update (Activating → Succeeded) takes exactly this long.
    update: Duration,
    /// And its download (staging) this long.
    download: Duration,
    max_unavailable: IntOrString,
}

impl Settings {
    fn from_env() -> Settings {
        // A count ("30") or a percentage ("10%"): with few slots, a rollout runs many rounds
        // per node, which is where a decision's pass over the fleet would show.
        let max_unavailable = match std::env::var("INPLACE_BENCH_MAX_UNAVAILABLE") {
            Ok(text) => match text.parse::<i32>() {
                Ok(count) => IntOrString::Int(count),
                Err(_) => IntOrString::String(text),
            },
            Err(_) => IntOrString::String("10%".to_owned()),
        };
        Settings {
            nodes: env_number("INPLACE_BENCH_NODES", 30_000) as usize,
            update: Duration::from_millis(env_number("INPLACE_BENCH_UPDATE_MS", 2_000)),
            download: Duration::from_millis(env_number("INPLACE_BENCH_STAGE_MS", 500)),
            max_unavailable,
        }
    }
}

/// The API the bench runs against: the emulator, or the real server with
/// `INPLACE_BENCH_API=real`; the CRDs applied.
async fn start_api() -> anyhow::Result<TestApi> {
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
    Ok(api)
}

/// Creates `nodes` Ready nodes, 64 at a time; returns the server's write rate while doing
/// so (what the API-bound lower limit divides by).
async fn create_nodes(client: &kube::Client, nodes: usize) -> anyhow::Result<f64> {
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
    let writes_per_second = nodes as f64 / created_in.as_secs_f64();
    println!(
        "created {nodes} nodes in {created_in:?}: the API server's write rate {writes_per_second:.0} writes/s"
    );
    Ok(writes_per_second)
}

/// The real `inplace-controller run` as its own process, measured alone.
struct Controller {
    process: KillOnDrop,
    metrics_addr: String,
    dir: PathBuf,
}

impl Controller {
    fn start(api: &TestApi) -> anyhow::Result<Controller> {
        let dir = std::env::temp_dir().join(format!("inplace-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = dir.join("kubeconfig");
        api.write_admin_kubeconfig(&kubeconfig)?;
        let metrics_addr = {
            let probe = TcpListener::bind("127.0.0.1:0")?;
            probe.local_addr()?.to_string()
        };
        let process = KillOnDrop(
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
        Ok(Controller {
            process,
            metrics_addr,
            dir,
        })
    }

    fn pid(&self) -> u32 {
        self.process.0.id()
    }

    async fn metrics(&self) -> String {
        scrape(&self.metrics_addr).await
    }

    /// Waits until the controller watches its five streams (nodes, plans, releases twice,
    /// rollouts): it has listed everything, and what it costs from now on is the rollout's.
    async fn wait_until_listed(&self) {
        let listed = Instant::now();
        while requests_by_verb(&self.metrics().await)
            .get("watch")
            .copied()
            .unwrap_or(0.0)
            < 5.0
            && listed.elapsed() < Duration::from_secs(120)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The release every node updates to, and the rollout over all of them.
async fn create_release(client: &kube::Client) -> anyhow::Result<()> {
    ReleaseFixture::bare("bench", "v1")
        .kubernetes_sysext(
            "https://extensions.example/kubernetes.raw",
            &"4f0c".repeat(16),
            None,
        )
        .create(client)
        .await?;
    Ok(())
}

fn rollout(
    max_unavailable: &IntOrString,
    staging: Option<serde_json::Value>,
) -> anyhow::Result<NodeRollout> {
    let mut rollout = json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": "bench"},
        "spec": {"release": "bench", "maxUnavailable": max_unavailable,
                 "nodeSelector": {"matchLabels": {"pool": "bench"}}},
    });
    if let Some(staging) = staging {
        rollout["spec"]["staging"] = staging;
    }
    Ok(serde_json::from_value(rollout)?)
}

/// Follows the rollout until `Complete=True`, printing progress every 5 s; the wall time
/// and the controller's peak memory (KiB) meanwhile.
async fn follow(
    rollouts: &Api<NodeRollout>,
    fleet: &Fleet,
    pid: u32,
) -> anyhow::Result<(Duration, u64)> {
    let started = Instant::now();
    let mut last_print = Instant::now();
    let mut peak_kib = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        peak_kib = peak_kib.max(peak_memory_kib(pid).unwrap_or(0));
        let status = rollouts.get("bench").await?.status.unwrap_or_default();
        let complete = status.nodes.total > 0
            && inplace_proto::condition::is_true(
                &status.conditions,
                inplace_proto::reason::rollout_condition::COMPLETE,
            );
        if last_print.elapsed() > Duration::from_secs(5) || complete {
            println!(
                "t={:>6.1}s total={} pending={} staged={} updating={} succeeded={} (agents activating now: {})",
                started.elapsed().as_secs_f64(),
                status.nodes.total,
                status.nodes.pending,
                status.nodes.staged,
                status.nodes.updating,
                status.nodes.succeeded,
                fleet.stats.activating_now.load(Ordering::SeqCst),
            );
            last_print = Instant::now();
        }
        if complete {
            return Ok((started.elapsed(), peak_kib));
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(3600),
            "the rollout did not complete within an hour"
        );
    }
}

/// The counters that are read before the rollout and after it: the rollout's share is the
/// difference.
struct Counters {
    controller_cpu: f64,
    bed_cpu: Vec<f64>,
    requests: BTreeMap<String, f64>,
}

impl Counters {
    async fn read(controller: &Controller, bed: &[(&str, u32)], ticks: f64) -> Counters {
        Counters {
            controller_cpu: cpu_seconds(controller.pid(), ticks).unwrap_or(0.0),
            bed_cpu: bed_cpu_seconds(bed, ticks),
            requests: requests_by_verb(&controller.metrics().await),
        }
    }
}

/// What one rollout cost, for the report.
struct Run<'a> {
    settings: &'a Settings,
    wall: Duration,
    /// The server's write rate while the nodes were created.
    writes_per_second: f64,
    /// The controller's CPU over the rollout, and since it started.
    cpu_rollout: f64,
    cpu_total: f64,
    /// The test bed's processes' CPU over the rollout.
    bed_rollout: Vec<(&'a str, f64)>,
    /// The controller's requests over the rollout, by verb.
    requests: BTreeMap<String, f64>,
    /// The controller's metrics at the end.
    metrics: String,
    peak_kib: u64,
    agent_writes: usize,
    max_activating: usize,
    load: (String, String),
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::from_env();
    println!(
        "scale bench: {} nodes, maxUnavailable {}, update time T = {:?}",
        settings.nodes,
        serde_json::to_string(&settings.max_unavailable)?,
        settings.update
    );
    let api = start_api().await?;
    let client = api.client().await?;
    let writes_per_second = create_nodes(&client, settings.nodes).await?;
    let load_start = load_average();

    let fanout = fanout::Fanout::from_env(settings.nodes).await?;
    let fleet = Fleet::start(
        client.clone(),
        SimConfig {
            download: settings.download,
            activate: settings.update / 2,
            verify: settings.update - settings.update / 2,
            every_phase: false,
            download_from: fanout.as_ref().map(fanout::Fanout::url),
            ..SimConfig::default()
        },
    );
    let controller = Controller::start(&api)?;
    let ticks = ticks_per_second();
    create_release(&client).await?;
    controller.wait_until_listed().await;
    let bed = bed_processes(&api)?;
    let before = Counters::read(&controller, &bed, ticks).await;
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    let began = Instant::now();
    let staging = fanout.as_ref().and_then(fanout::Fanout::staging);
    rollouts
        .create(
            &PostParams::default(),
            &rollout(&settings.max_unavailable, staging)?,
        )
        .await?;
    let (wall, peak_kib) = follow(&rollouts, &fleet, controller.pid()).await?;

    let after = Counters::read(&controller, &bed, ticks).await;
    let run = Run {
        settings: &settings,
        wall,
        writes_per_second,
        cpu_rollout: after.controller_cpu - before.controller_cpu,
        cpu_total: after.controller_cpu,
        bed_rollout: bed
            .iter()
            .zip(after.bed_cpu.iter().zip(&before.bed_cpu))
            .map(|((name, _), (after, before))| (*name, after - before))
            .collect(),
        requests: after
            .requests
            .into_iter()
            .map(|(verb, v)| {
                let before = before.requests.get(&verb).copied().unwrap_or(0.0);
                (verb, v - before)
            })
            .collect(),
        metrics: controller.metrics().await,
        peak_kib: peak_kib.max(peak_memory_kib(controller.pid()).unwrap_or(0)),
        agent_writes: fleet.stats.status_writes.load(Ordering::SeqCst),
        max_activating: fleet.max_activating(),
        load: (load_start, load_average()),
    };
    run.report();
    if let Some(fanout) = &fanout {
        fanout.report(began, &fleet);
    }
    if let Some(server) = api.real() {
        for (name, pid) in server.processes()? {
            println!(
                "{name} peak memory (VmHWM): {:.1} MiB",
                peak_memory_kib(pid).unwrap_or(0) as f64 / 1024.0
            );
        }
    }
    Ok(())
}

impl Run<'_> {
    fn report(&self) {
        let Settings {
            nodes,
            update,
            download,
            ..
        } = *self.settings;
        let slots =
            inplace_proto::rollout_slots::activation_slots(&self.settings.max_unavailable, nodes);
        let waves = nodes.div_ceil(slots);
        let ideal = update * waves as u32 + download;
        let wall = self.wall.as_secs_f64();
        println!("\n== results ({nodes} nodes, {slots} slots, T = {update:?}) ==");
        println!(
            "wall time to Complete: {wall:.1}s; ideal ceil(N/slots) x T = {waves} x {update:?} = {:.1}s \
             (+ staging {download:?}): ratio {:.2}",
            (ideal - download).as_secs_f64(),
            wall / ideal.as_secs_f64()
        );
        let writes: BTreeMap<String, f64> =
            samples(&self.metrics, "inplace_controller_api_writes_total")
                .into_iter()
                .collect();
        let plan_and_status_writes =
            writes.get("{kind=\"plan_apply\"}").copied().unwrap_or(0.0) + self.agent_writes as f64;
        let api_bound = plan_and_status_writes / self.writes_per_second;
        println!(
            "API-bound lower limit: {plan_and_status_writes} plan and agent status writes / \
             {:.0} writes/s = {api_bound:.1}s; ideal {:.1}s; wall / max(ideal, API-bound) = {:.2}",
            self.writes_per_second,
            ideal.as_secs_f64(),
            wall / api_bound.max(ideal.as_secs_f64())
        );
        self.report_cpu(api_bound.max(ideal.as_secs_f64()));
        self.report_requests(&writes, slots);
        println!(
            "controller peak memory (VmHWM): {:.1} MiB",
            self.peak_kib as f64 / 1024.0
        );
        self.report_latency();
    }

    /// The controller's CPU and the test bed's, and the bed's own lower limit on the wall
    /// time (its CPU over the machine's cores) beside `bound`, the larger of the others.
    fn report_cpu(&self, bound: f64) {
        let nodes = self.settings.nodes;
        let bed_total: f64 = self.bed_rollout.iter().map(|(_, s)| s).sum();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let bed_bound = bed_total / cores as f64;
        println!(
            "test bed CPU: {bed_total:.1}s over the rollout ({}) on {cores} cores: the bed alone \
             needs {bed_bound:.1}s; wall / max(ideal, API-bound, test bed) = {:.2}; the controller's \
             share of the rollout's CPU {:.0} %",
            self.bed_rollout
                .iter()
                .map(|(name, s)| format!("{name} {s:.1}s"))
                .collect::<Vec<_>>()
                .join(", "),
            self.wall.as_secs_f64() / bound.max(bed_bound),
            self.cpu_rollout / (self.cpu_rollout + bed_total) * 100.0
        );
        println!(
            "controller CPU: {:.2}s over the rollout = {:.3}s per 1,000 nodes ({:.2}s since start, the initial lists included)",
            self.cpu_rollout,
            self.cpu_rollout / nodes as f64 * 1000.0,
            self.cpu_total
        );
    }

    /// The controller's requests and writes, and the agents' status writes, per node.
    fn report_requests(&self, writes: &BTreeMap<String, f64>, slots: usize) {
        let nodes = self.settings.nodes as f64;
        let total_requests: f64 = self.requests.values().sum();
        println!(
            "controller API requests over the rollout: {total_requests} = {:.2} per node; per node by verb: {}",
            total_requests / nodes,
            self.requests
                .iter()
                .map(|(verb, v)| format!("{verb} {:.3}", v / nodes))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "load average at start / end: {} / {}",
            self.load.0, self.load.1
        );
        println!(
            "most agents activating at once: {} (slots {slots})",
            self.max_activating
        );
        let controller_writes: f64 = writes.values().sum();
        println!(
            "controller API writes: {controller_writes} = {:.2} per node; by kind: {writes:?}",
            controller_writes / nodes
        );
        println!(
            "simulated agents' status writes: {} = {:.2} per node",
            self.agent_writes,
            self.agent_writes as f64 / nodes
        );
    }

    /// The rollout reconciles' latency, from the controller's histogram.
    fn report_latency(&self) {
        let metric = |name: &str| {
            samples(&self.metrics, name)
                .into_iter()
                .find(|(l, _)| l.contains("rollout"))
                .map_or(0.0, |(_, v)| v)
        };
        let sum = metric("inplace_controller_reconcile_duration_seconds_sum");
        let count = metric("inplace_controller_reconcile_duration_seconds_count");
        let buckets: Vec<(f64, f64)> = samples(
            &self.metrics,
            "inplace_controller_reconcile_duration_seconds_bucket",
        )
        .iter()
        .filter(|(l, _)| l.contains("controller=\"rollout\""))
        .filter_map(|(l, v)| {
            let le = l.split("le=\"").nth(1)?.trim_end_matches("\"}");
            Some((le.parse().unwrap_or(f64::INFINITY), *v))
        })
        .collect();
        let quantile = |q: f64| {
            buckets
                .iter()
                .find(|(_, c)| *c >= (count * q).ceil())
                .map_or(f64::INFINITY, |(le, _)| *le)
        };
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
    }
}
