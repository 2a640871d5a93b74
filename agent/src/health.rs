//! Health checks after activation: every unit active and not restarted, every HTTP check
//! answering 2xx, the Node reporting the expected kubelet version — all of them,
//! uninterrupted, for the whole window, before the timeout. Sampled every interval.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use inplace_proto::{HealthChecks, Reason};
use tokio::time::Instant;

use crate::journal::Failure;
use crate::systemd::{SystemdManager, UnitState};

/// Checks that need the network or the API server.
#[async_trait]
pub trait Probes: Send + Sync {
    /// GETs `url`; `Err` describes a non-2xx answer or a transport error.
    async fn http_ok(&self, url: &str) -> Result<(), String>;
    /// The node's `status.nodeInfo.kubeletVersion`, as the API server has it.
    async fn kubelet_version(&self) -> Result<Option<String>, String>;
}

/// What to check, and how long.
#[derive(Debug, Clone)]
pub struct Plan<'a> {
    /// Units that must be active and not restart.
    pub units: &'a [String],
    /// URLs that must answer 2xx.
    pub http: Vec<&'a str>,
    /// The kubelet version the Node must report, if checked.
    pub kubelet_version: Option<&'a str>,
    /// How long everything must pass without interruption.
    pub window: Duration,
    /// When to give up, counted from the start.
    pub timeout: Duration,
    /// How often to sample.
    pub interval: Duration,
}

impl<'a> Plan<'a> {
    /// The checks of a revision, as its content states them.
    pub fn of(
        checks: &'a HealthChecks,
        kubernetes_version: Option<&'a str>,
        interval: Duration,
    ) -> Self {
        Plan {
            units: &checks.units,
            http: checks.http.iter().map(|c| c.url.as_str()).collect(),
            kubelet_version: if checks.node_kubelet_version {
                kubernetes_version
            } else {
                None
            },
            window: checks.window.get(),
            timeout: checks.timeout.get(),
            interval,
        }
    }
}

/// Runs the checks; `progress` gets a line like "kubelet.service healthy for 12s of 30s".
pub async fn verify(
    plan: &Plan<'_>,
    systemd: &dyn SystemdManager,
    probes: &dyn Probes,
    progress: &(dyn Fn(String) + Send + Sync),
) -> Result<(), Failure> {
    let start = Instant::now();
    let mut baseline: HashMap<&str, UnitState> = HashMap::new();
    let mut healthy_since: Option<Instant> = None;
    let mut last_problem = String::from("no sample yet");
    loop {
        match sample(plan, systemd, probes, &mut baseline).await {
            Sample::Fatal(message) => {
                return Err(Failure {
                    reason: Reason::HealthCheckFailed,
                    message,
                });
            }
            Sample::Unhealthy(problem) => {
                healthy_since = None;
                progress(format!("waiting: {problem}"));
                last_problem = problem;
            }
            Sample::Healthy => {
                let since = *healthy_since.get_or_insert_with(Instant::now);
                let healthy_for = since.elapsed();
                if healthy_for >= plan.window {
                    return Ok(());
                }
                progress(format!(
                    "{} healthy for {}s of {}s",
                    describe(plan),
                    healthy_for.as_secs(),
                    plan.window.as_secs()
                ));
            }
        }
        if start.elapsed() >= plan.timeout {
            return Err(Failure {
                reason: Reason::HealthCheckFailed,
                message: format!(
                    "not healthy for a whole window of {:?} within {:?}: {last_problem}",
                    plan.window, plan.timeout
                ),
            });
        }
        tokio::time::sleep(plan.interval).await;
    }
}

fn describe(plan: &Plan<'_>) -> String {
    let mut names: Vec<String> = plan.units.to_vec();
    names.extend(plan.http.iter().map(|u| (*u).to_owned()));
    if plan.kubelet_version.is_some() {
        names.push("kubelet version".into());
    }
    if names.is_empty() {
        "no checks;".into()
    } else {
        names.join(", ")
    }
}

enum Sample {
    Healthy,
    Unhealthy(String),
    Fatal(String),
}

async fn sample<'a>(
    plan: &Plan<'a>,
    systemd: &dyn SystemdManager,
    probes: &dyn Probes,
    baseline: &mut HashMap<&'a str, UnitState>,
) -> Sample {
    let mut problem = None;
    for unit in plan.units {
        let state = match systemd.unit_state(unit).await {
            Ok(state) => state,
            Err(e) => {
                problem.get_or_insert(format!("{unit}: {e}"));
                continue;
            }
        };
        if state.active_state == "failed" {
            return Sample::Fatal(format!("{unit} failed ({})", state.sub_state));
        }
        if state.active_state != "active" {
            problem.get_or_insert(format!(
                "{unit} is {} ({})",
                state.active_state, state.sub_state
            ));
            baseline.remove(unit.as_str());
            continue;
        }
        match baseline.get(unit.as_str()) {
            Some(before)
                if before.n_restarts != state.n_restarts
                    || before.active_enter_monotonic != state.active_enter_monotonic =>
            {
                problem.get_or_insert(format!("{unit} restarted during the window"));
                baseline.insert(unit, state);
            }
            Some(_) => {}
            None => {
                baseline.insert(unit, state);
            }
        }
    }
    for url in &plan.http {
        if let Err(e) = probes.http_ok(url).await {
            problem.get_or_insert(format!("HTTP check {url}: {e}"));
        }
    }
    if let Some(expected) = plan.kubelet_version {
        match probes.kubelet_version().await {
            Ok(Some(v)) if v == expected => {}
            Ok(Some(v)) => {
                problem.get_or_insert(format!("the node reports kubelet {v}, expected {expected}"));
            }
            Ok(None) => {
                problem.get_or_insert("the node reports no kubelet version".into());
            }
            Err(e) => {
                problem.get_or_insert(format!("cannot read the node's kubelet version: {e}"));
            }
        }
    }
    match problem {
        None => Sample::Healthy,
        Some(p) => Sample::Unhealthy(p),
    }
}

/// Probes over HTTP (reqwest) and the API server (the Node object).
pub struct RealProbes {
    http: reqwest::Client,
    nodes: Option<kube::Api<k8s_openapi::api::core::v1::Node>>,
    node_name: String,
}

impl RealProbes {
    /// Probes for `node_name`; without a client the kubelet version check always fails.
    pub fn new(
        client: Option<kube::Client>,
        node_name: &str,
        timeout: Duration,
    ) -> Result<Self, reqwest::Error> {
        crate::fetch::install_crypto_provider();
        Ok(RealProbes {
            http: crate::fetch::build_client(|| {
                reqwest::Client::builder()
                    .timeout(timeout)
                    .redirect(reqwest::redirect::Policy::none())
                    .no_proxy()
            })?,
            nodes: client.map(kube::Api::all),
            node_name: node_name.to_owned(),
        })
    }
}

#[async_trait]
impl Probes for RealProbes {
    async fn http_ok(&self, url: &str) -> Result<(), String> {
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| crate::fetch::error_chain(&e))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {}", response.status().as_u16()))
        }
    }

    async fn kubelet_version(&self) -> Result<Option<String>, String> {
        let nodes = self.nodes.as_ref().ok_or("no API client")?;
        let node = nodes
            .get(&self.node_name)
            .await
            .map_err(|e| e.to_string())?;
        Ok(node
            .status
            .and_then(|s| s.node_info)
            .map(|i| i.kubelet_version))
    }
}
