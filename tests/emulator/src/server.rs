//! The HTTP side: accept loop (with connection-refused outages), authentication, faults,
//! discovery routes and dispatch to [`crate::api`].

use crate::api::{self, Reply, State};
use crate::auth::User;
use crate::discovery;
use crate::error::ApiError;
use crate::faults::OutageKind;
use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Method, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serve until `shutdown` becomes true.
pub async fn serve(
    mut listener: Option<TcpListener>,
    addr: SocketAddr,
    st: Arc<State>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut listener_changes = st.faults.listener_signal();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let refused = matches!(
            st.faults.current_outage(),
            Some((_, OutageKind::ConnectionRefused))
        );
        if refused {
            listener = None;
            let until = st.faults.current_outage().map(|(u, _)| u);
            tokio::select! {
                _ = shutdown.changed() => {}
                _ = listener_changes.changed() => {}
                _ = async { if let Some(u) = until { tokio::time::sleep_until(u.into()).await } } => {}
            }
            continue;
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(%addr, error = %e, "rebinding after outage failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = listener_changes.changed() => { listener = Some(l); continue; }
            accepted = l.accept() => {
                listener = Some(l);
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let st = st.clone();
                let mut conn_changes = st.faults.listener_signal();
                conn_changes.mark_unchanged();
                let mut shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(route(st, req).await) }
                    });
                    // HTTP/1.1, or HTTP/2 with prior knowledge (h2c), like kube-apiserver's
                    // 1000 streams per connection.
                    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    builder.http1().keep_alive(true);
                    builder.http2().max_concurrent_streams(1000);
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = conn => {}
                        _ = conn_changes.changed() => {}
                        _ = shutdown.changed() => {}
                    }
                });
            }
        }
    }
}

fn json_response(code: u16, body: &Value, warnings: &[String]) -> Response<Body> {
    let mut resp = Response::new(Body::from(serde_json::to_vec(body).unwrap_or_default()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    for w in warnings {
        if let Ok(v) = HeaderValue::from_str(&format!(
            "299 - {}",
            serde_json::to_string(w).unwrap_or_default()
        )) {
            resp.headers_mut().append("warning", v);
        }
    }
    resp
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut resp = json_response(e.code, &e.to_status(), &[]);
    if let Some(s) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        resp.headers_mut().insert(http::header::RETRY_AFTER, v);
    }
    resp
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in q.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let dec = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        out.insert(dec(k), dec(v));
    }
    out
}

/// The user of a request: its bearer token's, or, without an Authorization header, the configured
/// anonymous user (kubectl sends no credentials to an `http://` server). Admins may impersonate
/// (`Impersonate-User`, `Impersonate-Group`), like `kubectl --as=... --as-group=...`.
fn authenticate(st: &State, req: &http::Request<Incoming>) -> Option<User> {
    let user = match req.headers().get(http::header::AUTHORIZATION) {
        Some(h) => {
            let token = h.to_str().ok()?.strip_prefix("Bearer ")?.trim();
            st.users
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(token)
                .cloned()?
        }
        None => st.anonymous.clone()?,
    };
    let Some(as_user) = req
        .headers()
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok())
    else {
        return Some(user);
    };
    if !user.is_admin() {
        return None;
    }
    let groups: Vec<&str> = req
        .headers()
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    Some(User::new("", as_user, &groups))
}

async fn route(st: Arc<State>, req: http::Request<Incoming>) -> Response<Body> {
    let latency = st.faults.current_latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some((_, OutageKind::Unavailable)) = st.faults.current_outage() {
        let mut e = ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request (emulated outage)",
        );
        e.retry_after = Some(1);
        return error_response(&e);
    }
    let path = req.uri().path().to_string();
    if matches!(path.as_str(), "/healthz" | "/readyz" | "/livez") {
        let mut r = Response::new(Body::from("ok"));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        );
        return r;
    }
    let Some(user) = authenticate(&st, &req) else {
        return error_response(&ApiError::new(401, "Unauthorized", "Unauthorized"));
    };
    let query = parse_query(req.uri().query());
    let header = |name: http::header::HeaderName| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let content_type = header(http::header::CONTENT_TYPE);
    let accept = header(http::header::ACCEPT);
    let user_agent = header(http::header::USER_AGENT);
    let method = req.method().clone();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error_response(&ApiError::bad_request(format!("reading the body: {e}"))),
    };
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    if let Some(resp) = non_resource(&st, &method, &segs) {
        return resp;
    }
    let target = {
        let inner = st.store.lock();
        api::resolve(&inner, &segs)
    };
    let Some(target) = target else {
        return error_response(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    };
    let request = api::Request {
        method,
        query,
        content_type,
        accept,
        user_agent,
        body,
        user,
    };
    match api::handle(&st, target, request) {
        Ok(Reply::Json(code, v, warnings)) => json_response(code, &v, &warnings),
        Ok(Reply::Stream(s)) => {
            let mut resp = Response::new(Body::from_stream(s.map(Ok::<Bytes, Infallible>)));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp.headers_mut().insert(
                http::header::CACHE_CONTROL,
                HeaderValue::from_static("no-cache, private"),
            );
            resp
        }
        Err(e) => error_response(&e),
    }
}

fn non_resource(st: &State, method: &Method, segs: &[&str]) -> Option<Response<Body>> {
    if method != Method::GET {
        return None;
    }
    let types: Vec<_> = st.store.lock().types.values().cloned().collect();
    let not_found = || {
        error_response(&ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ))
    };
    let ok = |v: Value| json_response(200, &v, &[]);
    Some(match segs {
        ["version"] => ok(discovery::version()),
        ["api"] => ok(discovery::core_versions("127.0.0.1:6443")),
        ["apis"] => ok(discovery::group_list(&types)),
        ["api", v] => discovery::resource_list(&types, "", v).map_or_else(not_found, ok),
        ["apis", g] => discovery::group(&types, g).map_or_else(not_found, ok),
        ["apis", g, v] => discovery::resource_list(&types, g, v).map_or_else(not_found, ok),
        ["openapi", "v3"] => ok(discovery::openapi_v3_index(&types)),
        ["openapi", "v3", "api", v] => {
            discovery::openapi_v3_group(&types, "", v).map_or_else(not_found, ok)
        }
        ["openapi", "v3", "apis", g, v] => {
            discovery::openapi_v3_group(&types, g, v).map_or_else(not_found, ok)
        }
        ["openapi", "v2"] => not_found(),
        _ => return None,
    })
}
