//! The artifact server's behaviours, observed with a raw TCP client so that truncation,
//! resets, stalls and lies about lengths are seen exactly as a downloader would see them.

use std::net::SocketAddr;
use std::time::Duration;

use inplace_tests::artifact_server::{Artifact, ArtifactServer, Fault};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug, PartialEq)]
enum End {
    /// Clean close (FIN) or Content-Length reached.
    Eof,
    /// Connection reset by peer.
    Reset,
    /// Nothing more within the read timeout (stall, endless body cut off by us).
    Timeout,
    /// We stopped reading at our cap.
    Capped,
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    end: End,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request with `Connection: close` and reads until close, reset, timeout or cap.
async fn fetch(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    idle: Duration,
    cap: usize,
) -> Response {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 65536];
    let end = loop {
        if raw.len() >= cap {
            break End::Capped;
        }
        match tokio::time::timeout(idle, stream.read(&mut buf)).await {
            Err(_) => break End::Timeout,
            Ok(Ok(0)) => break End::Eof,
            Ok(Ok(n)) => raw.extend_from_slice(&buf[..n]),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => break End::Reset,
            Ok(Err(e)) => panic!("read: {e}"),
        }
    };
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Response {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
        end,
    }
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    fetch(
        addr,
        "GET",
        path,
        headers,
        Duration::from_secs(30),
        usize::MAX,
    )
    .await
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

async fn server_with(path: &str, body: &[u8]) -> ArtifactServer {
    let server = ArtifactServer::start().await.expect("server starts");
    server.put(path, Artifact::bytes(body.to_vec()));
    server
}

#[tokio::test]
async fn serves_bytes_with_validators_ranges_and_head() {
    let body = payload(100_000);
    let s = server_with("/a.raw", &body).await;
    let full = get(s.addr(), "/a.raw", &[]).await;
    assert_eq!(full.status, 200);
    assert_eq!(full.body, body);
    assert_eq!(full.header("content-length"), Some("100000"));
    assert_eq!(full.header("accept-ranges"), Some("bytes"));
    let etag = full.header("etag").expect("etag").to_owned();
    let last_modified = full
        .header("last-modified")
        .expect("last-modified")
        .to_owned();
    assert!(last_modified.ends_with(" GMT"), "{last_modified}");

    let head = fetch(
        s.addr(),
        "HEAD",
        "/a.raw",
        &[],
        Duration::from_secs(30),
        usize::MAX,
    )
    .await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length"), Some("100000"));
    assert!(head.body.is_empty());

    let part = get(s.addr(), "/a.raw", &[("Range", "bytes=1000-1999")]).await;
    assert_eq!(part.status, 206);
    assert_eq!(part.header("content-range"), Some("bytes 1000-1999/100000"));
    assert_eq!(part.body, &body[1000..2000]);
    let open = get(s.addr(), "/a.raw", &[("Range", "bytes=99990-")]).await;
    assert_eq!(open.body, &body[99990..]);
    let suffix = get(s.addr(), "/a.raw", &[("Range", "bytes=-10")]).await;
    assert_eq!(
        suffix.header("content-range"),
        Some("bytes 99990-99999/100000")
    );
    let beyond = get(s.addr(), "/a.raw", &[("Range", "bytes=100000-")]).await;
    assert_eq!(beyond.status, 416);
    assert_eq!(beyond.header("content-range"), Some("bytes */100000"));

    let same = get(
        s.addr(),
        "/a.raw",
        &[("Range", "bytes=10-19"), ("If-Range", &etag)],
    )
    .await;
    assert_eq!(same.status, 206);
    let same_date = get(
        s.addr(),
        "/a.raw",
        &[("Range", "bytes=10-19"), ("If-Range", &last_modified)],
    )
    .await;
    assert_eq!(same_date.status, 206);
    let stale = get(
        s.addr(),
        "/a.raw",
        &[("Range", "bytes=10-19"), ("If-Range", "\"other\"")],
    )
    .await;
    assert_eq!(stale.status, 200, "changed validator: whole object");
    assert_eq!(stale.body, body);

    assert_eq!(get(s.addr(), "/missing", &[]).await.status, 404);
    let log = s.requests_for("/a.raw");
    assert_eq!(log.len(), 9);
    assert_eq!(log[2].range.as_deref(), Some("bytes=1000-1999"));
    assert_eq!(log[2].status, 206);
    assert_eq!(log[1].method, "HEAD");
    assert_eq!(log[6].if_range.as_deref(), Some(etag.as_str()));
    assert_eq!(s.requests().len(), 10);
}

/// If-Range compares strongly (RFC 9110 13.1.5): a weak ETag never matches, even its own,
/// so the whole object comes back and a client cannot stitch bytes of two versions that a
/// weak validator calls equal.
#[tokio::test]
async fn a_weak_etag_in_if_range_gets_the_whole_object() {
    let body = payload(1000);
    let s = ArtifactServer::start().await.expect("server");
    s.put(
        "/w.raw",
        Artifact::bytes(body.clone()).with_etag(Some("W/\"weak\"")),
    );
    let answer = get(
        s.addr(),
        "/w.raw",
        &[("Range", "bytes=10-19"), ("If-Range", "W/\"weak\"")],
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.body, body);
}

#[tokio::test]
async fn keeps_connections_alive() {
    let s = server_with("/k", b"hello").await;
    let mut stream = TcpStream::connect(s.addr()).await.expect("connect");
    for _ in 0..3 {
        stream
            .write_all(b"GET /k HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("send");
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !got.ends_with(b"hello") {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "server closed a keep-alive connection");
            got.extend_from_slice(&buf[..n]);
        }
    }
    assert_eq!(s.requests().len(), 3);
}

#[tokio::test]
async fn truncates_and_resets_mid_body() {
    let body = payload(300_000);
    let s = server_with("/t", &body).await;
    s.fault_next("/t", Fault::TruncateAfter(70_000), 1);
    let cut = get(s.addr(), "/t", &[]).await;
    assert_eq!(cut.status, 200);
    assert_eq!(cut.header("content-length"), Some("300000"));
    assert_eq!(cut.body, &body[..70_000]);
    assert_eq!(cut.end, End::Eof);
    assert_eq!(
        get(s.addr(), "/t", &[]).await.body,
        body,
        "next request is fine"
    );

    s.fault_next("/t", Fault::ResetAfter(10_000), 1);
    let reset = get(s.addr(), "/t", &[]).await;
    assert_eq!(reset.end, End::Reset);
    assert!(reset.body.len() <= 10_000);

    // Truncation applies to ranged answers too (counted from the range start).
    s.fault_next("/t", Fault::TruncateAfter(5), 1);
    let part = get(s.addr(), "/t", &[("Range", "bytes=100-199")]).await;
    assert_eq!(part.status, 206);
    assert_eq!(part.body, &body[100..105]);
    assert_eq!(
        s.requests_for("/t")[0].fault.as_deref(),
        Some("TruncateAfter(70000)")
    );
}

#[tokio::test]
async fn stalls_then_continues() {
    let body = payload(50_000);
    let s = server_with("/s", &body).await;
    s.fault_next(
        "/s",
        Fault::StallAfter {
            bytes: 20_000,
            duration: Duration::from_secs(3),
        },
        1,
    );
    // A reader with a short low-speed timeout sees the stall...
    let stalled = fetch(
        s.addr(),
        "GET",
        "/s",
        &[],
        Duration::from_millis(500),
        usize::MAX,
    )
    .await;
    assert_eq!(stalled.end, End::Timeout);
    assert_eq!(stalled.body, &body[..20_000]);
    // ...a patient one gets everything.
    s.fault_next(
        "/s",
        Fault::StallAfter {
            bytes: 20_000,
            duration: Duration::from_millis(300),
        },
        1,
    );
    assert_eq!(get(s.addr(), "/s", &[]).await.body, body);

    s.fault_next("/s", Fault::DelayHeaders(Duration::from_secs(3)), 1);
    let mut stream = TcpStream::connect(s.addr()).await.expect("connect");
    stream
        .write_all(b"GET /s HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    let mut buf = [0u8; 16];
    assert!(
        tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf))
            .await
            .is_err(),
        "no headers during the delay"
    );
}

#[tokio::test]
async fn endless_bodies_and_lying_lengths() {
    let body = payload(1000);
    let s = server_with("/e", &body).await;
    s.fault("/e", Fault::Endless);
    let endless = fetch(s.addr(), "GET", "/e", &[], Duration::from_secs(30), 8 << 20).await;
    assert_eq!(endless.status, 200);
    assert_eq!(endless.header("content-length"), None);
    assert_eq!(endless.end, End::Capped, "still streaming after 8 MiB");

    s.fault("/e", Fault::EndlessAfterBody);
    let more = fetch(s.addr(), "GET", "/e", &[], Duration::from_secs(30), 4 << 20).await;
    assert_eq!(more.header("content-length"), Some("1000"));
    assert_eq!(more.end, End::Capped, "more bytes than Content-Length");
    assert_eq!(&more.body[..1000], &body[..]);

    s.fault("/e", Fault::ContentLength(10));
    let over = get(s.addr(), "/e", &[]).await;
    assert_eq!(over.header("content-length"), Some("10"));
    assert_eq!(over.body, body, "sends the whole body anyway");

    s.fault("/e", Fault::ContentLength(5000));
    let short = get(s.addr(), "/e", &[]).await;
    assert_eq!(short.header("content-length"), Some("5000"));
    assert_eq!(short.body, body);
    assert_eq!(short.end, End::Eof);

    s.clear_faults("/e");
    assert_eq!(get(s.addr(), "/e", &[]).await.body, body);
}

#[tokio::test]
async fn injects_statuses_with_retry_after_then_recovers() {
    let s = server_with("/x", b"payload").await;
    s.fault_sequence(
        "/x",
        [
            Fault::status(500),
            Fault::status(502),
            Fault::status_retry_after(503, 2),
            Fault::status_retry_after(429, 7),
            Fault::status(404),
            Fault::status(401),
            Fault::status(403),
        ],
    );
    let mut seen = Vec::new();
    for _ in 0..7 {
        let r = get(s.addr(), "/x", &[]).await;
        seen.push((r.status, r.header("retry-after").map(str::to_owned)));
    }
    assert_eq!(
        seen,
        vec![
            (500, None),
            (502, None),
            (503, Some("2".to_owned())),
            (429, Some("7".to_owned())),
            (404, None),
            (401, None),
            (403, None),
        ]
    );
    let ok = get(s.addr(), "/x", &[]).await;
    assert_eq!(
        (ok.status, ok.body.as_slice()),
        (200, b"payload".as_slice())
    );

    s.fault_next("/x", Fault::status(503), 2);
    assert_eq!(get(s.addr(), "/x", &[]).await.status, 503);
    assert_eq!(get(s.addr(), "/x", &[]).await.status, 503);
    assert_eq!(get(s.addr(), "/x", &[]).await.status, 200);

    s.fault_next("/x", Fault::CloseWithoutResponse, 1);
    let mut stream = TcpStream::connect(s.addr()).await.expect("connect");
    stream
        .write_all(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).await.expect("read");
    assert!(buf.is_empty(), "closed without a response");
}

#[tokio::test]
async fn ignores_range_and_changes_object_between_attempts() {
    let old = payload(10_000);
    let new: Vec<u8> = old.iter().map(|b| b.wrapping_add(1)).collect();
    let s = server_with("/r", &old).await;
    s.fault_next("/r", Fault::IgnoreRange, 1);
    let whole = get(s.addr(), "/r", &[("Range", "bytes=5000-")]).await;
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body, old);
    assert_eq!(whole.header("content-range"), None);

    let first = get(s.addr(), "/r", &[]).await;
    s.fault_sequence("/r", [Fault::Replace(Artifact::bytes(new.clone()))]);
    let resumed = get(
        s.addr(),
        "/r",
        &[
            ("Range", "bytes=5000-"),
            ("If-Range", first.header("etag").expect("etag")),
        ],
    )
    .await;
    assert_eq!(resumed.status, 200, "validator changed: full new object");
    assert_eq!(resumed.body, new);
    assert_ne!(resumed.header("etag"), first.header("etag"));
    assert_ne!(
        resumed.header("last-modified"),
        first.header("last-modified")
    );

    // Validator-less objects: nothing to resume against.
    s.put("/v", Artifact::bytes(old.clone()).without_validators());
    let bare = get(s.addr(), "/v", &[]).await;
    assert_eq!(bare.header("etag"), None);
    assert_eq!(bare.header("last-modified"), None);
}

#[tokio::test]
async fn redirects_to_another_host_and_serves_sha256sums() {
    let s = server_with("/kubernetes-v1.31.2-x86-64.raw", b"image bytes").await;
    // Any 127.0.0.0/8 address is loopback on Linux: a second "host".
    let other = ArtifactServer::start_on("127.0.0.2:0".parse().expect("addr"))
        .await
        .expect("second server");
    other.put_bytes("/elsewhere.raw", b"other".to_vec());
    s.fault(
        "/kubernetes-v1.31.2-x86-64.raw",
        Fault::Redirect {
            code: 302,
            location: other.url("/elsewhere.raw"),
        },
    );
    let moved = get(s.addr(), "/kubernetes-v1.31.2-x86-64.raw", &[]).await;
    assert_eq!(moved.status, 302);
    assert_eq!(
        moved.header("location"),
        Some(other.url("/elsewhere.raw").as_str())
    );
    assert!(other.url("/").starts_with("http://127.0.0.2:"));
    assert_eq!(
        get(other.addr(), "/elsewhere.raw", &[]).await.body,
        b"other"
    );
    s.clear_faults("/kubernetes-v1.31.2-x86-64.raw");

    let sums = s
        .put_sha256sums("/SHA256SUMS", &["/kubernetes-v1.31.2-x86-64.raw"])
        .expect("sums");
    assert_eq!(
        sums,
        format!(
            "{}  kubernetes-v1.31.2-x86-64.raw\n",
            inplace_tests::sysext::sha256_hex(b"image bytes")
        )
    );
    assert_eq!(
        get(s.addr(), "/SHA256SUMS", &[]).await.body,
        sums.as_bytes()
    );
}

#[tokio::test]
async fn serves_sparse_files_beyond_4_gib_with_64_bit_ranges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.raw");
    let size: u64 = 5 << 30;
    {
        let file = std::fs::File::create(&path).expect("create");
        file.set_len(size).expect("sparse");
        use std::os::unix::fs::FileExt;
        file.write_all_at(b"tail", size - 4).expect("write tail");
    }
    let s = ArtifactServer::start().await.expect("server");
    s.put("/big.raw", Artifact::file(&path).expect("artifact"));
    let head = fetch(
        s.addr(),
        "HEAD",
        "/big.raw",
        &[],
        Duration::from_secs(30),
        usize::MAX,
    )
    .await;
    assert_eq!(head.header("content-length"), Some("5368709120"));
    let end = get(s.addr(), "/big.raw", &[("Range", "bytes=5368709116-")]).await;
    assert_eq!(end.status, 206);
    assert_eq!(
        end.header("content-range"),
        Some("bytes 5368709116-5368709119/5368709120")
    );
    assert_eq!(end.body, b"tail");
}

/// A throttled answer goes at its rate. On a paused clock, which only the server's pacing
/// moves (the client reads with no timer of its own): 4 MiB at 4 MiB/s take a second. A
/// pause of 100 ms after each piece of at most 64 KiB held every rate to 640 KiB/s, and
/// these 4 MiB took 6.4 s (a 64 MiB download the resume test paces at 4 MiB/s took 100 s).
#[tokio::test(start_paused = true)]
async fn a_throttled_body_arrives_at_its_rate() {
    let body = payload(4 << 20);
    let s = server_with("/paced", &body).await;
    s.fault("/paced", Fault::Throttle(4 << 20));
    let started = tokio::time::Instant::now();
    let mut stream = TcpStream::connect(s.addr()).await.expect("connect");
    let request = "GET /paced HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n";
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let took = started.elapsed();
    assert!(raw.ends_with(&body), "{} bytes read", raw.len());
    assert!(
        took >= Duration::from_millis(800) && took <= Duration::from_millis(1200),
        "4 MiB at 4 MiB/s took {took:?}"
    );
}

#[tokio::test]
async fn throttled_bodies_arrive_complete() {
    let body = payload(3000);
    let s = server_with("/slow", &body).await;
    s.fault("/slow", Fault::Throttle(10_000));
    assert_eq!(get(s.addr(), "/slow", &[]).await.body, body);
}
