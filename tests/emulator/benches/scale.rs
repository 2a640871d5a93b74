//! Scale benchmark (not a test): N Nodes + N NodeUpdatePlans and N concurrent single-object
//! watches (`fieldSelector=metadata.name=<node>`, the agent's pattern), then every plan updated
//! once. Reports memory and events/s.
//!
//! Run: `cargo bench -p inplace-api-emulator --bench scale` (N defaults to 30000; set
//! `INPLACE_SCALE_N` to change it). Watches are HTTP/2 streams, up to 900 per connection, because
//! the machine's hard limit on open files (20000) cannot hold 30000 TCP connections on both ends
//! in one process; the server-side cost per watch (task, channel, index entry) is the same.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark binary: failing loudly is the point

use futures::StreamExt;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use inplace_api_emulator::{Emulator, EmulatorConfig};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

fn raise_fd_limit(want: u64) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let target = want.max(hard);
    if setrlimit(Resource::RLIMIT_NOFILE, target, target).is_err() {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    println!("RLIMIT_NOFILE = {soft}");
}

type Sender = hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>;

/// One HTTP/2 connection (h2c) from a given loopback source address.
async fn connect(server: SocketAddr, source: Ipv4Addr) -> Sender {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from((source, 0))).unwrap();
    let stream = sock.connect(server).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

async fn open_watch(
    mut sender: Sender,
    path: String,
    events: Arc<AtomicU64>,
    ready: Arc<AtomicU64>,
) {
    let req = http::Request::get(format!("http://127.0.0.1{path}"))
        .header("Authorization", "Bearer admin-token")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    sender.ready().await.unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert!(resp.status().is_success());
    ready.fetch_add(1, Ordering::Relaxed);
    let mut body = resp.into_body();
    let mut partial = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Some(data) = frame.data_ref() {
            partial.extend_from_slice(data);
            while let Some(pos) = partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = partial.drain(..=pos).collect();
                if line.windows(10).any(|w| w == b"\"MODIFIED\"") {
                    events.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

async fn wait_for(counter: &AtomicU64, want: u64, what: &str) -> Duration {
    let start = Instant::now();
    let mut last = 0;
    let mut stalled = Instant::now();
    while counter.load(Ordering::Relaxed) < want {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = counter.load(Ordering::Relaxed);
        if now != last {
            last = now;
            stalled = Instant::now();
        } else if stalled.elapsed() > Duration::from_secs(120) {
            panic!("{what}: stalled at {now}/{want}");
        }
    }
    start.elapsed()
}

fn main() {
    let n: u64 = std::env::var("INPLACE_SCALE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000);
    raise_fd_limit(4 * n + 10_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(n));
}

async fn run(n: u64) {
    let base = rss_mib();
    let h = Emulator::start(EmulatorConfig {
        history_window: 10_000,
        ..Default::default()
    })
    .await
    .unwrap();
    let crds = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging/kubernetes/crds");
    h.apply_crd_dir(&crds).await.unwrap();
    let client = h.client().await.unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let plans: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("inplace.dev", "v1alpha1", "NodeUpdatePlan"),
            "nodeupdateplans",
        ),
    );

    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let nodes = nodes.clone();
            let plans = plans.clone();
            async move {
                let name = format!("node-{i:05}");
                let node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
                nodes.create(&PostParams::default(), &node).await.unwrap();
                let plan = json!({"apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan", "metadata": {"name": name},
                    "spec": {"nodeName": name, "revision": "r1", "desiredState": "Staged",
                             "artifacts": [{"name": "kubernetes", "type": "Sysext", "url": "https://x.example/k.raw", "sha256": "a".repeat(64)}]}});
                plans.create(&PostParams::default(), &serde_json::from_value(plan).unwrap()).await.unwrap();
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    let created = t.elapsed();
    let after_objects = rss_mib();
    println!(
        "created {n} Nodes + {n} NodeUpdatePlans through the API in {:.1}s ({:.0} creates/s); RSS {:.0} MiB (+{:.0})",
        created.as_secs_f64(),
        (2 * n) as f64 / created.as_secs_f64(),
        after_objects,
        after_objects - base
    );

    let rv = h.store().resource_version();
    let events = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    // Watches are multiplexed, up to 900 per HTTP/2 connection: this machine's hard limit on open
    // files (20000) cannot hold 30000 TCP connections on both ends in one process.
    let per_conn = 900u64;
    let mut senders = Vec::new();
    for c in 0..n.div_ceil(per_conn) {
        senders.push(connect(h.addr(), Ipv4Addr::new(127, 0, 0, 2 + (c % 8) as u8)).await);
    }
    for i in 0..n {
        let path = format!(
            "/apis/inplace.dev/v1alpha1/nodeupdateplans?watch=true&allowWatchBookmarks=true&timeoutSeconds=3600&resourceVersion={rv}&fieldSelector=metadata.name%3Dnode-{i:05}"
        );
        let sender = senders[(i / per_conn) as usize].clone();
        tokio::spawn(open_watch(sender, path, events.clone(), ready.clone()));
        if i % 500 == 499 {
            tokio::task::yield_now().await;
        }
    }
    wait_for(&ready, n, "opening watches").await;
    let opened = t.elapsed();
    let after_watches = rss_mib();
    println!(
        "opened {n} single-object watches in {:.1}s; server has {} watchers; RSS {:.0} MiB (+{:.0} for watches, both ends, {:.1} KiB per watch)",
        opened.as_secs_f64(),
        h.store().watcher_count("inplace.dev", "nodeupdateplans"),
        after_watches,
        after_watches - after_objects,
        (after_watches - after_objects) * 1024.0 / n as f64
    );

    // Phase 1: every plan's status patched through the API; each watch must see its one event.
    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let plans = plans.clone();
            async move {
                let patch = Patch::Merge(json!({"status": {"phase": "Downloading"}}));
                plans
                    .patch_status(&format!("node-{i:05}"), &PatchParams::default(), &patch)
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    wait_for(&events, n, "API writes").await;
    let api_phase = t.elapsed();
    println!(
        "phase 1: {n} status patches through the API, each delivered to its watch: {:.1}s = {:.0} events/s end to end",
        api_phase.as_secs_f64(),
        n as f64 / api_phase.as_secs_f64()
    );

    // Phase 2: storage-level writes (no HTTP request cost): the fan-out alone.
    let t = Instant::now();
    {
        let key = ("inplace.dev".to_string(), "nodeupdateplans".to_string());
        for i in 0..n {
            let name = format!("node-{i:05}");
            let mut inner = h.store().lock();
            let mut obj = inner
                .tables
                .get(&key)
                .and_then(|t| t.objects.get(&(String::new(), name.clone())))
                .map(|o| (**o).clone())
                .unwrap();
            obj["status"]["phase"] = json!("Staged");
            inner.put(&key, (String::new(), name), obj);
        }
    }
    wait_for(&events, 2 * n, "store writes").await;
    let fanout = t.elapsed();
    println!(
        "phase 2: {n} storage writes fanned out to {n} watches: {:.2}s = {:.0} events/s",
        fanout.as_secs_f64(),
        n as f64 / fanout.as_secs_f64()
    );
    println!("final RSS {:.0} MiB", rss_mib());
    std::process::exit(0);
}
