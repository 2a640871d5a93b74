//! A stand-in for Prometheus' HTTP API: serves `GET /api/v1/alerts` in Prometheus' own JSON
//! shape from a list the test sets, and can answer slowly, answer something that is not
//! that JSON, or be down (its listener closed: connections are refused) and come back on
//! the same address.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::{Value, json};

/// How the stand-in answers.
#[derive(Debug, Clone)]
pub enum Answer {
    /// These alerts, each `(alertname, state)` with `state` `firing` or `pending`.
    Alerts(Vec<(String, String)>),
    /// The alerts of an empty list, after this long.
    After(Duration),
    /// An HTML page with status 200 (a login page in front of Prometheus).
    NotJson,
}

#[derive(Clone)]
struct Shared {
    answer: Arc<Mutex<Answer>>,
    asked: Arc<AtomicUsize>,
}

/// The running stand-in.
pub struct FakePrometheus {
    addr: SocketAddr,
    shared: Shared,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl FakePrometheus {
    /// Serves `answer` on a free port of 127.0.0.1.
    pub async fn start(answer: Answer) -> FakePrometheus {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Shared {
            answer: Arc::new(Mutex::new(answer)),
            asked: Arc::new(AtomicUsize::new(0)),
        };
        let mut fake = FakePrometheus {
            addr,
            shared,
            server: None,
        };
        fake.serve(listener);
        fake
    }

    /// The base URL the controller is given (`--prometheus-url`).
    pub fn url(&self) -> url::Url {
        url::Url::parse(&format!("http://{}/", self.addr)).unwrap()
    }

    /// Answers `answer` from now on.
    pub fn answer(&self, answer: Answer) {
        *self.shared.answer.lock().unwrap() = answer;
    }

    /// How many requests reached `/api/v1/alerts` so far.
    pub fn asked(&self) -> usize {
        self.shared.asked.load(Ordering::SeqCst)
    }

    /// Closes the listener: connections are refused until [`FakePrometheus::up`].
    pub async fn down(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
    }

    /// Listens again on the same address.
    pub async fn up(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = Router::new()
            .route("/api/v1/alerts", get(alerts))
            .with_state(self.shared.clone());
        self.server = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }));
    }
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// One alert as Prometheus lists it.
fn alert(name: &str, state: &str) -> Value {
    json!({
        "labels": {"alertname": name, "severity": "critical"},
        "annotations": {"summary": format!("{name} is {state}")},
        "state": state,
        "activeAt": "2026-11-26T00:00:00Z",
        "value": "1e+00",
    })
}

async fn alerts(
    State(shared): State<Shared>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    shared.asked.fetch_add(1, Ordering::SeqCst);
    let answer = shared.answer.lock().unwrap().clone();
    let listed = match answer {
        Answer::Alerts(listed) => listed,
        Answer::After(delay) => {
            tokio::time::sleep(delay).await;
            Vec::new()
        }
        Answer::NotJson => {
            return (
                StatusCode::OK,
                [("content-type", "text/html")],
                "<html><body>Sign in</body></html>".to_owned(),
            );
        }
    };
    let body = json!({
        "status": "success",
        "data": {"alerts": listed.iter().map(|(n, s)| alert(n, s)).collect::<Vec<_>>()},
    });
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        body.to_string(),
    )
}
