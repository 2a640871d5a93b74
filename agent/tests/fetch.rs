//! The real fetcher against a tiny scripted HTTP/1.1 server on 127.0.0.1.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inplace_agent::fetch::{FetchError, Fetcher, HttpFetcher};
use inplace_agent::settings::{DownloadSettings, Policy};
use inplace_proto::{Artifact, ArtifactType};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the server does after the head and body.
#[derive(Clone)]
enum After {
    Close,
    Stall,
    Endless,
    /// One byte every 100 ms: never a stall, far under any sensible speed.
    Trickle,
    /// 4 KiB every 50 ms (80 KiB/s): steady and well over `min_speed`, but slow.
    Steady,
}

#[derive(Clone)]
struct Reply {
    status: &'static str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    after: After,
}

fn reply(status: &'static str, body: &[u8]) -> Reply {
    Reply {
        status,
        headers: vec![("Content-Length".into(), body.len().to_string())],
        body: body.to_vec(),
        after: After::Close,
    }
}

impl Reply {
    fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.into(), value.into()));
        self
    }
    fn without_length(mut self) -> Self {
        self.headers.retain(|(n, _)| n != "Content-Length");
        self
    }
    fn then(mut self, after: After) -> Self {
        self.after = after;
        self
    }
}

type Handler = dyn Fn(usize, &str) -> Reply + Send + Sync;

/// Serves `handler(request_number, request_head)`; returns the base URL and the heads seen.
async fn serve(handler: Arc<Handler>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            let log = log.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let n = {
                    let mut log = log.lock().unwrap();
                    log.push(head.clone());
                    log.len()
                };
                let r = handler(n, &head);
                let mut out = format!("HTTP/1.1 {}\r\nConnection: close\r\n", r.status);
                for (k, v) in &r.headers {
                    out.push_str(&format!("{k}: {v}\r\n"));
                }
                out.push_str("\r\n");
                let _ = socket.write_all(out.as_bytes()).await;
                let _ = socket.write_all(&r.body).await;
                let _ = socket.flush().await;
                match r.after {
                    After::Close => {}
                    After::Stall => tokio::time::sleep(Duration::from_secs(30)).await,
                    After::Trickle => {
                        while socket.write_all(b"x").await.is_ok() {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                    After::Steady => {
                        let chunk = vec![b'x'; 4096];
                        while socket.write_all(&chunk).await.is_ok() {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    After::Endless => {
                        let chunk = vec![b'x'; 64 * 1024];
                        while socket.write_all(&chunk).await.is_ok() {}
                    }
                }
            });
        }
    });
    (base, seen)
}

fn fetcher(base: &str, attempts: u32) -> HttpFetcher {
    fetcher_with_limit(base, attempts, 1 << 20)
}

fn fetcher_with_limit(base: &str, attempts: u32, max_artifact_size: u64) -> HttpFetcher {
    fetcher_with(base, attempts, max_artifact_size, 0)
}

fn fetcher_with(base: &str, attempts: u32, max_artifact_size: u64, min_speed: u64) -> HttpFetcher {
    fetcher_from(
        base,
        &quick_settings(attempts, min_speed),
        max_artifact_size,
    )
}

fn quick_settings(attempts: u32, min_speed: u64) -> DownloadSettings {
    DownloadSettings {
        attempts,
        connect_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_millis(500),
        min_speed,
        artifact_deadline: Duration::from_secs(60),
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(20),
    }
}

fn fetcher_from(base: &str, settings: &DownloadSettings, max_artifact_size: u64) -> HttpFetcher {
    HttpFetcher::new(settings, &fetcher_policy(base, max_artifact_size)).unwrap()
}

/// Artifacts under `{base}/ok/`, plain http allowed.
fn fetcher_policy(base: &str, max_artifact_size: u64) -> Policy {
    Policy {
        allowed_url_prefixes: vec![format!("{base}/ok/").parse().unwrap()],
        allow_http: true,
        allowed_target_dirs: vec![],
        allowed_config_roots: vec![],
        allowed_units: vec![],
        max_artifact_size,
        reserved_disk_space: 0,
        allow_remote_health_checks: false,
        require_signatures: false,
        trusted_keys_dir: "/etc/inplace/keys".into(),
    }
}

fn artifact(base: &str, body: &[u8], size: Option<u64>) -> Artifact {
    Artifact {
        size,
        ..Artifact::new(
            "kubernetes",
            ArtifactType::Sysext,
            format!("{base}/ok/kubernetes.raw"),
            hex::encode(Sha256::digest(body)),
        )
    }
}

async fn run(f: &HttpFetcher, a: &Artifact, dir: &Path) -> Result<Vec<u8>, FetchError> {
    let result = f.fetch(a, dir, &|_| {}).await.map(|f| f.path);
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    match result {
        Ok(path) => {
            assert_eq!(leftovers, vec![path.clone()], "only the result is left");
            Ok(std::fs::read(path).unwrap())
        }
        Err(e) => {
            assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
            Err(e)
        }
    }
}

const BODY: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

#[tokio::test]
async fn plain_download() {
    let (base, _) = serve(Arc::new(|_, _| reply("200 OK", BODY))).await;
    let dir = tempfile::tempdir().unwrap();
    let got = run(
        &fetcher(&base, 1),
        &artifact(&base, BODY, Some(BODY.len() as u64)),
        dir.path(),
    )
    .await;
    assert_eq!(got.unwrap(), BODY);
}

#[tokio::test]
async fn hash_mismatch_is_retried_then_reported() {
    let (base, seen) = serve(Arc::new(|_, _| reply("200 OK", b"something else entirely"))).await;
    let dir = tempfile::tempdir().unwrap();
    let err = run(&fetcher(&base, 2), &artifact(&base, BODY, None), dir.path())
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::HashMismatch { .. }), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// A server that serves the same wrong content is asked twice, not `attempts` times (five
/// downloads of a wrong multi-GiB image, on every node, before the plan failed).
#[tokio::test]
async fn the_same_wrong_digest_twice_ends_the_retries() {
    let (base, seen) = serve(Arc::new(|_, _| reply("200 OK", b"something else entirely"))).await;
    let dir = tempfile::tempdir().unwrap();
    let err = run(&fetcher(&base, 5), &artifact(&base, BODY, None), dir.path())
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::HashMismatch { .. }), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no temporary file is left"
    );
}

#[tokio::test]
async fn content_length_differs_from_declared_size() {
    let (base, seen) = serve(Arc::new(|_, _| reply("200 OK", BODY))).await;
    let dir = tempfile::tempdir().unwrap();
    let err = run(
        &fetcher(&base, 3),
        &artifact(&base, BODY, Some(10)),
        dir.path(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, FetchError::SizeMismatch { .. }), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 1, "permanent: no retry");
}

#[tokio::test]
async fn more_bytes_than_declared_without_length_aborts() {
    let (base, _) = serve(Arc::new(|_, _| reply("200 OK", BODY).without_length())).await;
    let dir = tempfile::tempdir().unwrap();
    let err = run(
        &fetcher(&base, 1),
        &artifact(&base, BODY, Some(10)),
        dir.path(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, FetchError::SizeMismatch { .. }), "{err}");
}

#[tokio::test]
async fn endless_body_stops_at_the_limit() {
    let (base, _) = serve(Arc::new(|_, _| {
        reply("200 OK", b"").without_length().then(After::Endless)
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    // No declared size: the node's limit (1 MiB here) applies.
    let err = run(&fetcher(&base, 1), &artifact(&base, BODY, None), dir.path())
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::SizeMismatch { .. }), "{err}");
}

#[tokio::test]
async fn truncated_transfer_resumes_with_range_when_the_etag_matches() {
    let (base, seen) = serve(Arc::new(|n, head: &str| match n {
        1 => reply("200 OK", &BODY[..10])
            .header("Content-Length", &BODY.len().to_string())
            .header("ETag", "\"v1\""),
        _ => {
            assert!(head.contains("range: bytes=10-"), "{head}");
            assert!(head.contains("if-range: \"v1\""), "{head}");
            reply("206 Partial Content", &BODY[10..])
                .header("ETag", "\"v1\"")
                .header(
                    "Content-Range",
                    &format!("bytes 10-{}/{}", BODY.len() - 1, BODY.len()),
                )
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let got = run(
        &fetcher(&base, 3),
        &artifact(&base, BODY, Some(BODY.len() as u64)),
        dir.path(),
    )
    .await;
    assert_eq!(got.unwrap(), BODY);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// The writer hands the file whole blocks; a cut in the middle of a block must still leave
/// exactly the received bytes on disk, so the resume offset and the hash stay right.
#[tokio::test]
async fn large_body_resumes_at_an_odd_offset_past_several_blocks() {
    let body: Arc<Vec<u8>> = Arc::new(
        (0..5 * (1u32 << 20) + 77)
            .map(|i| (i % 251) as u8)
            .collect(),
    );
    let cut = 3 * (1usize << 20) + 12_345;
    let served = body.clone();
    let (base, seen) = serve(Arc::new(move |n, head: &str| match n {
        1 => reply("200 OK", &served[..cut])
            .header("Content-Length", &served.len().to_string())
            .header("ETag", "\"big\""),
        _ => {
            assert!(head.contains(&format!("range: bytes={cut}-")), "{head}");
            reply("206 Partial Content", &served[cut..])
                .header("ETag", "\"big\"")
                .header(
                    "Content-Range",
                    &format!("bytes {cut}-{}/{}", served.len() - 1, served.len()),
                )
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let got = run(
        &fetcher_with_limit(&base, 3, 64 << 20),
        &artifact(&base, &body, Some(body.len() as u64)),
        dir.path(),
    )
    .await;
    assert!(
        got.unwrap() == *body,
        "the resumed file differs from the served body"
    );
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn changed_object_restarts_from_zero() {
    // First object A is cut short; by the retry the server has B (different ETag) and,
    // honouring If-Range, sends all of B with 200. The result is B, never A+B.
    let (base, _) = serve(Arc::new(|n, _: &str| match n {
        1 => reply("200 OK", b"AAAAAAAAAA")
            .header("Content-Length", &BODY.len().to_string())
            .header("ETag", "\"a\""),
        _ => reply("200 OK", BODY).header("ETag", "\"b\""),
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let got = run(
        &fetcher(&base, 3),
        &artifact(&base, BODY, Some(BODY.len() as u64)),
        dir.path(),
    )
    .await;
    assert_eq!(got.unwrap(), BODY);
}

#[tokio::test]
async fn partial_answer_for_another_object_restarts() {
    // A 206 with a different ETag must not be stitched onto the first bytes.
    let (base, seen) = serve(Arc::new(|n, _: &str| match n {
        1 => reply("200 OK", b"AAAAAAAAAA")
            .header("Content-Length", &BODY.len().to_string())
            .header("ETag", "\"a\""),
        2 => reply("206 Partial Content", &BODY[10..])
            .header("ETag", "\"b\"")
            .header(
                "Content-Range",
                &format!("bytes 10-{}/{}", BODY.len() - 1, BODY.len()),
            ),
        _ => reply("200 OK", BODY).header("ETag", "\"b\""),
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let got = run(
        &fetcher(&base, 4),
        &artifact(&base, BODY, Some(BODY.len() as u64)),
        dir.path(),
    )
    .await;
    assert_eq!(got.unwrap(), BODY);
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn range_ignored_restarts_from_zero() {
    let (base, seen) = serve(Arc::new(|n, _: &str| match n {
        1 => reply("200 OK", &BODY[..10])
            .header("Content-Length", &BODY.len().to_string())
            .header("ETag", "\"v1\""),
        _ => reply("200 OK", BODY).header("ETag", "\"v1\""),
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let got = run(
        &fetcher(&base, 3),
        &artifact(&base, BODY, Some(BODY.len() as u64)),
        dir.path(),
    )
    .await;
    assert_eq!(got.unwrap(), BODY);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn unavailable_with_retry_after_then_success() {
    let (base, seen) = serve(Arc::new(|n, _: &str| match n {
        1 => reply("503 Service Unavailable", b"busy").header("Retry-After", "0"),
        2 => reply("429 Too Many Requests", b"slow down"),
        _ => reply("200 OK", BODY),
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let got = run(&fetcher(&base, 3), &artifact(&base, BODY, None), dir.path()).await;
    assert_eq!(got.unwrap(), BODY);
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn server_errors_exhaust_the_attempts() {
    let (base, seen) = serve(Arc::new(|_, _: &str| reply("502 Bad Gateway", b""))).await;
    let dir = tempfile::tempdir().unwrap();
    let err = run(&fetcher(&base, 3), &artifact(&base, BODY, None), dir.path())
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Http { status: 502, .. }), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn not_found_is_permanent_and_names_the_status() {
    let (base, seen) = serve(Arc::new(|_, _: &str| reply("404 Not Found", b"no"))).await;
    let dir = tempfile::tempdir().unwrap();
    let err = run(&fetcher(&base, 5), &artifact(&base, BODY, None), dir.path())
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Http { status: 404, .. }), "{err}");
    assert!(err.to_string().contains("404") && err.to_string().contains("kubernetes"));
    assert_eq!(seen.lock().unwrap().len(), 1);
    for status in ["401 Unauthorized", "403 Forbidden"] {
        let (base, seen) = serve(Arc::new(move |_, _: &str| reply(status, b""))).await;
        let err = run(&fetcher(&base, 5), &artifact(&base, BODY, None), dir.path())
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::Http { .. }), "{err}");
        assert_eq!(seen.lock().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn redirect_outside_the_allowed_prefixes_is_refused() {
    let (base, seen) = serve(Arc::new(|_, _: &str| {
        reply("302 Found", b"").header("Location", "/elsewhere/kubernetes.raw")
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let err = run(&fetcher(&base, 3), &artifact(&base, BODY, None), dir.path())
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::RedirectRefused { .. }), "{err}");
    assert_eq!(err.reason(), inplace_proto::Reason::PolicyDenied);
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the redirect target is never requested"
    );
}

#[tokio::test]
async fn redirect_inside_the_allowed_prefixes_is_followed() {
    let (base, _) = serve(Arc::new(|n, _: &str| match n {
        1 => reply("302 Found", b"").header("Location", "/ok/mirror/kubernetes.raw"),
        _ => reply("200 OK", BODY),
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        run(&fetcher(&base, 1), &artifact(&base, BODY, None), dir.path())
            .await
            .unwrap(),
        BODY
    );
}

#[tokio::test]
async fn stalled_transfer_times_out_and_is_retried() {
    let (base, seen) = serve(Arc::new(|n, _: &str| match n {
        1 => reply("200 OK", &BODY[..5])
            .header("Content-Length", &BODY.len().to_string())
            .then(After::Stall),
        _ => reply("200 OK", BODY),
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let got = run(&fetcher(&base, 2), &artifact(&base, BODY, None), dir.path()).await;
    assert_eq!(got.unwrap(), BODY);
    assert_eq!(seen.lock().unwrap().len(), 2);

    let (base, _) = serve(Arc::new(|_, _: &str| {
        reply("200 OK", &BODY[..5])
            .header("Content-Length", "36")
            .then(After::Stall)
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let err = run(&fetcher(&base, 1), &artifact(&base, BODY, None), dir.path())
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Transport { .. }), "{err}");
    assert_eq!(err.reason(), inplace_proto::Reason::DownloadFailed);
}

/// Mounts a tiny tmpfs (needs root, like the real-host tests) and unmounts it on drop.
struct TinyFs(tempfile::TempDir);

impl TinyFs {
    fn new(bytes: u64) -> TinyFs {
        let dir = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={bytes}").as_str()),
        )
        .expect("mounting a tmpfs needs root (run the tests as root)");
        TinyFs(dir)
    }
}

impl Drop for TinyFs {
    fn drop(&mut self) {
        let _ = nix::mount::umount(self.0.path());
    }
}

#[tokio::test]
async fn disk_full_aborts_cleanly_and_removes_the_temp_file() {
    let big: Vec<u8> = (0..=255u8).cycle().take(512 * 1024).collect();
    let body = big.clone();
    let (base, seen) = serve(Arc::new(move |_, _: &str| reply("200 OK", &body))).await;
    let fs = TinyFs::new(64 * 1024);
    let err = run(
        &fetcher(&base, 3),
        &artifact(&base, &big, None),
        fs.0.path(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, FetchError::DiskFull { .. }), "{err}");
    assert_eq!(err.reason(), inplace_proto::Reason::DiskFull);
    assert!(err.to_string().contains("no space left"), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 1, "a full disk is not retried");
}

#[tokio::test]
async fn sizes_over_4_gib_are_64_bit_and_resumed_at_64_bit_offsets() {
    // The server announces 5 GB, sends a little, and breaks; then the test checks that
    // the resume asks for a Range past nothing and that the size survives unmangled.
    const HUGE: u64 = 5_000_000_000;
    let (base, seen) = serve(Arc::new(|_, _: &str| {
        reply("200 OK", b"0123456789")
            .header("Content-Length", &HUGE.to_string())
            .header("ETag", "\"big\"")
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut a = artifact(&base, BODY, Some(HUGE));
    a.sha256 = "0".repeat(64);
    let err = run(&fetcher_with_limit(&base, 2, 8 << 30), &a, dir.path())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::Transport { .. } | FetchError::SizeMismatch { .. }
        ),
        "{err}"
    );
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 2);
    assert!(heads[1].contains("range: bytes=10-"), "{}", heads[1]);
    // And a declared size over 4 GiB that the server contradicts is caught before the body.
    let (base, _) = serve(Arc::new(|_, _: &str| reply("200 OK", BODY))).await;
    let err = run(
        &fetcher_with_limit(&base, 1, 8 << 30),
        &artifact(&base, BODY, Some(HUGE)),
        dir.path(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("5000000000"), "{err}");
}

#[tokio::test]
async fn small_files_are_retried_capped_and_follow_the_redirect_policy() {
    let url = |base: &str, path: &str| format!("{base}/ok/{path}");
    let (base, seen) = serve(Arc::new(|n, _: &str| match n {
        1 => reply("503 Service Unavailable", b"busy").header("Retry-After", "0"),
        _ => reply("200 OK", b"signature"),
    }))
    .await;
    let got = fetcher(&base, 3)
        .fetch_small("k (signature)", &url(&base, "k.minisig"), 64)
        .await;
    assert_eq!(got.unwrap(), b"signature");
    assert_eq!(seen.lock().unwrap().len(), 2);

    // Over the limit: refused whether the server announces the length or not.
    for reply in [
        reply("200 OK", &[b'x'; 65]),
        reply("200 OK", &[b'x'; 65]).without_length(),
    ] {
        let (base, _) = serve(Arc::new(move |_, _: &str| reply.clone())).await;
        let err = fetcher(&base, 3)
            .fetch_small("k (signature)", &url(&base, "k.minisig"), 64)
            .await
            .unwrap_err();
        assert!(matches!(err, FetchError::SizeMismatch { .. }), "{err}");
        assert!(err.to_string().contains("k (signature)"), "{err}");
    }

    // 404 is permanent and named.
    let (base, seen) = serve(Arc::new(|_, _: &str| reply("404 Not Found", b"no"))).await;
    let err = fetcher(&base, 5)
        .fetch_small("k (signature)", &url(&base, "k.minisig"), 64)
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Http { status: 404, .. }), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 1);

    // A redirect outside the allowed prefixes is refused, never followed.
    let (base, seen) = serve(Arc::new(|_, _: &str| {
        reply("302 Found", b"").header("Location", "/elsewhere/k.minisig")
    }))
    .await;
    let err = fetcher(&base, 3)
        .fetch_small("k (signature)", &url(&base, "k.minisig"), 64)
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::RedirectRefused { .. }), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// A server that sends a byte now and then never stalls; under `min_speed` over a
/// `stall_timeout` window the transfer is aborted and retried (it kept staging alive
/// forever: only a whole window without a byte was caught).
#[tokio::test]
async fn a_trickling_transfer_is_too_slow_and_retried() {
    let (base, seen) = serve(Arc::new(|_, _| {
        let mut r = reply("200 OK", b"");
        r.headers = vec![("Content-Length".into(), "1000000".into())];
        r.then(After::Trickle)
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let err = run(
        &fetcher_with(&base, 2, 1 << 20, 1024),
        &artifact(&base, BODY, None),
        dir.path(),
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("too slow: under 1024 bytes/s"), "{text}");
    assert!(seen.lock().unwrap().len() >= 2, "retried");
}

/// A steady transfer well over `min_speed` passes every window, however long it takes;
/// `artifact_deadline` ends it, and the message names the artifact and the setting.
#[tokio::test]
async fn a_steady_but_slow_transfer_ends_at_the_artifact_deadline() {
    let (base, _) = serve(Arc::new(|_, _| {
        let mut r = reply("200 OK", b"");
        r.headers = vec![("Content-Length".into(), "200000".into())];
        r.then(After::Steady)
    }))
    .await;
    let mut settings = DownloadSettings {
        attempts: 3,
        connect_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_millis(300),
        min_speed: 1024,
        artifact_deadline: Duration::from_millis(1500),
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(20),
    };
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let err = run(
        &fetcher_from(&base, &settings, 1 << 20),
        &artifact(&base, BODY, None),
        dir.path(),
    )
    .await
    .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, FetchError::DeadlineExceeded { .. }), "{err}");
    assert_eq!(err.reason(), inplace_proto::Reason::DownloadFailed);
    let text = err.to_string();
    assert!(text.starts_with("artifact kubernetes: "), "{text}");
    assert!(
        text.contains("[download] artifact_deadline of 1.5s"),
        "{text}"
    );
    assert!(
        took < Duration::from_secs(3),
        "ended at the deadline: {took:?}"
    );

    // The same transfer with a deadline out of reach is not too slow: only the deadline
    // ended it (it ends here at the body's declared size, with the wrong digest).
    settings.artifact_deadline = Duration::from_secs(60);
    settings.attempts = 1;
    let err = run(
        &fetcher_from(&base, &settings, 1 << 20),
        &artifact(&base, BODY, None),
        dir.path(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, FetchError::HashMismatch { .. }), "{err}");
}

/// A fetcher whose stall timeout outlasts the tests below: only the test ends a transfer.
fn patient_fetcher(base: &str) -> HttpFetcher {
    let settings = DownloadSettings {
        attempts: 2,
        connect_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_secs(20),
        min_speed: 0,
        artifact_deadline: Duration::from_secs(60),
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(20),
    };
    fetcher_from(base, &settings, 64 << 20)
}

/// Runs a fetch of `a` until `at_least` bytes are in its partial file, then drops it
/// mid-transfer, as a killed agent would stop: nothing is cleaned up.
async fn fetch_until_killed(f: &HttpFetcher, a: &Artifact, dir: &Path, at_least: u64) {
    let partial = dir.join(&inplace_agent::fetch::partial_names(a)[0]);
    let fetch = f.fetch(a, dir, &|_| {});
    let grown = async {
        while std::fs::metadata(&partial).map_or(0, |m| m.len()) < at_least {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        result = fetch => panic!("the fetch ended before it was killed: {:?}", result.err()),
        () = grown => {}
    }
}

/// A body of `len` bytes that no shift of itself matches (so a wrong offset shows).
fn patterned(len: usize) -> Arc<Vec<u8>> {
    Arc::new((0..len as u32).map(|i| (i % 251) as u8).collect())
}

/// An agent killed mid-download leaves its partial file and the object's validator; the
/// next process re-hashes the bytes on disk and asks only for the rest, with `Range` and
/// `If-Range`, and the file ends complete and verified. (Before: every run started a new
/// randomly named file, and the staging swept the old one.)
#[tokio::test]
async fn a_download_resumes_across_a_restart_from_the_bytes_on_disk() {
    let body = patterned(3 << 20);
    let served = body.clone();
    let (base, seen) = serve(Arc::new(move |n, head: &str| {
        let range = head
            .lines()
            .find_map(|l| l.strip_prefix("range: bytes="))
            .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok());
        match (n, range) {
            (1, _) => reply("200 OK", &served[..(2 << 20) + 100])
                .header("Content-Length", &served.len().to_string())
                .header("ETag", "\"big\"")
                .then(After::Stall),
            (_, Some(start)) => {
                assert!(head.contains("if-range: \"big\""), "{head}");
                reply("206 Partial Content", &served[start..])
                    .header("ETag", "\"big\"")
                    .header(
                        "Content-Range",
                        &format!("bytes {start}-{}/{}", served.len() - 1, served.len()),
                    )
            }
            (_, None) => reply("200 OK", &served).header("ETag", "\"big\""),
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let a = artifact(&base, &body, Some(body.len() as u64));
    fetch_until_killed(&patient_fetcher(&base), &a, dir.path(), 2 << 20).await;
    // The writer thread of the dropped fetch may still be finishing its last block.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let on_disk = std::fs::metadata(dir.path().join(&inplace_agent::fetch::partial_names(&a)[0]))
        .unwrap()
        .len();
    assert!(on_disk >= 2 << 20, "{on_disk} bytes on disk");

    let got = run(&patient_fetcher(&base), &a, dir.path()).await;
    assert!(
        got.unwrap() == *body,
        "the resumed file differs from the body"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[1].contains(&format!("range: bytes={on_disk}-")),
        "resumed where the first process left off ({on_disk}): {}",
        seen[1]
    );
}

/// The object changed while no agent ran: the server answers the `If-Range` with the
/// whole new object (200), and the download starts again from zero. The bytes on disk of
/// the old object are never stitched to the new one.
#[tokio::test]
async fn a_resume_after_a_restart_starts_again_when_the_validator_changed() {
    let old = patterned(1 << 20);
    let new: Arc<Vec<u8>> = Arc::new(old.iter().map(|b| b ^ 0xff).collect());
    let served = new.clone();
    let (base, seen) = serve(Arc::new(move |_, head: &str| {
        // The server now has another object: an If-Range for the old one gets all of it.
        assert!(head.contains("if-range: \"old\""), "{head}");
        reply("200 OK", &served).header("ETag", "\"new\"")
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let a = artifact(&base, &new, Some(new.len() as u64));
    // What a process killed while downloading the old object left behind.
    let [data, validator] = inplace_agent::fetch::partial_names(&a);
    std::fs::write(dir.path().join(data), &old[..300_000]).unwrap();
    std::fs::write(dir.path().join(validator), "\"old\"").unwrap();

    let got = run(&patient_fetcher(&base), &a, dir.path()).await;
    assert!(got.unwrap() == *new, "the new object, from zero");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("range: bytes=300000-"), "{}", seen[0]);
}

/// A partial file without a validator (the server gave none) cannot be resumed safely:
/// the download starts from zero with no `Range`.
#[tokio::test]
async fn a_partial_without_a_validator_is_downloaded_again_whole() {
    let body = patterned(100_000);
    let served = body.clone();
    let (base, seen) = serve(Arc::new(move |_, _| reply("200 OK", &served))).await;
    let dir = tempfile::tempdir().unwrap();
    let a = artifact(&base, &body, Some(body.len() as u64));
    let [data, _] = inplace_agent::fetch::partial_names(&a);
    std::fs::write(dir.path().join(data), b"left by an earlier run").unwrap();
    let got = run(&patient_fetcher(&base), &a, dir.path()).await;
    assert!(got.unwrap() == *body);
    let seen = seen.lock().unwrap();
    assert!(!seen[0].contains("range:"), "{}", seen[0]);
}

/// `If-Range` needs a strong validator: with a weak ETag the fetcher resumes on
/// Last-Modified, and without one it would not resume at all.
#[tokio::test]
async fn a_weak_etag_is_not_used_for_if_range() {
    const DATE: &str = "Tue, 14 Nov 2023 22:13:20 GMT";
    let (base, seen) = serve(Arc::new(|n, head: &str| match n {
        1 => reply("200 OK", &BODY[..10])
            .header("Content-Length", &BODY.len().to_string())
            .header("ETag", "W/\"weak\"")
            .header("Last-Modified", DATE),
        _ => {
            assert!(head.contains(&format!("if-range: {DATE}")), "{head}");
            reply("206 Partial Content", &BODY[10..])
                .header("ETag", "W/\"weak\"")
                .header("Last-Modified", DATE)
                .header(
                    "Content-Range",
                    &format!("bytes 10-{}/{}", BODY.len() - 1, BODY.len()),
                )
        }
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let got = run(
        &fetcher(&base, 3),
        &artifact(&base, BODY, Some(BODY.len() as u64)),
        dir.path(),
    )
    .await;
    assert_eq!(got.unwrap(), BODY);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

/// A process killed after the last byte (while flushing) leaves the whole artifact on
/// disk: the next one verifies it without a request (a `Range` past the end would be
/// answered 416 and the whole image downloaded again). Wrong bytes of the right length
/// are downloaded again from zero.
#[tokio::test]
async fn a_complete_partial_left_by_a_killed_process_is_verified_without_a_request() {
    let (base, seen) = serve(Arc::new(|_, _| {
        reply("200 OK", BODY).header("ETag", "\"v\"")
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let a = artifact(&base, BODY, Some(BODY.len() as u64));
    let [data, validator] = inplace_agent::fetch::partial_names(&a);
    std::fs::write(dir.path().join(&data), BODY).unwrap();
    std::fs::write(dir.path().join(&validator), "\"v\"").unwrap();
    assert_eq!(run(&fetcher(&base, 3), &a, dir.path()).await.unwrap(), BODY);
    assert_eq!(seen.lock().unwrap().len(), 0, "no request");

    let wrong = vec![b'?'; BODY.len()];
    std::fs::write(dir.path().join(&data), &wrong).unwrap();
    std::fs::write(dir.path().join(&validator), "\"v\"").unwrap();
    assert_eq!(run(&fetcher(&base, 3), &a, dir.path()).await.unwrap(), BODY);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "downloaded again");
    assert!(!seen[0].contains("range:"), "{}", seen[0]);
}

/// A registry that asks for a token (401 + `Bearer` challenge) before it serves anything:
/// the fetcher gets one from the named token service and repeats the request with it.
#[tokio::test]
async fn a_registry_artifact_is_fetched_through_the_bearer_token_flow() {
    let manifest = format!(
        r#"{{"schemaVersion":2,"layers":[{{"digest":"sha256:{}","size":{}}}]}}"#,
        hex::encode(Sha256::digest(BODY)),
        BODY.len()
    );
    let manifest_digest = hex::encode(Sha256::digest(manifest.as_bytes()));
    let served = manifest.clone();
    let (base, seen) = serve(Arc::new(move |_, head: &str| {
        let host = head
            .lines()
            .find_map(|l| l.strip_prefix("host: ").or_else(|| l.strip_prefix("Host: ")))
            .unwrap_or_default()
            .to_owned();
        let path = head.split_whitespace().nth(1).unwrap_or_default();
        if path.starts_with("/token?") {
            return reply("200 OK", br#"{"token":"T1"}"#);
        }
        if !head.to_ascii_lowercase().contains("authorization: bearer t1") {
            let challenge = format!(
                r#"Bearer realm="http://{host}/token",service="reg",scope="repository:sysext/k:pull""#
            );
            return reply("401 Unauthorized", b"").header("WWW-Authenticate", &challenge);
        }
        if path.contains("/manifests/") {
            reply("200 OK", served.as_bytes())
        } else {
            reply("200 OK", BODY)
        }
    }))
    .await;
    let mut policy = fetcher_policy(&base, 1 << 20);
    policy.allowed_url_prefixes = vec![format!("{base}/").parse().unwrap()];
    let f = HttpFetcher::new(&quick_settings(2, 0), &policy).unwrap();
    let mut a = artifact(&base, BODY, None);
    a.url = format!(
        "oci://{}/sysext/k@sha256:{manifest_digest}",
        base.trim_start_matches("http://")
    );
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(run(&f, &a, dir.path()).await.unwrap(), BODY);
    let seen = seen.lock().unwrap();
    let token_request = seen.iter().find(|h| h.contains("/token?")).unwrap();
    assert!(
        token_request.contains("service=reg")
            && token_request.contains("scope=repository%3Asysext%2Fk%3Apull"),
        "{token_request}"
    );
    let blob = seen.iter().rfind(|h| h.contains("/blobs/sha256:")).unwrap();
    assert!(
        blob.to_ascii_lowercase()
            .contains("authorization: bearer t1"),
        "{blob}"
    );
}
