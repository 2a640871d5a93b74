//! The metrics endpoint: an agent runs updates against the fake edges, serves its metrics
//! on a socket in a temporary directory (and a loopback port), and is scraped the way an
//! operator would: with the `inplace-agent metrics` client and with plain HTTP.

use crate::common;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::Bed;
use inplace_agent::metrics::AgentMetrics;
use inplace_agent::metrics_server::{self, Endpoints, Limits, ServeError};
use inplace_agent::settings::MetricsSettings;
use tokio::process::Command;

fn settings(socket: PathBuf, listen: Option<&str>) -> MetricsSettings {
    MetricsSettings {
        enabled: true,
        socket,
        listen: listen.map(|l| l.parse().unwrap()),
    }
}

async fn scrape(socket: &Path) -> String {
    let socket = socket.to_path_buf();
    tokio::task::spawn_blocking(move || metrics_server::scrape(&socket, Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap()
}

/// The raw answer to `request` on a TCP connection.
async fn over_tcp(addr: std::net::SocketAddr, request: &'static str) -> String {
    tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    })
    .await
    .unwrap()
}

/// Runs `inplace-agent [--config CONFIG] ARGS`: success, stdout, stderr.
async fn cli(config: Option<&Path>, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_inplace-agent"));
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    let out = command.args(args).output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn has(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l == line),
        "missing line {line:?} in\n{text}"
    );
}

#[tokio::test]
async fn updates_rollbacks_and_refusals_are_scraped_from_the_socket_and_loopback() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let v1 = inplace_proto::revision_of(&bed.plan("OK v1", "kubectl v1", "Active").spec.content);
    // v2 fails its health check and is rolled back; the same plan again is only denied.
    let v2 = bed.plan("OK v2 unhealthy", "kubectl v2", "Active");
    agent.handle(Some(&v2)).await.unwrap();
    agent.handle(Some(&v2)).await.unwrap();
    // A refused plan, reported twice (a relist): counted once.
    let mut invalid = bed.plan("OK v3", "kubectl v3", "Active");
    invalid.spec.content.artifacts[0].sha256 = "XYZ".into();
    agent.handle(Some(&invalid)).await.unwrap();
    agent.handle(Some(&invalid)).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/inplace/metrics.sock");
    let endpoints = Endpoints::bind(&settings(socket.clone(), Some("127.0.0.1:0")))
        .await
        .unwrap();
    let tcp = endpoints.tcp_addr().unwrap();
    assert!(tcp.ip().is_loopback());
    let server = tokio::spawn(endpoints.serve(agent.metrics()));

    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o660);

    let text = scrape(&socket).await;
    has(&text, "inplace_agent_updates_total{result=\"succeeded\"} 1");
    has(
        &text,
        "inplace_agent_updates_total{result=\"rolled_back\"} 1",
    );
    has(&text, "inplace_agent_updates_total{result=\"failed\"} 0");
    has(
        &text,
        "inplace_agent_failures_total{reason=\"HealthCheckFailed\"} 1",
    );
    has(
        &text,
        "inplace_agent_failures_total{reason=\"InvalidPlan\"} 1",
    );
    assert!(!text.contains("reason=\"RevisionDenied\""), "{text}");
    has(
        &text,
        &format!(
            "inplace_agent_revision_info{{revision=\"{v1}\",kubernetes_version=\"v1.31.2\"}} 1"
        ),
    );
    has(&text, "inplace_agent_phase{phase=\"Failed\"} 1");
    has(&text, "inplace_agent_phase{phase=\"Succeeded\"} 0");
    // Two artifacts of v1 and two of v2, each counted as it arrived.
    let bytes = ["OK v1", "kubectl v1", "OK v2 unhealthy", "kubectl v2"]
        .iter()
        .map(|s| s.len())
        .sum::<usize>();
    has(
        &text,
        &format!("inplace_agent_downloaded_bytes_total {bytes}"),
    );
    for (step, count) in [
        ("download", 4),
        ("stage", 2),
        ("activate", 2),
        ("health", 2),
        ("rollback", 1),
    ] {
        has(
            &text,
            &format!("inplace_agent_step_duration_seconds_count{{step=\"{step}\"}} {count}"),
        );
        has(
            &text,
            &format!(
                "inplace_agent_step_duration_seconds_bucket{{step=\"{step}\",le=\"+Inf\"}} {count}"
            ),
        );
    }
    let transition: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("inplace_agent_last_transition_timestamp_seconds "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(transition > 1.7e9, "{transition}");

    // The loopback port answers the same text, and refuses everything but /metrics.
    let answer = over_tcp(tcp, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{answer}"
    );
    assert!(answer.ends_with(&text), "{answer}");
    let answer = over_tcp(tcp, "GET /debug HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 404 "), "{answer}");
    let answer = over_tcp(tcp, "DELETE /metrics HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
    let answer = over_tcp(tcp, "GET /metrics SPDY/3\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");

    // The operator's client, with the socket named and from the configuration.
    let (ok, out, err) = cli(None, &["metrics", "--socket", socket.to_str().unwrap()]).await;
    assert!(ok, "{err}");
    assert_eq!(out, scrape(&socket).await);
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "node_name = \"worker-1\"\n[metrics]\nsocket = \"{}\"\n",
            socket.display()
        ),
    )
    .unwrap();
    let (ok, out, err) = cli(Some(&config), &["metrics"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("inplace_agent_updates_total"), "{out}");

    // Stopping the server removes the socket; the client then says what to check.
    server.abort();
    let _ = server.await;
    assert!(!socket.exists());
    let (ok, _, err) = cli(Some(&config), &["metrics"]).await;
    assert!(!ok);
    assert!(
        err.contains(&socket.display().to_string()) && err.contains("is the agent running"),
        "{err}"
    );
}

/// Connects to the socket and writes `request` (nothing when empty), leaving the
/// connection open.
fn connect(socket: &Path, request: &[u8]) -> std::os::unix::net::UnixStream {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream.write_all(request).unwrap();
    stream
}

/// Everything the server sends until it closes the connection; fails after `patience`.
fn answer_within(mut stream: std::os::unix::net::UnixStream, patience: Duration) -> String {
    stream.set_read_timeout(Some(patience)).unwrap();
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        // A server that closes with part of the request unread resets the connection
        // after its answer.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => {
            other.unwrap();
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Serves fresh metrics on a socket in `dir` within `limits`.
async fn serve_within(dir: &Path, limits: Limits) -> (PathBuf, tokio::task::JoinHandle<()>) {
    let socket = dir.join("metrics.sock");
    let endpoints = Endpoints::bind(&settings(socket.clone(), None))
        .await
        .unwrap();
    let server = tokio::spawn(endpoints.serve_within(Arc::new(AgentMetrics::default()), limits));
    (socket, server)
}

#[tokio::test]
async fn a_request_head_over_the_size_limit_is_refused_with_431() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits::default();
    let (socket, server) = serve_within(dir.path(), limits).await;
    let answer = tokio::task::spawn_blocking(move || {
        // Within the limit: answered.
        let mut fits = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
        fits.extend(std::iter::repeat_n(b'a', limits.max_request / 2));
        fits.extend_from_slice(b"\r\n\r\n");
        let fits = answer_within(connect(&socket, &fits), Duration::from_secs(30));
        // One header line longer than the whole limit, never finished.
        let mut huge = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', limits.max_request + 1));
        let unfinished = answer_within(connect(&socket, &huge), Duration::from_secs(30));
        // The same, finished.
        huge.extend_from_slice(b"\r\n\r\n");
        let finished = answer_within(connect(&socket, &huge), Duration::from_secs(30));
        (fits, unfinished, finished)
    })
    .await
    .unwrap();
    assert!(answer.0.starts_with("HTTP/1.1 200 OK\r\n"), "{}", answer.0);
    assert!(answer.1.starts_with("HTTP/1.1 431 "), "{}", answer.1);
    assert!(answer.2.starts_with("HTTP/1.1 431 "), "{}", answer.2);
    server.abort();
}

#[tokio::test]
async fn a_client_that_does_not_finish_its_head_in_time_is_cut_off_unanswered() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        header_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let (socket, server) = serve_within(dir.path(), limits).await;
    let (silent, partial) = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        let silent = answer_within(connect(&socket, b""), Duration::from_secs(30));
        let partial = answer_within(
            connect(&socket, b"GET /metrics HTTP/1.1\r\nHost: x\r\n"),
            Duration::from_secs(30),
        );
        assert!(started.elapsed() >= Duration::from_millis(600));
        (silent, partial)
    })
    .await
    .unwrap();
    // Closed by the server (read_to_end returned), with nothing sent.
    assert_eq!(silent, "");
    assert_eq!(partial, "");
    server.abort();
}

#[tokio::test]
async fn connections_over_the_cap_wait_until_one_ends() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_connections: 2,
        ..Limits::default()
    };
    let (socket, server) = serve_within(dir.path(), limits).await;
    let answer = tokio::task::spawn_blocking(move || {
        // Two clients hold both slots without sending anything.
        let first = connect(&socket, b"");
        let _second = connect(&socket, b"");
        std::thread::sleep(Duration::from_millis(200));
        let mut third = connect(&socket, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        third
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut byte = [0u8; 1];
        let waited = third.read(&mut byte);
        assert!(
            matches!(&waited, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "answered over the cap: {waited:?}"
        );
        // One slot frees: the waiting request is answered.
        drop(first);
        answer_within(third, Duration::from_secs(30))
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    server.abort();
}

#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_file_in_the_way_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("metrics.sock");
    // A socket left behind by a killed agent.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let endpoints = Endpoints::bind(&settings(socket.clone(), None))
        .await
        .unwrap();
    let server = tokio::spawn(endpoints.serve(Arc::new(AgentMetrics::default())));
    assert!(
        scrape(&socket)
            .await
            .contains("inplace_agent_updates_total{result=\"succeeded\"} 0")
    );
    server.abort();
    let _ = server.await;

    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let err = Endpoints::bind(&settings(file.clone(), None))
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::NotASocket { .. }), "{err}");
    assert!(err.to_string().contains("not-a-socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

#[tokio::test]
async fn disabled_metrics_and_routable_listen_addresses_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "node_name = \"worker-1\"\n[metrics]\nenabled = false\n",
    )
    .unwrap();
    let (ok, _, err) = cli(Some(&config), &["metrics"]).await;
    assert!(!ok);
    assert!(err.contains("metrics.enabled = false"), "{err}");

    std::fs::write(
        &config,
        "node_name = \"worker-1\"\n[metrics]\nlisten = \"0.0.0.0:9477\"\n",
    )
    .unwrap();
    let (ok, _, err) = cli(Some(&config), &["check-config"]).await;
    assert!(!ok);
    assert!(
        err.contains("metrics.listen") && err.contains("not a loopback address"),
        "{err}"
    );
}

#[tokio::test]
async fn status_lines_name_every_phase_with_download_progress() {
    let bed = Bed::new();
    let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let host = inplace_agent::update::Host {
        systemd: bed.systemd.clone(),
        fetcher: bed.fetcher.clone(),
        probes: bed.probes(),
        status: bed.status.clone(),
        notify: Arc::new(move |line: &str| sink.lock().unwrap().push(line.to_owned())),
        running: bed.running.clone(),
        power: bed.power.clone(),
    };
    let mut agent = inplace_agent::update::Agent::open(bed.settings.clone(), host)
        .await
        .unwrap();
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    // Both sizes declared: the line shows a percentage.
    plan.spec.content.artifacts[1].size = Some("kubectl v1".len() as u64);
    agent.handle(Some(&plan)).await.unwrap();
    let lines = lines.lock().unwrap().clone();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("Downloading 0% (0 B of 15 B): ")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("Downloading 100% (15 B of 15 B): ")),
        "{lines:#?}"
    );
    for phase in ["Activating: ", "Verifying: ", "Succeeded: "] {
        assert!(
            lines.iter().any(|l| l.starts_with(phase)),
            "{phase} in {lines:#?}"
        );
    }
}

#[test]
fn the_observability_guide_lists_every_agent_metric_with_its_type() {
    let guide = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/observability.md");
    // A family without series is left out of the text: give each one.
    let metrics = AgentMetrics::default();
    let at = std::time::Instant::now();
    metrics.reported(
        inplace_agent::metrics::Reported {
            revision: Some("aaaa"),
            phase: inplace_proto::Phase::Failed,
            reason: inplace_proto::Reason::PolicyDenied,
        },
        at,
        std::time::SystemTime::now(),
    );
    metrics.running(Some("aaaa"), None);
    metrics.download().succeeded();
    let text = metrics.render();
    assert_eq!(
        inplace_tests::metrics_guide::declared_families(&text).len(),
        7,
        "{text}"
    );
    assert_eq!(
        inplace_tests::metrics_guide::undocumented_families(
            &text,
            &std::fs::read_to_string(guide).unwrap()
        ),
        Vec::<String>::new()
    );
}
