//! The HTTPS server: TLS from [`crate::tls`], HTTP/1.1 from hyper, one route per hook on
//! the exact paths Cluster API calls (`POST`, JSON in and out), plus `GET /healthz`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::error::Error;
use crate::extension::Extension;
use crate::hooks::{self, HOOKS_API_VERSION, paths};
use crate::tls::{ReloadingCertificate, server_config};

/// The largest request body accepted (Machines with their provider objects are a few KiB).
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A bound, not yet serving, hook server.
pub struct Server {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    routes: Arc<Routes>,
}

struct Routes {
    extension: Arc<Extension>,
    update_machine_timeout_seconds: i32,
}

impl Server {
    /// Loads the certificate and binds `listen`. Fails when either is impossible.
    pub async fn bind(
        listen: SocketAddr,
        cert_file: &std::path::Path,
        key_file: &std::path::Path,
        extension: Arc<Extension>,
        update_machine_timeout_seconds: i32,
    ) -> Result<Self, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let resolver = Arc::new(ReloadingCertificate::load(
            cert_file,
            key_file,
            provider.clone(),
        )?);
        let config = server_config(resolver, provider)?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| Error::Listen {
                addr: listen,
                source,
            })?;
        Ok(Server {
            listener,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            routes: Arc::new(Routes {
                extension,
                update_machine_timeout_seconds,
            }),
        })
    }

    /// The address bound (the port, when `listen` asked for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` completes, then lets requests in flight finish (up to 10 s).
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) {
        let graceful = GracefulShutdown::new();
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!(addr = ?self.local_addr(), "serving Cluster API hooks over HTTPS");
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let (tcp, peer) = match accepted {
                        Ok(pair) => pair,
                        Err(error) => {
                            // Out of file descriptors and the like: back off, do not spin.
                            tracing::warn!(%error, "accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let acceptor = self.acceptor.clone();
                    let routes = self.routes.clone();
                    let watcher = graceful.watcher();
                    tokio::spawn(async move {
                        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(error)) => {
                                tracing::debug!(%peer, %error, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        };
                        let service = service_fn(move |request| {
                            let routes = routes.clone();
                            async move { Ok::<_, Infallible>(routes.handle(request).await) }
                        });
                        let connection = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service);
                        if let Err(error) = watcher.watch(connection).await {
                            tracing::debug!(%peer, %error, "connection ended with an error");
                        }
                    });
                }
                () = &mut shutdown => break,
            }
        }
        drop(self.listener);
        tokio::select! {
            () = graceful.shutdown() => {}
            () = tokio::time::sleep(DRAIN_TIMEOUT) => {
                tracing::warn!("requests still in flight at shutdown were cut off");
            }
        }
    }
}

impl Routes {
    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = request.uri().path().to_owned();
        let method = request.method().clone();
        if path == "/healthz" || path == "/readyz" {
            return text(StatusCode::OK, "ok\n");
        }
        let kind = match path.as_str() {
            paths::DISCOVERY => "Discovery",
            paths::CAN_UPDATE_MACHINE => "CanUpdateMachine",
            paths::CAN_UPDATE_MACHINE_SET => "CanUpdateMachineSet",
            paths::UPDATE_MACHINE => "UpdateMachine",
            _ => {
                return text(
                    StatusCode::NOT_FOUND,
                    &format!("no hook is served at {path}\n"),
                );
            }
        };
        if method != Method::POST {
            let mut response = text(
                StatusCode::METHOD_NOT_ALLOWED,
                "hooks are called with POST\n",
            );
            response
                .headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
            return response;
        }
        let body = match Limited::new(request.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                return failure(
                    StatusCode::BAD_REQUEST,
                    kind,
                    &format!(
                        "cannot read the request body (at most {MAX_BODY_BYTES} bytes): {error}"
                    ),
                );
            }
        };
        match kind {
            "Discovery" => match parse::<hooks::DiscoveryRequest>(kind, &body) {
                Ok(_) => json_response(
                    StatusCode::OK,
                    &hooks::discovery_response(self.update_machine_timeout_seconds),
                ),
                Err(response) => response,
            },
            "CanUpdateMachine" => match parse(kind, &body) {
                Ok(request) => json_response(
                    StatusCode::OK,
                    &self.extension.can_update_machine(&request).await,
                ),
                Err(response) => response,
            },
            "CanUpdateMachineSet" => match parse(kind, &body) {
                Ok(request) => json_response(
                    StatusCode::OK,
                    &self.extension.can_update_machine_set(&request).await,
                ),
                Err(response) => response,
            },
            _ => match parse(kind, &body) {
                Ok(request) => json_response(
                    StatusCode::OK,
                    &self.extension.update_machine(&request).await,
                ),
                Err(response) => response,
            },
        }
    }
}

/// Parses a request body, or gives the 400 answer that says what is wrong with it.
#[allow(clippy::result_large_err)]
fn parse<T: DeserializeOwned>(kind: &str, body: &[u8]) -> Result<T, Response<Full<Bytes>>> {
    serde_json::from_slice(body).map_err(|error| {
        tracing::info!(hook = kind, %error, "malformed request");
        failure(
            StatusCode::BAD_REQUEST,
            kind,
            &format!("malformed {kind}Request: {error}"),
        )
    })
}

fn failure(status: StatusCode, kind: &str, message: &str) -> Response<Full<Bytes>> {
    json_response(
        status,
        &json!({
            "apiVersion": HOOKS_API_VERSION,
            "kind": format!("{kind}Response"),
            "status": "Failure",
            "message": message,
        }),
    )
}

fn json_response<T: Serialize>(status: StatusCode, body: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(body) {
        Ok(bytes) => build(status, "application/json", Bytes::from(bytes)),
        Err(error) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot serialize the response: {error}\n"),
        ),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    build(
        status,
        "text/plain; charset=utf-8",
        Bytes::from(body.to_owned()),
    )
}

fn build(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}
