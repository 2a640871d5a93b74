//! Serves the agent's metrics: `GET /metrics` over minimal HTTP/1.1 on a Unix socket under
//! `/run` (mode 0660: root, or a group an operator grants) and, when configured, on a
//! loopback TCP address. One request per connection; anything else is answered 404, 405 or
//! 400 without reading more than [`MAX_REQUEST`] bytes.
//!
//! [`scrape`] is the matching client (`inplace-agent metrics`), for nodes without
//! `curl --unix-socket`.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use inplace_proto::exposition::CONTENT_TYPE;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;

use crate::metrics::AgentMetrics;
use crate::settings::MetricsSettings;

/// The largest request head accepted (request line and headers).
pub const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections answered at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 8;
/// The socket's mode: read-write for the owner and group, nothing for others.
const SOCKET_MODE: u32 = 0o660;

/// Why the metrics endpoints could not be set up or scraped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Something that is not a socket is in the way of the socket path.
    #[error("metrics socket {path}: exists and is not a socket; remove it or set metrics.socket")]
    NotASocket {
        /// The configured socket path.
        path: PathBuf,
    },
    /// The socket could not be created.
    #[error("metrics socket {path}: {source}")]
    Socket {
        /// The configured socket path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The TCP address could not be bound.
    #[error("metrics.listen {addr}: {source}")]
    Listen {
        /// The configured address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The scrape failed.
    #[error("scraping {path}: {message}")]
    Scrape {
        /// The socket.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// The bound endpoints; bound at start so a bad path or a taken port stops the agent
/// with a message instead of failing later.
#[derive(Debug)]
pub struct Endpoints {
    unix: UnixListener,
    socket: PathBuf,
    tcp: Option<TcpListener>,
}

impl Endpoints {
    /// Binds the socket (replacing a stale one: the caller holds the single-instance
    /// lock, so no other agent serves it) and the TCP address, if any.
    pub async fn bind(settings: &MetricsSettings) -> Result<Endpoints, ServeError> {
        let path = settings.socket.clone();
        let socket_error = |source| ServeError::Socket {
            path: path.clone(),
            source,
        };
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_socket() => {
                std::fs::remove_file(&path).map_err(socket_error)?;
            }
            Ok(_) => return Err(ServeError::NotASocket { path }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(socket_error(e)),
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(socket_error)?;
        }
        let unix = UnixListener::bind(&path).map_err(socket_error)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(socket_error)?;
        let tcp = match settings.listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| ServeError::Listen { addr, source })?,
            ),
            None => None,
        };
        Ok(Endpoints {
            unix,
            socket: path,
            tcp,
        })
    }

    /// The Unix socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The TCP address actually bound (port 0 picks one).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Answers scrapes until the task is dropped; then removes the socket file.
    pub async fn serve(self, metrics: Arc<AgentMetrics>) {
        let _socket = RemoveOnDrop(self.socket);
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let unix = async {
            loop {
                if let Ok((stream, _)) = self.unix.accept().await {
                    spawn_answer(stream, &metrics, &permits).await;
                }
            }
        };
        let tcp = async {
            let Some(tcp) = &self.tcp else {
                return std::future::pending::<()>().await;
            };
            loop {
                if let Ok((stream, _)) = tcp.accept().await {
                    spawn_answer(stream, &metrics, &permits).await;
                }
            }
        };
        tokio::join!(unix, tcp);
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn spawn_answer<S>(stream: S, metrics: &Arc<AgentMetrics>, permits: &Arc<Semaphore>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok(permit) = permits.clone().acquire_owned().await else {
        return;
    };
    let metrics = metrics.clone();
    tokio::spawn(async move {
        if let Err(e) = answer(stream, &metrics).await {
            tracing::debug!(error = %e, "metrics request");
        }
        drop(permit);
    });
}

/// Reads one request head and writes its answer.
async fn answer<S>(mut stream: S, metrics: &AgentMetrics) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let head = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request too slow"))??;
    let response = respond(&head, || metrics.render());
    stream.write_all(&response.to_bytes()).await?;
    stream.shutdown().await
}

/// Reads until the blank line that ends a request head, or [`MAX_REQUEST`] + 1 bytes.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while head.len() <= MAX_REQUEST && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    Ok(head)
}

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(&'static str, &'static str)>,
    /// The body (empty for HEAD, but `Content-Length` still says its size).
    pub body: String,
    /// Whether the body is sent (not for HEAD).
    pub send_body: bool,
}

impl Response {
    fn plain(status: u16, body: &str) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", "text/plain; charset=utf-8")],
            body: format!("{body}\n"),
            send_body: true,
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            _ => "Error",
        };
        let mut out = format!("HTTP/1.1 {} {reason}\r\n", self.status);
        for (name, value) in &self.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = out.into_bytes();
        if self.send_body {
            bytes.extend_from_slice(self.body.as_bytes());
        }
        bytes
    }
}

/// The answer to a request head; `render` is only called for a scrape. Pure.
pub fn respond(head: &[u8], render: impl FnOnce() -> String) -> Response {
    let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if head.len() > MAX_REQUEST {
            Response::plain(431, "request head too large")
        } else {
            Response::plain(400, "incomplete request")
        };
    };
    if end + 4 > MAX_REQUEST {
        return Response::plain(431, "request head too large");
    }
    let Ok(head) = std::str::from_utf8(&head[..end]) else {
        return Response::plain(400, "request is not UTF-8");
    };
    let request_line = head.lines().next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Response::plain(400, "malformed request line");
    };
    if !version.starts_with("HTTP/1.") {
        return Response::plain(400, "only HTTP/1.x is spoken here");
    }
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    if path != "/metrics" {
        return Response::plain(404, "not found; the metrics are at /metrics");
    }
    match method {
        "GET" | "HEAD" => Response {
            status: 200,
            headers: vec![("Content-Type", CONTENT_TYPE)],
            body: render(),
            send_body: method == "GET",
        },
        _ => {
            let mut response = Response::plain(405, "only GET and HEAD");
            response.headers.push(("Allow", "GET, HEAD"));
            response
        }
    }
}

/// Fetches `/metrics` from the agent's socket (blocking; for the `metrics` subcommand
/// and tests) and returns the body.
pub fn scrape(socket: &Path, timeout: Duration) -> Result<String, ServeError> {
    let fail = |message: String| ServeError::Scrape {
        path: socket.to_path_buf(),
        message,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(socket).map_err(|e| {
        fail(format!(
            "{e} (is the agent running, with metrics.enabled = true?)"
        ))
    })?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| fail(e.to_string()))?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .map_err(|e| fail(format!("sending the request: {e}")))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| fail(format!("reading the answer: {e}")))?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| fail("the answer has no header end".to_owned()))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        return Err(fail(format!("the agent answered {status:?}")));
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render() -> String {
        "m 1\n".to_owned()
    }

    #[test]
    fn get_metrics_answers_the_exposition() {
        let r = respond(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", render);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "m 1\n");
        assert!(r.headers.contains(&("Content-Type", CONTENT_TYPE)));
        let bytes = String::from_utf8(r.to_bytes()).unwrap();
        assert!(bytes.starts_with("HTTP/1.1 200 OK\r\n"), "{bytes}");
        assert!(bytes.contains("Content-Length: 4\r\n"), "{bytes}");
        assert!(bytes.ends_with("\r\n\r\nm 1\n"), "{bytes}");
        let q = respond(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n", render);
        assert_eq!(q.status, 200);
    }

    #[test]
    fn head_sends_no_body() {
        let r = respond(b"HEAD /metrics HTTP/1.1\r\n\r\n", render);
        assert_eq!(r.status, 200);
        let bytes = String::from_utf8(r.to_bytes()).unwrap();
        assert!(bytes.ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n"));
    }

    #[test]
    fn other_paths_methods_and_garbage_are_refused_without_rendering() {
        let never = || -> String { panic!("rendered for a refused request") };
        assert_eq!(respond(b"GET / HTTP/1.1\r\n\r\n", never).status, 404);
        let post = respond(b"POST /metrics HTTP/1.1\r\n\r\n", never);
        assert_eq!(post.status, 405);
        assert!(post.headers.contains(&("Allow", "GET, HEAD")));
        assert_eq!(respond(b"GET /metrics\r\n\r\n", never).status, 400);
        assert_eq!(respond(b"GET /metrics SPDY/3\r\n\r\n", never).status, 400);
        assert_eq!(respond(b"GET /metrics HTTP/1.1\r\n", never).status, 400);
        assert_eq!(
            respond(b"\xff\xfe /metrics HTTP/1.1\r\n\r\n", never).status,
            400
        );
        let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_REQUEST));
        assert_eq!(respond(&huge, never).status, 431);
        huge.extend_from_slice(b"\r\n\r\n");
        assert_eq!(respond(&huge, never).status, 431);
    }
}
