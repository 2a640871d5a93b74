//! The alert gate's I/O: asks Prometheus which alerts fire (`GET <url>/api/v1/alerts`, its
//! HTTP API's JSON) within a timeout, behind the small [`AlertSource`] trait, and turns
//! the answer — or why there is none — into the decision's [`AlertObservation`]. Judging
//! it (which alerts block, failing closed) is the decision's (`decision/health.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use inplace_proto::NodeRolloutSpec;
use serde::Deserialize;
use url::Url;

use crate::decision::AlertObservation;
use crate::release::fetch::{build_client, chain};

/// The largest answer read: thousands of alerts with their labels and annotations fit
/// well below it; past it, the gate is unavailable rather than the controller's memory.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Where and how patiently the controller asks Prometheus.
#[derive(Debug, Clone)]
pub struct PrometheusSettings {
    /// Prometheus' base URL (`http://prometheus.monitoring:9090`, or with a path prefix
    /// such as `http://gateway/prometheus/`); the alerts are at `api/v1/alerts` below it.
    pub url: Url,
    /// For the whole exchange: connect, headers and body.
    pub timeout: Duration,
}

/// Why Prometheus gave no usable answer. Each variant's message names the URL.
#[derive(Debug, thiserror::Error)]
pub enum AlertGateError {
    /// No complete answer within the timeout.
    #[error("GET {url}: no complete answer within {}s (--prometheus-timeout)", .after.as_secs_f64())]
    Timeout {
        /// The URL asked for.
        url: Url,
        /// The timeout.
        after: Duration,
    },
    /// Connecting failed, or the connection broke.
    #[error("GET {url} failed: {message}")]
    Transport {
        /// The URL asked for.
        url: Url,
        /// The client's error and its causes.
        message: String,
    },
    /// An HTTP status other than 2xx.
    #[error("GET {url} answered {status}")]
    Status {
        /// The URL asked for.
        url: Url,
        /// The status with its reason phrase.
        status: String,
    },
    /// The body is not Prometheus' alerts JSON, or it reports an error.
    #[error("GET {url}: not Prometheus' alerts answer: {message}")]
    BadAnswer {
        /// The URL asked for.
        url: Url,
        /// What is wrong with it.
        message: String,
    },
}

/// Where the controller learns which alerts fire.
pub trait AlertSource: Send + Sync {
    /// The names (`alertname`) of every alert in state `firing`.
    fn firing(&self) -> BoxFuture<'_, Result<BTreeSet<String>, AlertGateError>>;
}

/// The alert gate's observation for a rollout: not asked when it lists no alert; else the
/// source's answer, or why there is none (no source configured included).
pub async fn observe_alerts(
    spec: &NodeRolloutSpec,
    source: Option<&Arc<dyn AlertSource>>,
) -> AlertObservation {
    if spec.gates.alerts.is_empty() {
        return AlertObservation::NotAsked;
    }
    let Some(source) = source else {
        return AlertObservation::Unavailable(
            "the controller has no Prometheus URL (--prometheus-url)".to_owned(),
        );
    };
    match source.firing().await {
        Ok(firing) => AlertObservation::Firing(firing),
        Err(error) => AlertObservation::Unavailable(error.to_string()),
    }
}

/// Prometheus' HTTP API.
pub struct Prometheus {
    client: reqwest::Client,
    alerts_url: Url,
    timeout: Duration,
}

impl Prometheus {
    /// A client for `settings`; fails only when the HTTP client cannot be built.
    pub fn new(settings: &PrometheusSettings) -> Result<Prometheus, AlertGateError> {
        let alerts_url = alerts_url(&settings.url);
        let builder = || {
            reqwest::Client::builder()
                .timeout(settings.timeout)
                .user_agent(concat!("inplace-controller/", env!("CARGO_PKG_VERSION")))
        };
        let client = build_client(builder).map_err(|e| AlertGateError::Transport {
            url: alerts_url.clone(),
            message: chain(&e),
        })?;
        Ok(Prometheus {
            client,
            alerts_url,
            timeout: settings.timeout,
        })
    }

    async fn ask(&self) -> Result<BTreeSet<String>, AlertGateError> {
        let url = &self.alerts_url;
        let failed = |e: reqwest::Error| {
            if e.is_timeout() {
                AlertGateError::Timeout {
                    url: url.clone(),
                    after: self.timeout,
                }
            } else {
                AlertGateError::Transport {
                    url: url.clone(),
                    message: chain(&e),
                }
            }
        };
        let mut response = self.client.get(url.clone()).send().await.map_err(failed)?;
        if !response.status().is_success() {
            return Err(AlertGateError::Status {
                url: url.clone(),
                status: response.status().to_string(),
            });
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(AlertGateError::BadAnswer {
                    url: url.clone(),
                    message: format!("larger than {MAX_ANSWER_BYTES} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        firing_alert_names(&body).map_err(|message| AlertGateError::BadAnswer {
            url: url.clone(),
            message,
        })
    }
}

impl AlertSource for Prometheus {
    fn firing(&self) -> BoxFuture<'_, Result<BTreeSet<String>, AlertGateError>> {
        Box::pin(self.ask())
    }
}

/// `<base>/api/v1/alerts`, keeping a path prefix of the base.
fn alerts_url(base: &Url) -> Url {
    let mut url = base.clone();
    let path = format!("{}/api/v1/alerts", base.path().trim_end_matches('/'));
    url.set_path(&path);
    url.set_query(None);
    url
}

/// Prometheus' answer to `/api/v1/alerts`.
#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<AnswerData>,
}

#[derive(Deserialize)]
struct AnswerData {
    alerts: Vec<AlertJson>,
}

#[derive(Deserialize)]
struct AlertJson {
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
    state: String,
}

/// The `alertname` of every alert in state `firing` (`pending` ones have not fired yet).
pub fn firing_alert_names(body: &[u8]) -> Result<BTreeSet<String>, String> {
    let answer: Answer = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if answer.status != "success" {
        return Err(format!(
            "status {:?}: {}",
            answer.status,
            answer.error.as_deref().unwrap_or("no error given")
        ));
    }
    let data = answer.data.ok_or("no \"data\" in a success answer")?;
    Ok(data
        .alerts
        .into_iter()
        .filter(|alert| alert.state == "firing")
        .filter_map(|mut alert| alert.labels.remove("alertname"))
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn only_firing_alerts_count_by_their_alertname() {
        let body = br#"{"status":"success","data":{"alerts":[
            {"labels":{"alertname":"NodeDown","node":"a"},"annotations":{},"state":"firing","activeAt":"2026-11-26T00:00:00Z","value":"1e+00"},
            {"labels":{"alertname":"NodeDown","node":"b"},"annotations":{},"state":"firing","activeAt":"2026-11-26T00:00:00Z","value":"1e+00"},
            {"labels":{"alertname":"DiskSoonFull"},"annotations":{},"state":"pending","activeAt":"2026-11-26T00:00:00Z","value":"1e+00"},
            {"labels":{"severity":"page"},"state":"firing"}
        ]}}"#;
        assert_eq!(
            firing_alert_names(body).unwrap(),
            BTreeSet::from(["NodeDown".to_owned()])
        );
        let none = br#"{"status":"success","data":{"alerts":[]}}"#;
        assert!(firing_alert_names(none).unwrap().is_empty());
    }

    #[test]
    fn anything_but_a_success_answer_is_an_error() {
        let error = br#"{"status":"error","errorType":"internal","error":"boom"}"#;
        assert_eq!(
            firing_alert_names(error).unwrap_err(),
            "status \"error\": boom"
        );
        assert!(firing_alert_names(b"<html>login</html>").is_err());
        assert!(firing_alert_names(br#"{"status":"success"}"#).is_err());
        assert!(
            firing_alert_names(br#"{"status":"success","data":{"alerts":[{"labels":{}}]}}"#)
                .is_err()
        );
    }

    #[test]
    fn the_alerts_path_goes_below_the_base_url_and_its_prefix() {
        let url = |base: &str| alerts_url(&Url::parse(base).unwrap()).to_string();
        assert_eq!(url("http://prom:9090"), "http://prom:9090/api/v1/alerts");
        assert_eq!(url("http://prom:9090/"), "http://prom:9090/api/v1/alerts");
        assert_eq!(
            url("https://gw.example/prometheus/"),
            "https://gw.example/prometheus/api/v1/alerts"
        );
    }
}
