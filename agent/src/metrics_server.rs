//! Serves the agent's metrics: `GET /metrics` over HTTP/1.1 (hyper's server) on a Unix
//! socket under `/run` (mode 0660: root, or a group an operator grants) and, when
//! configured, on a loopback TCP address. One request per connection; anything else is
//! answered 404 or 405, a malformed request 400, a request head over [`Limits`]'s size 431.
//! [`Limits`] also bounds how long a client may take to send its head and how many
//! connections are answered at once.
//!
//! [`scrape`] is the matching client (`inplace-agent metrics`), for nodes without
//! `curl --unix-socket`.

use std::convert::Infallible;
use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;

use crate::metrics::{AgentMetrics, CONTENT_TYPE};
use crate::settings::MetricsSettings;

/// The socket's mode: read-write for the owner and group, nothing for others.
const SOCKET_MODE: u32 = 0o660;

/// What one client may cost the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest request head accepted (request line and headers); at least 8 KiB, the
    /// smallest read buffer hyper allows.
    pub max_request: usize,
    /// How long a client may take to send its request head, counted from the connection.
    pub header_timeout: Duration,
    /// Connections answered at once; more wait in the listen backlog.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_request: 8 * 1024,
            header_timeout: Duration::from_secs(10),
            max_connections: 8,
        }
    }
}

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

    /// Answers scrapes within the default [`Limits`] until the task is dropped; then
    /// removes the socket file.
    pub async fn serve(self, metrics: Arc<AgentMetrics>) {
        self.serve_within(metrics, Limits::default()).await;
    }

    /// Answers scrapes within `limits` until the task is dropped; then removes the socket
    /// file.
    pub async fn serve_within(self, metrics: Arc<AgentMetrics>, limits: Limits) {
        let _socket = RemoveOnDrop(self.socket);
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(limits.max_request)
            .max_header_size(limits.max_request)
            .keep_alive(false);
        let server = Server {
            http,
            metrics,
            permits: Arc::new(Semaphore::new(limits.max_connections)),
        };
        let unix = async {
            loop {
                if let Ok((stream, _)) = self.unix.accept().await {
                    server.answer(stream).await;
                }
            }
        };
        let tcp = async {
            let Some(tcp) = &self.tcp else {
                return std::future::pending::<()>().await;
            };
            loop {
                if let Ok((stream, _)) = tcp.accept().await {
                    server.answer(stream).await;
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

/// What every connection shares.
struct Server {
    http: hyper::server::conn::http1::Builder,
    metrics: Arc<AgentMetrics>,
    permits: Arc<Semaphore>,
}

impl Server {
    /// Answers one connection once a slot is free; until then this listener accepts no
    /// more, so further connections wait in the kernel's listen backlog.
    async fn answer<S>(&self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(permit) = self.permits.clone().acquire_owned().await else {
            return;
        };
        let metrics = self.metrics.clone();
        let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            let response = respond(request.method(), request.uri().path(), || metrics.render());
            std::future::ready(Ok::<_, Infallible>(response.map(Full::new)))
        });
        let connection = self.http.serve_connection(TokioIo::new(stream), service);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "metrics request");
            }
            drop(permit);
        });
    }
}

/// The answer to a request for `path`; `render` is only called for a scrape. Pure.
pub fn respond(method: &Method, path: &str, render: impl FnOnce() -> String) -> Response<Bytes> {
    let plain = |status: StatusCode, text: &str| {
        let mut response = Response::new(Bytes::from(format!("{text}\n")));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    };
    if path != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found; the metrics are at /metrics",
        );
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD");
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let mut response = Response::new(Bytes::from(render()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE),
    );
    response
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
    fn get_and_head_metrics_answer_the_exposition() {
        for method in [Method::GET, Method::HEAD] {
            let r = respond(&method, "/metrics", render);
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.body().as_ref(), b"m 1\n");
            assert_eq!(r.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        }
    }

    #[test]
    fn other_paths_and_methods_are_refused_without_rendering() {
        let never = || -> String { panic!("rendered for a refused request") };
        assert_eq!(
            respond(&Method::GET, "/", never).status(),
            StatusCode::NOT_FOUND
        );
        let post = respond(&Method::POST, "/metrics", never);
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(post.headers()[header::ALLOW], "GET, HEAD");
    }
}
