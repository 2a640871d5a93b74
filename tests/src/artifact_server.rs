//! A controllable HTTP/1.1 artifact server on loopback, hand-rolled on tokio so that it can
//! break the protocol in every way `faults.md` § Downloads lists.
//!
//! Well-behaved by default: `GET`/`HEAD`, `Content-Length`, `ETag`, `Last-Modified`,
//! `Accept-Ranges: bytes`, single `Range` requests answered `206` with `Content-Range`
//! (`416` when unsatisfiable), `If-Range`, keep-alive. Every request is logged for assertions.
//! Faults are set per path, either for every request ([`ArtifactServer::fault`]) or for the
//! next few ([`ArtifactServer::fault_next`], [`ArtifactServer::fault_sequence`]).
//!
//! ```no_run
//! # async fn demo() -> inplace_tests::Result<()> {
//! use inplace_tests::artifact_server::{Artifact, ArtifactServer, Fault};
//! let server = ArtifactServer::start().await?;
//! server.put("/kubernetes.raw", Artifact::bytes(vec![7u8; 1 << 20]));
//! // First attempt dies after 64 KiB, the retry succeeds (and may resume with Range).
//! server.fault_next("/kubernetes.raw", Fault::TruncateAfter(65536), 1);
//! let url = server.url("/kubernetes.raw");
//! # let _ = url;
//! # Ok(()) }
//! ```
//!
//! | faults.md § Downloads | how |
//! |---|---|
//! | content ≠ sha256 | serve other bytes: [`ArtifactServer::put`] |
//! | more bytes than `size` / than Content-Length, endless | [`Fault::ContentLength`] (smaller than the body), [`Fault::Endless`], [`Fault::EndlessAfterBody`] |
//! | Content-Length ≠ declared size | `put` an artifact of another size, or [`Fault::ContentLength`] |
//! | truncated / reset mid-stream | [`Fault::TruncateAfter`], [`Fault::ResetAfter`] |
//! | validator changes between attempts | [`Fault::Replace`] in a sequence, or `put` again |
//! | server ignores Range | [`Fault::IgnoreRange`] |
//! | stall | [`Fault::StallAfter`], [`Fault::DelayHeaders`] |
//! | 500/502/503/429 (+ Retry-After), 404/401/403 | [`Fault::Status`] |
//! | redirect to http / another host | [`Fault::Redirect`] (a second server on `127.0.0.2` is "another host") |
//! | slow link | [`Fault::Throttle`] (one answer), [`ArtifactServer::share_link`] (all of them) |

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use crate::error::IoContext;
use crate::sysext::sha256_hex;
use crate::{Error, Result};

mod link;
pub use link::SharedLink;

const CHUNK: usize = 64 * 1024;
/// Base of the synthetic `Last-Modified` times (2023-11-14); each `put` moves it on a minute.
const LAST_MODIFIED_BASE: u64 = 1_700_000_000;

/// Where an artifact's bytes come from.
#[derive(Debug, Clone)]
enum Source {
    Bytes(Bytes),
    File { path: PathBuf, len: u64 },
}

/// One servable object with its validators.
#[derive(Debug, Clone)]
pub struct Artifact {
    source: Source,
    etag: Option<String>,
    last_modified: Option<String>,
    content_type: String,
}

impl Artifact {
    /// An artifact from memory; its ETag is derived from the sha256 of the bytes.
    pub fn bytes(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        let etag = format!("\"{}\"", &sha256_hex(&bytes)[..16]);
        Self {
            source: Source::Bytes(bytes),
            etag: Some(etag),
            last_modified: None,
            content_type: "application/octet-stream".to_owned(),
        }
    }

    /// An artifact streamed from a host file (e.g. a sparse file over 4 GiB); its ETag is
    /// derived from size and modification time, like nginx does.
    pub fn file(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let meta = std::fs::metadata(&path).ctx(|| format!("stat {}", path.display()))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Ok(Self {
            etag: Some(format!("\"{:x}-{:x}\"", mtime, meta.len())),
            source: Source::File {
                path,
                len: meta.len(),
            },
            last_modified: None,
            content_type: "application/octet-stream".to_owned(),
        })
    }

    /// Replaces the ETag (`None`: send none).
    #[must_use]
    pub fn with_etag(mut self, etag: Option<&str>) -> Self {
        self.etag = etag.map(str::to_owned);
        self
    }

    /// Sets `Last-Modified` explicitly (an HTTP date); by default each `put` gets a new one.
    #[must_use]
    pub fn with_last_modified(mut self, date: &str) -> Self {
        self.last_modified = Some(date.to_owned());
        self
    }

    /// Sends neither ETag nor Last-Modified (a server a client cannot safely resume from).
    #[must_use]
    pub fn without_validators(mut self) -> Self {
        self.etag = None;
        self.last_modified = Some(String::new());
        self
    }

    /// Sets `Content-Type`.
    #[must_use]
    pub fn with_content_type(mut self, content_type: &str) -> Self {
        self.content_type = content_type.to_owned();
        self
    }

    /// Body length in bytes.
    pub fn len(&self) -> u64 {
        match &self.source {
            Source::Bytes(b) => b.len() as u64,
            Source::File { len, .. } => *len,
        }
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A way to misbehave, applied to one request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this status and a short body; `retry_after` sets `Retry-After`
    /// (seconds or an HTTP date). 500/502/503/429, 404/401/403, anything.
    Status {
        /// The status code.
        code: u16,
        /// `Retry-After` value, if any.
        retry_after: Option<String>,
    },
    /// Correct headers, then only the first N body bytes, then a clean close (FIN).
    TruncateAfter(u64),
    /// Correct headers, N body bytes, then a TCP reset (RST).
    ResetAfter(u64),
    /// Correct headers, N body bytes, then nothing for the duration, then the rest.
    StallAfter {
        /// Body bytes sent before the stall.
        bytes: u64,
        /// How long nothing is sent.
        duration: Duration,
    },
    /// Nothing at all (not even headers) for the duration, then a normal answer.
    DelayHeaders(Duration),
    /// Send this `Content-Length` but the real body, then close: smaller than the body means
    /// "more bytes than Content-Length", larger means a short body.
    ContentLength(u64),
    /// 200 without `Content-Length`, body bytes forever (until the client goes away).
    Endless,
    /// 200 with the true `Content-Length`, the body, then more bytes forever.
    EndlessAfterBody,
    /// Answer 200 with the whole body even when a `Range` was asked for.
    IgnoreRange,
    /// Replace the artifact (new content and validators) before answering, then answer
    /// normally: the object changed between two attempts.
    Replace(Artifact),
    /// Redirect to `location` with status 301/302/303/307/308.
    Redirect {
        /// The status code.
        code: u16,
        /// The `Location` header.
        location: String,
    },
    /// Send the body at this many bytes per second.
    Throttle(u64),
    /// Close the connection without answering.
    CloseWithoutResponse,
}

impl Fault {
    /// `Status` without `Retry-After`.
    pub fn status(code: u16) -> Self {
        Fault::Status {
            code,
            retry_after: None,
        }
    }

    /// `Status` with `Retry-After: <seconds>`.
    pub fn status_retry_after(code: u16, seconds: u64) -> Self {
        Fault::Status {
            code,
            retry_after: Some(seconds.to_string()),
        }
    }

    fn label(&self) -> String {
        match self {
            Fault::Replace(_) => "Replace".to_owned(),
            other => format!("{other:?}"),
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    /// `GET`, `HEAD`, ...
    pub method: String,
    /// Request target without the query string.
    pub path: String,
    /// The query string, if any.
    pub query: Option<String>,
    /// The `Range` header.
    pub range: Option<String>,
    /// The `If-Range` header.
    pub if_range: Option<String>,
    /// All headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The status line code sent (0 when the connection was closed without an answer).
    pub status: u16,
    /// The fault applied, if any (its `Debug` form).
    pub fault: Option<String>,
    /// When the request arrived.
    pub at: SystemTime,
}

impl RequestRecord {
    /// A header's value by (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Default)]
struct PathFaults {
    queued: VecDeque<Fault>,
    always: Option<Fault>,
}

#[derive(Debug, Default)]
struct State {
    artifacts: HashMap<String, Artifact>,
    faults: HashMap<String, PathFaults>,
    log: Vec<RequestRecord>,
    puts: u64,
    connections: Vec<AbortHandle>,
    link: Option<Arc<SharedLink>>,
}

/// The server. Dropping it stops accepting and aborts open connections.
#[derive(Debug)]
pub struct ArtifactServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: AbortHandle,
}

impl ArtifactServer {
    /// Starts on `127.0.0.1` with a free port.
    pub async fn start() -> Result<Self> {
        Self::start_on(
            "127.0.0.1:0"
                .parse()
                .map_err(|_| Error::Invalid("addr".into()))?,
        )
        .await
    }

    /// Starts on a given address; `127.0.0.2:0` gives a second loopback "host".
    pub async fn start_on(addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .ctx(|| format!("binding artifact server on {addr}"))?;
        let addr = listener
            .local_addr()
            .ctx(|| "artifact server address".to_owned())?;
        let state = Arc::new(Mutex::new(State::default()));
        let accept_state = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let conn_state = Arc::clone(&accept_state);
                let handle = tokio::spawn(async move {
                    if let Err(e) = serve_connection(stream, &conn_state).await {
                        tracing::debug!("artifact server connection: {e}");
                    }
                });
                let mut st = lock(&accept_state);
                st.connections.retain(|h| !h.is_finished());
                st.connections.push(handle.abort_handle());
            }
        })
        .abort_handle();
        Ok(Self {
            addr,
            state,
            accept,
        })
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr><path>` (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Serves `artifact` at `path` (replacing what was there; gives it a new Last-Modified
    /// unless it has one).
    pub fn put(&self, path: &str, mut artifact: Artifact) {
        let mut st = lock(&self.state);
        st.puts += 1;
        if artifact.last_modified.is_none() {
            artifact.last_modified = Some(http_date(LAST_MODIFIED_BASE + st.puts * 60));
        }
        st.artifacts.insert(path.to_owned(), artifact);
    }

    /// Serves bytes at `path`.
    pub fn put_bytes(&self, path: &str, bytes: impl Into<Bytes>) {
        self.put(path, Artifact::bytes(bytes));
    }

    /// Stops serving `path` (404 from then on).
    pub fn remove(&self, path: &str) {
        lock(&self.state).artifacts.remove(path);
    }

    /// Serves a sysext-bakery style `SHA256SUMS` at `sums_path`, listing the given served
    /// paths by file name. File-backed artifacts are hashed from disk.
    pub fn put_sha256sums(&self, sums_path: &str, paths: &[&str]) -> Result<String> {
        let mut text = String::new();
        for path in paths {
            let artifact = lock(&self.state)
                .artifacts
                .get(*path)
                .cloned()
                .ok_or_else(|| Error::Invalid(format!("{path} is not served")))?;
            let digest = match &artifact.source {
                Source::Bytes(b) => sha256_hex(b),
                Source::File { path, .. } => {
                    sha256_hex(&std::fs::read(path).ctx(|| format!("reading {}", path.display()))?)
                }
            };
            let name = path.rsplit('/').next().unwrap_or(path);
            text.push_str(&format!("{digest}  {name}\n"));
        }
        self.put(
            sums_path,
            Artifact::bytes(text.clone().into_bytes()).with_content_type("text/plain"),
        );
        Ok(text)
    }

    /// Applies `fault` to every request for `path` (after any queued ones) until cleared.
    pub fn fault(&self, path: &str, fault: Fault) {
        lock(&self.state)
            .faults
            .entry(path.to_owned())
            .or_default()
            .always = Some(fault);
    }

    /// Applies `fault` to the next `times` requests for `path`, then behaves again.
    pub fn fault_next(&self, path: &str, fault: Fault, times: usize) {
        let mut st = lock(&self.state);
        let entry = st.faults.entry(path.to_owned()).or_default();
        entry.queued.extend(std::iter::repeat_n(fault, times));
    }

    /// Applies the faults in order, one per request for `path`, then behaves again.
    pub fn fault_sequence(&self, path: &str, faults: impl IntoIterator<Item = Fault>) {
        lock(&self.state)
            .faults
            .entry(path.to_owned())
            .or_default()
            .queued
            .extend(faults);
    }

    /// Removes all faults for `path`.
    pub fn clear_faults(&self, path: &str) {
        lock(&self.state).faults.remove(path);
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.state).log.clone()
    }

    /// The requests for one path.
    pub fn requests_for(&self, path: &str) -> Vec<RequestRecord> {
        lock(&self.state)
            .log
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        lock(&self.state).log.clear();
    }

    /// From now on every answer's body shares one link of `bytes_per_second` (as the
    /// uplink of a server that a fleet downloads from); returns it, to read how many bodies
    /// were ever on it at once.
    pub fn share_link(&self, bytes_per_second: u64) -> Arc<SharedLink> {
        let link = Arc::new(SharedLink::new(bytes_per_second));
        lock(&self.state).link = Some(Arc::clone(&link));
        link
    }
}

impl Drop for ArtifactServer {
    fn drop(&mut self) {
        self.accept.abort();
        for conn in lock(&self.state).connections.drain(..) {
            conn.abort();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves plain data behind; keep serving.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Request {
    method: String,
    path: String,
    query: Option<String>,
    headers: Vec<(String, String)>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one request head; `None` at a clean end of the connection.
async fn read_request(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or("/").to_owned();
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (target, None),
    };
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).await? == 0 {
            return Ok(None);
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        if headers.len() > 200 {
            return Ok(None);
        }
    }
    let req = Request {
        method,
        path,
        query,
        headers,
    };
    // Discard a request body, if any (clients send none for GET/HEAD).
    if let Some(len) = req
        .header("content-length")
        .and_then(|v| v.parse::<u64>().ok())
    {
        let mut sink = tokio::io::sink();
        tokio::io::copy(&mut (&mut *reader).take(len), &mut sink).await?;
    }
    Ok(Some(req))
}

/// What to do with the connection after an answer.
enum After {
    KeepAlive,
    Close,
    Reset,
}

async fn serve_connection(stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream);
    while let Some(req) = read_request(&mut reader).await? {
        let (artifact, fault, link) = {
            let mut st = lock(state);
            let fault = st
                .faults
                .get_mut(&req.path)
                .and_then(|f| f.queued.pop_front().or_else(|| f.always.clone()));
            if let Some(Fault::Replace(new)) = &fault {
                st.puts += 1;
                let mut new = new.clone();
                if new.last_modified.is_none() {
                    new.last_modified = Some(http_date(LAST_MODIFIED_BASE + st.puts * 60));
                }
                st.artifacts.insert(req.path.clone(), new);
            }
            (st.artifacts.get(&req.path).cloned(), fault, st.link.clone())
        };
        let mut record = RequestRecord {
            method: req.method.clone(),
            path: req.path.clone(),
            query: req.query.clone(),
            range: req.header("range").map(str::to_owned),
            if_range: req.header("if-range").map(str::to_owned),
            headers: req.headers.clone(),
            status: 0,
            fault: fault.as_ref().map(Fault::label),
            at: SystemTime::now(),
        };
        let stream = reader.get_mut();
        let served = Served {
            artifact: artifact.as_ref(),
            fault: fault.as_ref(),
            link: link.as_deref(),
        };
        let outcome = respond(stream, &req, served, &mut record).await;
        lock(state).log.push(record);
        let client_closes = req
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        match outcome? {
            After::KeepAlive if !client_closes => {}
            After::KeepAlive => {
                let _ = stream.shutdown().await;
                return Ok(());
            }
            After::Close => {
                let _ = stream.shutdown().await;
                return Ok(());
            }
            After::Reset => {
                let _ = stream.set_zero_linger();
                return Ok(());
            }
        }
    }
    Ok(())
}

/// What a request is answered with: the artifact at its path, the fault set for it, and
/// the link the server's answers share, if one is set.
#[derive(Clone, Copy)]
struct Served<'a> {
    artifact: Option<&'a Artifact>,
    fault: Option<&'a Fault>,
    link: Option<&'a SharedLink>,
}

async fn respond(
    stream: &mut TcpStream,
    req: &Request,
    served: Served<'_>,
    record: &mut RequestRecord,
) -> std::io::Result<After> {
    let Served {
        artifact, fault, ..
    } = served;
    let head_only = req.method == "HEAD";
    if req.method != "GET" && !head_only {
        record.status = 405;
        simple(
            stream,
            405,
            "method not allowed",
            &[("Allow", "GET, HEAD".into())],
            head_only,
        )
        .await?;
        return Ok(After::KeepAlive);
    }
    if let Some(after) = answer_fault(stream, fault, record, head_only).await? {
        return Ok(after);
    }
    let Some(artifact) = artifact else {
        record.status = 404;
        simple(stream, 404, "not found", &[], head_only).await?;
        return Ok(After::KeepAlive);
    };
    if let Some(Fault::Endless) = fault {
        record.status = 200;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nConnection: close\r\n\r\n",
            artifact.content_type
        );
        stream.write_all(head.as_bytes()).await?;
        if !head_only {
            let junk = vec![0x5a_u8; CHUNK];
            loop {
                stream.write_all(&junk).await?;
            }
        }
        return Ok(After::Close);
    }
    let total = artifact.len();
    let Some((status, start, end)) = requested_part(req, artifact, fault) else {
        record.status = 416;
        simple(
            stream,
            416,
            "range not satisfiable",
            &[("Content-Range", format!("bytes */{total}"))],
            head_only,
        )
        .await?;
        return Ok(After::KeepAlive);
    };
    record.status = status;
    let served = Served {
        artifact: Some(artifact),
        ..served
    };
    send_part(stream, served, (status, start, end), head_only).await
}

/// Answers a request the fault decides alone (an injected status, a redirect, a closed
/// connection), or waits the fault's delay and returns `None` to go on.
async fn answer_fault(
    stream: &mut TcpStream,
    fault: Option<&Fault>,
    record: &mut RequestRecord,
    head_only: bool,
) -> std::io::Result<Option<After>> {
    match fault {
        Some(Fault::Status { code, retry_after }) => {
            record.status = *code;
            let extra: Vec<(&str, String)> = retry_after
                .iter()
                .map(|v| ("Retry-After", v.clone()))
                .collect();
            simple(
                stream,
                *code,
                &format!("injected {code}"),
                &extra,
                head_only,
            )
            .await?;
            Ok(Some(After::KeepAlive))
        }
        Some(Fault::Redirect { code, location }) => {
            record.status = *code;
            simple(
                stream,
                *code,
                "moved",
                &[("Location", location.clone())],
                head_only,
            )
            .await?;
            Ok(Some(After::KeepAlive))
        }
        Some(Fault::CloseWithoutResponse) => Ok(Some(After::Close)),
        Some(Fault::DelayHeaders(d)) => {
            tokio::time::sleep(*d).await;
            Ok(None)
        }
        _ => Ok(None),
    }
}

/// Which part of the body to send: `(200, 0, len)`, or `(206, start, end)` for a range the
/// request may use (`If-Range` matches, the fault does not ignore ranges); `None` for a
/// range outside the body (416).
fn requested_part(
    req: &Request,
    artifact: &Artifact,
    fault: Option<&Fault>,
) -> Option<(u16, u64, u64)> {
    let total = artifact.len();
    let ignore_range = matches!(fault, Some(Fault::IgnoreRange));
    // RFC 9110 13.1.5: a strong comparison (a weak ETag never matches) or the exact date.
    let if_range_ok = match req.header("if-range") {
        None => true,
        Some(v) if v.starts_with("W/") => false,
        Some(v) => {
            artifact.etag.as_deref() == Some(v) || artifact.last_modified.as_deref() == Some(v)
        }
    };
    let range = if ignore_range || !if_range_ok {
        None
    } else {
        req.header("range").map(|r| parse_range(r, total))
    };
    match range {
        None | Some(RangeSpec::Ignored) => Some((200, 0, total)),
        Some(RangeSpec::Satisfiable(s, e)) => Some((206, s, e)),
        Some(RangeSpec::Unsatisfiable) => None,
    }
}

/// Sends the head and `start..end` of the body, as the fault bends them (a wrong
/// Content-Length, a truncation, a reset, a stall, a throttle, junk after the body).
async fn send_part(
    stream: &mut TcpStream,
    served: Served<'_>,
    (status, start, end): (u16, u64, u64),
    head_only: bool,
) -> std::io::Result<After> {
    let Served {
        artifact: Some(artifact),
        fault,
        link,
    } = served
    else {
        return Ok(After::Close);
    };
    let total = artifact.len();
    let mut headers: Vec<(&str, String)> = vec![
        ("Content-Type", artifact.content_type.clone()),
        ("Accept-Ranges", "bytes".into()),
    ];
    if let Some(etag) = &artifact.etag {
        headers.push(("ETag", etag.clone()));
    }
    if let Some(lm) = artifact.last_modified.as_deref().filter(|s| !s.is_empty()) {
        headers.push(("Last-Modified", lm.to_owned()));
    }
    if status == 206 {
        headers.push((
            "Content-Range",
            format!("bytes {start}-{}/{total}", end - 1),
        ));
    }
    let declared = match fault {
        Some(Fault::ContentLength(n)) => *n,
        _ => end - start,
    };
    headers.push(("Content-Length", declared.to_string()));
    let closes = matches!(
        fault,
        Some(
            Fault::ContentLength(_)
                | Fault::EndlessAfterBody
                | Fault::TruncateAfter(_)
                | Fault::ResetAfter(_)
        )
    );
    if closes {
        headers.push(("Connection", "close".into()));
    }
    write_head(stream, status, &headers).await?;
    if head_only {
        return Ok(if closes {
            After::Close
        } else {
            After::KeepAlive
        });
    }

    let (limit, after) = match fault {
        Some(Fault::TruncateAfter(n)) => (Some(*n), After::Close),
        Some(Fault::ResetAfter(n)) => (Some(*n), After::Reset),
        Some(Fault::ContentLength(_)) => (None, After::Close),
        _ => (None, After::KeepAlive),
    };
    let stall = match fault {
        Some(Fault::StallAfter { bytes, duration }) => Some((*bytes, *duration)),
        _ => None,
    };
    let pace = Pace {
        rate: match fault {
            Some(Fault::Throttle(bps)) => Some((*bps).max(1)),
            _ => None,
        },
        link,
    };
    send_body(stream, artifact, start, end, limit, stall, pace).await?;
    if let Some(Fault::EndlessAfterBody) = fault {
        let junk = vec![0xa5_u8; CHUNK];
        loop {
            stream.write_all(&junk).await?;
        }
    }
    stream.flush().await?;
    Ok(after)
}

/// How fast a body goes: one answer's own cap ([`Fault::Throttle`]), and the link all
/// answers share ([`ArtifactServer::share_link`]).
struct Pace<'a> {
    rate: Option<u64>,
    link: Option<&'a SharedLink>,
}

async fn send_body(
    stream: &mut TcpStream,
    artifact: &Artifact,
    start: u64,
    end: u64,
    limit: Option<u64>,
    stall: Option<(u64, Duration)>,
    pace: Pace<'_>,
) -> std::io::Result<()> {
    let Pace { rate, link } = pace;
    let mut on_link = link.map(SharedLink::enter);
    let end = limit.map_or(end, |n| end.min(start.saturating_add(n)));
    let mut file = match &artifact.source {
        Source::File { path, .. } => {
            let mut f = tokio::fs::File::open(path).await?;
            f.seek(std::io::SeekFrom::Start(start)).await?;
            Some(f)
        }
        Source::Bytes(_) => None,
    };
    let mut buf = vec![0u8; CHUNK];
    let mut pos = start;
    let mut sent = 0u64;
    let mut stalled = false;
    let paced_from = tokio::time::Instant::now();
    while pos < end {
        let mut want = (end - pos).min(CHUNK as u64);
        if let Some((at, _)) = stall.filter(|_| !stalled) {
            if sent >= at {
                stalled = true;
                stream.flush().await?;
                tokio::time::sleep(stall.map_or(Duration::ZERO, |s| s.1)).await;
            } else {
                want = want.min(at - sent);
            }
        }
        if let Some(bps) = rate {
            // Pieces of at most a tenth of a second's bytes, each sent once the clock says
            // the bytes before it are due: any rate holds (a fixed pause per piece of at
            // most CHUNK held every rate to ten CHUNKs a second), and a late wake-up is made
            // up by the next pieces rather than added to the body's time.
            want = want.min((bps / 10).max(1));
            let due = Duration::from_secs_f64(sent as f64 / bps as f64);
            tokio::time::sleep_until(paced_from + due).await;
        }
        let n = usize::try_from(want).unwrap_or(CHUNK);
        if let Some(link) = link {
            link.pass(n).await;
            if pos + n as u64 >= end {
                // Its last bytes have passed the link: it leaves before they are written,
                // so that nothing the client does once it has them (a status report, the
                // next node's download) can be counted beside it.
                drop(on_link.take());
            }
        }
        match (&artifact.source, file.as_mut()) {
            (Source::Bytes(b), _) => {
                let from = usize::try_from(pos).unwrap_or(usize::MAX);
                stream.write_all(&b[from..from + n]).await?;
            }
            (Source::File { .. }, Some(f)) => {
                f.read_exact(&mut buf[..n]).await?;
                stream.write_all(&buf[..n]).await?;
            }
            (Source::File { .. }, None) => return Ok(()),
        }
        pos += n as u64;
        sent += n as u64;
        if rate.is_some() {
            stream.flush().await?;
        }
    }
    // Stall requested exactly at the end of what we send (e.g. bytes == body length).
    if let Some((at, d)) = stall
        && !stalled
        && sent >= at
    {
        stream.flush().await?;
        tokio::time::sleep(d).await;
    }
    Ok(())
}

async fn write_head(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("Server: inplace-test-artifacts\r\n\r\n");
    stream.write_all(head.as_bytes()).await
}

async fn simple(
    stream: &mut TcpStream,
    status: u16,
    body: &str,
    extra: &[(&str, String)],
    head_only: bool,
) -> std::io::Result<()> {
    let mut headers: Vec<(&str, String)> = extra.to_vec();
    headers.push(("Content-Type", "text/plain".into()));
    headers.push(("Content-Length", body.len().to_string()));
    write_head(stream, status, &headers).await?;
    if !head_only {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.flush().await
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        416 => "Range Not Satisfiable",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Injected",
    }
}

#[derive(Debug, PartialEq, Eq)]
enum RangeSpec {
    /// `[start, end)`.
    Satisfiable(u64, u64),
    Unsatisfiable,
    /// Malformed or multi-range: answered with the whole body, as RFC 9110 allows.
    Ignored,
}

fn parse_range(header: &str, total: u64) -> RangeSpec {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return RangeSpec::Ignored;
    };
    if spec.contains(',') {
        return RangeSpec::Ignored;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeSpec::Ignored;
    };
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        return match b.parse::<u64>() {
            Ok(0) => RangeSpec::Unsatisfiable,
            Ok(_) if total == 0 => RangeSpec::Unsatisfiable,
            Ok(suffix) => RangeSpec::Satisfiable(total.saturating_sub(suffix), total),
            Err(_) => RangeSpec::Ignored,
        };
    }
    let Ok(first) = a.parse::<u64>() else {
        return RangeSpec::Ignored;
    };
    let last = if b.is_empty() {
        u64::MAX
    } else {
        match b.parse::<u64>() {
            Ok(l) => l,
            Err(_) => return RangeSpec::Ignored,
        }
    };
    if last < first {
        RangeSpec::Ignored
    } else if first >= total {
        RangeSpec::Unsatisfiable
    } else {
        RangeSpec::Satisfiable(first, last.min(total - 1) + 1)
    }
}

/// RFC 9110 IMF-fixdate for seconds since the epoch.
fn http_date(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant), for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        day,
        MONTHS[(month - 1) as usize],
        year,
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("bytes=0-9", 100), RangeSpec::Satisfiable(0, 10));
        assert_eq!(
            parse_range("bytes=90-", 100),
            RangeSpec::Satisfiable(90, 100)
        );
        assert_eq!(
            parse_range("bytes=90-500", 100),
            RangeSpec::Satisfiable(90, 100)
        );
        assert_eq!(
            parse_range("bytes=-10", 100),
            RangeSpec::Satisfiable(90, 100)
        );
        assert_eq!(parse_range("bytes=100-", 100), RangeSpec::Unsatisfiable);
        assert_eq!(parse_range("bytes=5-1", 100), RangeSpec::Ignored);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), RangeSpec::Ignored);
        assert_eq!(parse_range("items=0-1", 100), RangeSpec::Ignored);
    }

    #[test]
    fn http_dates_format() {
        assert_eq!(http_date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(http_date(1_700_000_000), "Tue, 14 Nov 2023 22:13:20 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
    }
}
