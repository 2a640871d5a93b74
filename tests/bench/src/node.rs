//! (2, 3, 5) One nspawn node (systemd 252 as PID 1) with the real agent under its shipped
//! unit, talking to an in-process API emulator, and a Flatcar-like `kubernetes` sysext whose
//! kubelet stand-in (the test bed's fake kubelet) serves `/healthz` on a port of its own.
//!
//! - footprint: the agent's VmRSS, CPU ticks and context switches over an idle period after
//!   v1 is committed; the binary's size; VmHWM after the v1 → v2 update.
//! - swap: v1 → v2 through a plan; the host probes the kubelet's `/healthz` every 10 ms
//!   (the node shares the host's network) and the node's systemd reports the unit's
//!   ActiveExit → ActiveEnter timestamps; the floors (`systemctl restart systemd-sysext`,
//!   `systemctl restart kubelet`) and a reboot of the node until the kubelet is healthy.
//! - plan: status phases polled every 20 ms; Plan applied → Succeeded minus the download
//!   (Downloading → next phase) minus the health window.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use inplace_api_emulator::{Emulator, EmulatorConfig, Handle, User};
use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::fake_kubelet::FakeKubeletConfig;
use inplace_tests::install;
use inplace_tests::nspawn::{Node, NodeOptions};
use inplace_tests::sysext::{SysextImage, kubernetes_sysext};
use kube::api::{Patch, PatchParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::report::repo_root;
use crate::util::{cpu_ticks_text, median, status_field_text};
use crate::{Opts, Row};

const HEALTH_WINDOW_S: f64 = 2.0;

fn sibling(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(name), dir.parent()?.join(name)]
        .into_iter()
        .find(|p| p.is_file())
}

/// One GET /healthz on 127.0.0.1:port with a short timeout; true on 200.
async fn healthy(port: u16) -> bool {
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        std::io::Result::Ok(buf.starts_with(b"HTTP/1.1 200") || buf.starts_with(b"HTTP/1.0 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(200), probe).await,
        Ok(Ok(true))
    )
}

/// Probes every 10 ms until stopped; returns (time, ok) samples.
fn spawn_probe(
    port: u16,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<(Instant, bool)>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        while !*stop.borrow() {
            let at = Instant::now();
            samples.push((at, healthy(port).await));
            tokio::time::sleep_until((at + Duration::from_millis(10)).into()).await;
        }
        samples
    })
}

/// The longest stretch of failing probes: from the last ok before it to the first ok after.
fn longest_outage(samples: &[(Instant, bool)]) -> Option<Duration> {
    let mut best = None;
    let mut last_ok: Option<Instant> = None;
    let mut in_outage = false;
    for &(at, ok) in samples {
        if ok {
            if in_outage && let Some(start) = last_ok {
                let d = at - start;
                if best.is_none_or(|b| d > b) {
                    best = Some(d);
                }
            }
            in_outage = false;
            last_ok = Some(at);
        } else {
            in_outage = true;
        }
    }
    best
}

async fn image(dir: &Path, fake: &Path, version: &str, port: u16) -> Result<SysextImage> {
    let mut cfg = FakeKubeletConfig::healthy(version);
    cfg.port = port;
    let img = kubernetes_sysext(fake, &cfg)
        .await?
        .build(&dir.join(format!("kubernetes-{version}.raw")))
        .await?;
    Ok(img)
}

fn plan(node: &str, url: &str, img: &SysextImage, port: u16) -> Result<NodeUpdatePlan> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "inplace.dev/v1alpha1",
        "kind": "NodeUpdatePlan",
        "metadata": {"name": node},
        "spec": {
            "nodeName": node,
            "desiredState": "Active",
            "artifacts": [
                {"name": "kubernetes", "type": "Sysext", "url": url,
                 "sha256": img.sha256, "size": img.size},
            ],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {
                "units": ["kubelet.service"],
                "http": [{"url": format!("http://127.0.0.1:{port}/healthz")}],
                "window": format!("{HEALTH_WINDOW_S}s"),
                "timeout": "120s",
            },
        }
    }))?)
}

/// Phase timeline of one plan: when each phase was first seen (polled every 20 ms).
async fn follow(
    api: &kube::Api<NodeUpdatePlan>,
    name: &str,
    revision: &str,
    started: Instant,
) -> Result<Vec<(Phase, Duration)>> {
    let mut seen: Vec<(Phase, Duration)> = Vec::new();
    let deadline = started + Duration::from_secs(300);
    while Instant::now() < deadline {
        if let Ok(p) = api.get(name).await
            && let Some(s) = p.status
            && s.target_revision.as_deref() == Some(revision)
            && let Some(phase) = s.phase
        {
            if seen.last().is_none_or(|(last, _)| *last != phase) {
                seen.push((phase, started.elapsed()));
            }
            match phase {
                Phase::Succeeded => return Ok(seen),
                Phase::Failed | Phase::RolledBack => {
                    bail!("the plan ended {phase:?}: {:?}", s.conditions)
                }
                _ => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("no Succeeded within 300 s; phases seen: {seen:?}")
}

struct Agent {
    pid: String,
}

impl Agent {
    async fn find(node: &Node) -> Result<Self> {
        let pid = node
            .systemctl(&["show", "-p", "MainPID", "--value", "inplace-agent.service"])
            .await?
            .trim()
            .to_owned();
        if pid.is_empty() || pid == "0" {
            bail!("inplace-agent.service has no main process");
        }
        Ok(Agent { pid })
    }

    async fn status(&self, node: &Node) -> Result<String> {
        Ok(node
            .sh_ok(&format!("cat /proc/{}/status", self.pid))
            .await?)
    }

    async fn stat(&self, node: &Node) -> Result<String> {
        Ok(node.sh_ok(&format!("cat /proc/{}/stat", self.pid)).await?)
    }
}

fn mono_us(show: &str, key: &str) -> Option<u64> {
    show.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))?
        .trim()
        .parse()
        .ok()
}

async fn wait_healthy(port: u16, patience: Duration) -> Result<Duration> {
    let started = Instant::now();
    while started.elapsed() < patience {
        if healthy(port).await {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("kubelet not healthy on port {port} within {patience:?}")
}

/// The node rows.
pub async fn run(o: &Opts) -> Result<Vec<Row>> {
    inplace_tests::prereq::require_nspawn()?;
    inplace_tests::prereq::require_squashfs_tools()?;
    let agent_bin = o
        .agent_bin
        .clone()
        .or_else(|| sibling("inplace-agent"))
        .context("no inplace-agent binary next to inplace-bench; build it (cargo build --profile node -p inplace-agent) or pass --agent-bin")?;
    let fake = sibling("fake-kubelet")
        .context("no fake-kubelet binary next to inplace-bench; cargo build --profile node -p inplace-tests --bin fake-kubelet")?;
    let binary_size = std::fs::metadata(&agent_bin)?.len();

    let emulator = Emulator::start(EmulatorConfig::default()).await?;
    emulator
        .apply_crd_dir(&repo_root().join("packaging/kubernetes/crds"))
        .await?;
    let api: kube::Api<NodeUpdatePlan> = kube::Api::all(emulator.client().await?);
    let server = ArtifactServer::start().await?;
    let work = std::env::temp_dir().join(format!("inplace-bench-node-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    // A kubelet port of our own: nodes share the host's network with other test beds.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let v1 = image(&work, &fake, "v1.31.2", port).await?;
    let v2 = image(&work, &fake, "v1.31.3", port).await?;
    server.put_bytes("/v1/kubernetes.raw", v1.bytes().await?);
    server.put_bytes("/v2/kubernetes.raw", v2.bytes().await?);

    let name = Node::unique_name("bench");
    let mut node = Node::boot(&name, NodeOptions::default()).await?;
    let result = measure(
        o,
        &mut node,
        &emulator,
        &api,
        &server,
        &agent_bin,
        binary_size,
        &v1,
        &v2,
        port,
    )
    .await;
    let _ = node.poweroff().await;
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// How to read the agent's memory and context switches on a node, for the footprint rows.
const PROC_REPRODUCE: &str =
    "grep -E 'VmRSS|VmHWM|ctxt' /proc/$(systemctl show -p MainPID --value inplace-agent)/status";

#[allow(clippy::too_many_arguments)]
async fn measure(
    o: &Opts,
    node: &mut Node,
    emulator: &Handle,
    api: &kube::Api<NodeUpdatePlan>,
    server: &ArtifactServer,
    agent_bin: &Path,
    binary_size: u64,
    v1: &SysextImage,
    v2: &SysextImage,
    port: u16,
) -> Result<Vec<Row>> {
    let identity = emulator.kubeconfig_yaml(&User::node(node.name()));
    install::put_agent(node, agent_bin, &server.url("/"), &identity).await?;
    install::start_agent(node).await?;
    first_install(node, api, server, v1, port).await?;
    let agent = Agent::find(node).await?;
    let mut rows = footprint_rows(o, node, &agent, binary_size).await?;
    let phases = swap_rows(node, api, server, &agent, v2, port, &mut rows).await?;
    rows.push(plan_overhead_row(&phases, v2)?);
    rows.extend(floor_rows(o, node, port).await?);
    rows.extend(reboot_rows(node, port).await?);
    Ok(rows)
}

/// v1 installed by a plan, then enabled for boot.
async fn first_install(
    node: &Node,
    api: &kube::Api<NodeUpdatePlan>,
    server: &ArtifactServer,
    v1: &SysextImage,
    port: u16,
) -> Result<()> {
    let name = node.name().to_owned();
    let p1 = plan(&name, &server.url("/v1/kubernetes.raw"), v1, port)?;
    let r1 = inplace_proto::revision_of(&p1.spec.content);
    let t1 = Instant::now();
    api.create(&PostParams::default(), &p1).await?;
    follow(api, &name, &r1, t1).await?;
    wait_healthy(port, Duration::from_secs(30)).await?;
    // Enabled for boot the way an image ships them (the reboot below needs it), with the
    // reload-after-merge unit Flatcar images carry: without it systemd 252 never sees the
    // sysext's kubelet.service at boot.
    node.copy_from_host(
        repo_root().join("tests/bench/units/ensure-sysext.service"),
        "/etc/systemd/system/ensure-sysext.service",
        0o644,
    )
    .await?;
    node.sh_ok("mkdir -p /etc/systemd/system/multi-user.target.wants /etc/systemd/system/sysinit.target.wants \
        && ln -sf /usr/lib/systemd/system/kubelet.service /etc/systemd/system/multi-user.target.wants/kubelet.service \
        && ln -sf /etc/systemd/system/ensure-sysext.service /etc/systemd/system/sysinit.target.wants/ensure-sysext.service \
        && ln -sf /etc/systemd/system/inplace-agent.service /etc/systemd/system/multi-user.target.wants/inplace-agent.service \
        && systemctl daemon-reload")
        .await?;
    Ok(())
}

/// (2) The agent's idle footprint.
async fn footprint_rows(
    o: &Opts,
    node: &Node,
    agent: &Agent,
    binary_size: u64,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s0 = agent.status(node).await?;
    let c0 = cpu_ticks_text(&agent.stat(node).await?).context("stat")?;
    let idle_started = Instant::now();
    tokio::time::sleep(Duration::from_secs(o.idle_seconds)).await;
    let idle = idle_started.elapsed().as_secs_f64();
    let s1 = agent.status(node).await?;
    let c1 = cpu_ticks_text(&agent.stat(node).await?).context("stat")?;
    let rss_kib = status_field_text(&s1, "VmRSS").unwrap_or(0);
    // Where the resident pages are, per mapping, for whoever wants to shrink them.
    let smaps = node
        .sh_ok(&format!("cat /proc/{}/smaps", agent.pid))
        .await?;
    tokio::fs::create_dir_all(&o.dir).await?;
    tokio::fs::write(o.dir.join("agent-idle-smaps.txt"), smaps).await?;
    let vol = status_field_text(&s1, "voluntary_ctxt_switches").unwrap_or(0)
        - status_field_text(&s0, "voluntary_ctxt_switches").unwrap_or(0);
    let nonvol = status_field_text(&s1, "nonvoluntary_ctxt_switches").unwrap_or(0)
        - status_field_text(&s0, "nonvoluntary_ctxt_switches").unwrap_or(0);
    let ticks_per_s = 100.0; // USER_HZ on Linux
    let cpu_s = (c1 - c0) as f64 / ticks_per_s;
    rows.push(
        Row::reference(
            "2 footprint",
            "agent idle RSS (VmRSS, after v1 committed; of it anonymous / file-backed)",
            rss_split(&s1),
            "MiB",
            PROC_REPRODUCE,
        )
        .target("≤ 10 MiB", rss_kib <= 10 * 1024),
    );
    rows.push(Row::reference(
        "2 footprint",
        format!("agent CPU over {idle:.0} idle s (utime+stime)"),
        format!("{cpu_s:.2} ({:.3} %)", cpu_s / idle * 100.0),
        "CPU s",
        "awk '{print $14+$15}' /proc/$(systemctl show -p MainPID --value inplace-agent)/stat  # twice, 60 s apart",
    ));
    let per_s = (vol + nonvol) as f64 / idle;
    rows.push(
        Row::reference(
            "2 footprint",
            format!("agent context switches over {idle:.0} idle s (voluntary + involuntary)"),
            format!("{vol} + {nonvol} ({per_s:.2}/s)"),
            "switches",
            PROC_REPRODUCE,
        )
        .target(
            "no periodic wake-ups beyond the watch (≤ 1 switch/s)",
            per_s <= 1.0,
        ),
    );
    rows.push(Row::reference(
        "2 footprint",
        "agent binary size (as packaged: cargo profile `node`, opt-level s, fat LTO)",
        format!("{:.1}", binary_size as f64 / 1048576.0),
        "MiB",
        "cargo build --profile node -p inplace-agent && stat -c %s target/node/inplace-agent",
    ));
    Ok(rows)
}

/// (3) The in-place swap v1 → v2, probed from the host every 10 ms; returns the plan's
/// phase timeline.
async fn swap_rows(
    node: &Node,
    api: &kube::Api<NodeUpdatePlan>,
    server: &ArtifactServer,
    agent: &Agent,
    v2: &SysextImage,
    port: u16,
    rows: &mut Vec<Row>,
) -> Result<Vec<(Phase, Duration)>> {
    let name = node.name().to_owned();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let probe = spawn_probe(port, stop_rx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let p2 = plan(&name, &server.url("/v2/kubernetes.raw"), v2, port)?;
    let r2 = inplace_proto::revision_of(&p2.spec.content);
    let t2 = Instant::now();
    let patch = serde_json::json!({"spec": p2.spec});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let phases = follow(api, &name, &r2, t2).await;
    let _ = stop_tx.send(true);
    let samples = probe.await?;
    let phases = phases?;
    let show = node
        .systemctl(&[
            "show",
            "kubelet.service",
            "-p",
            "ActiveExitTimestampMonotonic",
            "-p",
            "ActiveEnterTimestampMonotonic",
        ])
        .await?;
    let systemd_gap = match (
        mono_us(&show, "ActiveExitTimestampMonotonic"),
        mono_us(&show, "ActiveEnterTimestampMonotonic"),
    ) {
        (Some(exit), Some(enter)) if enter >= exit => Some((enter - exit) as f64 / 1e6),
        _ => None,
    };
    let outage = longest_outage(&samples).map(|d| d.as_secs_f64());
    rows.push(
        Row::reference(
            "3 swap",
            "kubelet downtime per in-place sysext swap: last healthy → healthy again (/healthz probed every 10 ms)",
            outage.map_or("no outage seen".into(), |s| format!("{s:.3}")),
            "s",
            format!("while :; do curl -s -o /dev/null -w '%{{http_code}} ' http://127.0.0.1:{port}/healthz; sleep 0.01; done  # while the plan moves to v2"),
        )
        .target("≤ 1 s", outage.is_some_and(|s| s <= 1.0)),
    );
    if let Some(gap) = systemd_gap {
        rows.push(
            Row::reference(
                "3 swap",
                "kubelet.service stop → active (systemd ActiveExit → ActiveEnter timestamps)",
                format!("{gap:.3}"),
                "s",
                "systemctl show kubelet -p ActiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic",
            )
            .target("≤ 1 s", gap <= 1.0),
        );
    }
    if let Some(kib) = status_field_text(&agent.status(node).await?, "VmHWM") {
        rows.push(Row::reference(
            "2 footprint",
            "agent peak RSS (VmHWM) after two updates",
            format!("{:.1}", kib as f64 / 1024.0),
            "MiB",
            PROC_REPRODUCE,
        ));
    }
    Ok(phases)
}

/// (5) Plan → Succeeded overhead.
fn plan_overhead_row(phases: &[(Phase, Duration)], v2: &SysextImage) -> Result<Row> {
    let at = |p: Phase| phases.iter().find(|(x, _)| *x == p).map(|(_, d)| *d);
    let total = at(Phase::Succeeded).context("no Succeeded")?.as_secs_f64();
    let download = match at(Phase::Downloading) {
        Some(start) => {
            let end = phases
                .iter()
                .skip_while(|(x, _)| *x != Phase::Downloading)
                .nth(1)
                .map_or(start, |(_, d)| *d);
            (end - start).as_secs_f64()
        }
        None => 0.0,
    };
    let overhead = total - download - HEALTH_WINDOW_S;
    let timeline = phases
        .iter()
        .map(|(p, d)| format!("{p:?} {:.2}", d.as_secs_f64()))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Row::reference(
            "5 plan",
            format!(
                "Plan applied → Succeeded minus download ({download:.2} s, {:.1} MiB) minus health window ({HEALTH_WINDOW_S} s); phases seen at: {timeline}",
                v2.size as f64 / 1048576.0
            ),
            format!("{overhead:.2} (total {total:.2})"),
            "s",
            "kubectl get nodeupdateplan NODE -w -o custom-columns=PHASE:.status.phase  # timestamps from the watch",
        )
        .target("small next to the health window (< 1 s)", overhead < 1.0))
}

/// Floors: restart systemd-sysext alone; restart the kubelet alone.
async fn floor_rows(o: &Opts, node: &Node, port: u16) -> Result<Vec<Row>> {
    let mut sysext = Vec::new();
    let mut kubelet = Vec::new();
    for _ in 0..o.reps.max(3) {
        let out = node
            .sh_ok("t0=$(date +%s%N); systemctl restart systemd-sysext; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000 ))")
            .await?;
        sysext.push(out.trim().parse::<f64>().unwrap_or(f64::NAN) / 1e6);
        wait_healthy(port, Duration::from_secs(30)).await?;
        let started = Instant::now();
        node.systemctl(&["restart", "kubelet.service"]).await?;
        wait_healthy(port, Duration::from_secs(30)).await?;
        kubelet.push(started.elapsed().as_secs_f64());
    }
    Ok(vec![
        Row::reference(
            "3 swap",
            "floor: systemctl restart systemd-sysext (one squashfs image), median",
            format!("{:.3}", median(sysext)),
            "s",
            "hyperfine -r 5 'systemctl restart systemd-sysext'  # inside the node",
        ),
        Row::reference(
            "3 swap",
            "floor: systemctl restart kubelet → /healthz 200, median",
            format!("{:.3}", median(kubelet)),
            "s",
            "systemctl restart kubelet; until curl -sf http://127.0.0.1:PORT/healthz; do sleep 0.01; done",
        ),
    ])
}

/// The same node rebooted until its kubelet is healthy, and the agent's footprint after it.
async fn reboot_rows(node: &mut Node, port: u16) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    // Flatcar + kured: a reboot of the same node until the same kubelet is healthy. A failed
    // reboot costs this row only; the rows above are already measured.
    // The host's page cache is dropped first, as a machine's is by a reboot: the node boots
    // reading its files from disk, and the agent's idle footprint below is that of an agent
    // paged in from disk, as on every booted node, rather than of a binary just copied in
    // (whose page cache the first footprint row sees).
    wait_healthy(port, Duration::from_secs(30)).await?;
    let reboot = match drop_host_page_cache().await {
        Ok(()) => reboot_until_healthy(node, port).await,
        Err(e) => Err(e),
    };
    rows.push(Row::reference(
        "3 swap",
        "reboot of the same nspawn node until kubelet /healthz 200 (the Flatcar + kured path, container boot only: no firmware, kernel or drain; page cache dropped first)",
        reboot
            .as_ref()
            .map_or_else(|e| format!("failed: {e:#}"), |s| format!("{s:.2}")),
        "s",
        "sync; echo 3 >/proc/sys/vm/drop_caches; systemctl reboot  # in the node; then poll /healthz from the host",
    ));
    if reboot.is_ok() {
        rows.push(idle_rss_after_boot(node).await.unwrap_or_else(|e| {
            Row::reference(
                "2 footprint",
                "agent idle RSS after the reboot above",
                format!("failed: {e:#}"),
                "MiB",
                "",
            )
        }));
    }
    rows.push(Row::reference(
        "3 swap",
        "published node reboot times (not measured here): cloud VM 1–2 min, bare metal 15+ min",
        "60–120 / 900+",
        "s",
        "(published figures; see notes)",
    ));
    Ok(rows)
}

async fn drop_host_page_cache() -> Result<()> {
    let synced = tokio::process::Command::new("sync").status().await?;
    anyhow::ensure!(synced.success(), "sync failed");
    tokio::fs::write("/proc/sys/vm/drop_caches", "3")
        .await
        .context("dropping the page cache")
}

/// The footprint row again, for the agent the booted node started (binary read from disk).
async fn idle_rss_after_boot(node: &Node) -> Result<Row> {
    let agent = Agent::find(node).await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let status = agent.status(node).await?;
    let rss_kib = status_field_text(&status, "VmRSS").unwrap_or(0);
    Ok(Row::reference(
        "2 footprint",
        "agent idle RSS after the reboot above (binary paged in from disk, as on a booted node; of it anonymous / file-backed)",
        rss_split(&status),
        "MiB",
        "grep -E 'VmRSS|RssAnon|RssFile' /proc/$(systemctl show -p MainPID --value inplace-agent)/status  # 10 s after boot",
    )
    .target("≤ 10 MiB", rss_kib <= 10 * 1024))
}

/// "VmRSS (RssAnon / RssFile)" in MiB, from a /proc/PID/status text.
fn rss_split(status: &str) -> String {
    let mib = |field| status_field_text(status, field).unwrap_or(0) as f64 / 1024.0;
    format!(
        "{:.1} ({:.1} / {:.1})",
        mib("VmRSS"),
        mib("RssAnon"),
        mib("RssFile")
    )
}

/// Seconds from `systemctl reboot` until the kubelet answers `/healthz` again.
async fn reboot_until_healthy(node: &mut Node, port: u16) -> Result<f64> {
    let started = Instant::now();
    node.reboot_and_wait().await?;
    wait_healthy(port, Duration::from_secs(120)).await?;
    Ok(started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outage_is_last_ok_to_first_ok() {
        let t = Instant::now();
        let ms = |n| t + Duration::from_millis(n);
        let s = [
            (ms(0), true),
            (ms(10), true),
            (ms(20), false),
            (ms(30), false),
            (ms(40), true),
            (ms(50), false),
            (ms(60), true),
        ];
        assert_eq!(longest_outage(&s), Some(Duration::from_millis(30)));
        assert_eq!(longest_outage(&[(ms(0), true)]), None);
    }
}
