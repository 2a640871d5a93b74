//! Health checks after activation: every unit active and not restarted, every HTTP check
//! answering 2xx, the Node reporting the expected kubelet version and `Ready` — all of them,
//! uninterrupted, for the whole window, before the timeout. Sampled every interval; the
//! Node is read once per sample for both Node checks, and counts only when the kubelet
//! running now posted it.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use inplace_proto::{HealthChecks, Reason};
use tokio::time::Instant;

use crate::journal::Failure;
use crate::systemd::{SystemdManager, UnitState};

/// The unit that runs the kubelet. A Node's status posted before it last started was
/// posted by the kubelet before it (the one a restart or a reboot replaced), and says
/// nothing of the one that runs: the Node checks wait for the running kubelet's own. A
/// node without this unit (a kubelet run otherwise) has its Node checks read as they are.
pub const KUBELET_UNIT: &str = "kubelet.service";

/// Checks that need the network or the API server.
#[async_trait]
pub trait Probes: Send + Sync {
    /// GETs `url`; `Err` describes a non-2xx answer or a transport error.
    async fn http_ok(&self, url: &str) -> Result<(), String>;
    /// What the API server has of this node's Node object; `Err` when it cannot be read.
    async fn node_status(&self) -> Result<NodeReport, String>;
}

/// What the Node checks read of this node's Node object: one read serves both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeReport {
    /// `status.nodeInfo.kubeletVersion`, if the Node has it.
    pub kubelet_version: Option<String>,
    /// The `Ready` condition, if the Node has one.
    pub ready: Option<ReadyCondition>,
}

/// A Node's `Ready` condition, as the kubelet (or the node lifecycle controller) set it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadyCondition {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Why, in one word (`KubeletNotReady`, `NodeStatusUnknown`); may be empty.
    pub reason: String,
    /// Why, in words; may be empty.
    pub message: String,
    /// `lastHeartbeatTime`: when the kubelet last posted the Node's status (whole seconds).
    pub last_heartbeat: Option<SystemTime>,
}

impl NodeReport {
    /// The report of a Node object: its kubelet version and `Ready` condition.
    pub fn of(node: k8s_openapi::api::core::v1::Node) -> Self {
        let Some(status) = node.status else {
            return NodeReport::default();
        };
        NodeReport {
            kubelet_version: status.node_info.map(|i| i.kubelet_version),
            ready: status
                .conditions
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| ReadyCondition {
                    status: c.status,
                    reason: c.reason.unwrap_or_default(),
                    message: c.message.unwrap_or_default(),
                    last_heartbeat: c.last_heartbeat_time.map(|t| SystemTime::from(t.0)),
                }),
        }
    }

    /// Whether the kubelet that started at `kubelet_started` posted this status. The
    /// heartbeat the kubelet stamps on every status it posts has whole seconds, so a status
    /// stamped with the second the kubelet started in counts: a started kubelet posts its
    /// status at once, often within that second, and then only when it changes or every
    /// five minutes (`nodeStatusReportFrequency`), so a later second may not come within
    /// a health timeout. The kubelet before it posts on the same schedule, so that its last
    /// status falls in that second is rare.
    fn posted_since(&self, kubelet_started: SystemTime) -> bool {
        let seconds = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let heartbeat = self.ready.as_ref().and_then(|r| r.last_heartbeat);
        heartbeat.is_some_and(|h| seconds(h) >= seconds(kubelet_started))
    }
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
    /// Whether the Node's `Ready` condition must be `True`.
    pub node_ready: bool,
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
            node_ready: checks.node_ready,
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
    let mut units = UnitWatch::default();
    let mut healthy_since: Option<Instant> = None;
    let mut last_problem = String::from("no sample yet");
    loop {
        match sample(plan, systemd, probes, &mut units).await {
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
                    "not healthy for a whole window of {:?} within {:?}: {last_problem}{}",
                    plan.window,
                    plan.timeout,
                    units.troubles(plan.units)
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
    if plan.node_ready {
        names.push("Node Ready".into());
    }
    if names.is_empty() {
        "no checks;".into()
    } else {
        names.join(", ")
    }
}

/// What the samples saw of the units: the state each window compares with, and how often
/// each unit restarted since the checks began. A unit that crash-loops with a short
/// `RestartSec=` is `active` for part of every second; the last sample may catch it up and
/// blame the Node instead, so a failure names the restarts as well.
#[derive(Default)]
struct UnitWatch<'a> {
    /// The state at the start of the current window, per unit that was active.
    baseline: HashMap<&'a str, UnitState>,
    /// `NRestarts` at the first sample and at the latest one, per service.
    restarts: HashMap<&'a str, (u32, u32)>,
}

impl<'a> UnitWatch<'a> {
    fn count_restarts(&mut self, unit: &'a str, state: &UnitState) {
        if let Some(n) = state.n_restarts {
            self.restarts.entry(unit).or_insert((n, n)).1 = n;
        }
    }

    /// `; kubelet.service restarted 7 times meanwhile`, for each unit that did; else empty.
    fn troubles(&self, units: &[String]) -> String {
        units
            .iter()
            .filter_map(|unit| {
                let (first, latest) = self.restarts.get(unit.as_str())?;
                let times = latest.checked_sub(*first).filter(|n| *n > 0)?;
                let times = if times == 1 {
                    "once".to_owned()
                } else {
                    format!("{times} times")
                };
                Some(format!("; {unit} restarted {times} meanwhile"))
            })
            .collect()
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
    units: &mut UnitWatch<'a>,
) -> Sample {
    let mut problem = None;
    let mut kubelet = None;
    for unit in plan.units {
        let state = match systemd.unit_state(unit).await {
            Ok(state) => state,
            Err(e) => {
                problem.get_or_insert(format!("{unit}: {e}"));
                continue;
            }
        };
        units.count_restarts(unit, &state);
        if unit == KUBELET_UNIT {
            kubelet = Some(state.clone());
        }
        if state.active_state == "failed" {
            return Sample::Fatal(format!("{unit} failed ({})", state.sub_state));
        }
        if state.active_state != "active" {
            problem.get_or_insert(format!(
                "{unit} is {} ({})",
                state.active_state, state.sub_state
            ));
            units.baseline.remove(unit.as_str());
            continue;
        }
        match units.baseline.get(unit.as_str()) {
            Some(before)
                if before.n_restarts != state.n_restarts
                    || before.active_enter_monotonic != state.active_enter_monotonic =>
            {
                problem.get_or_insert(format!("{unit} restarted during the window"));
                units.baseline.insert(unit, state);
            }
            Some(_) => {}
            None => {
                units.baseline.insert(unit, state);
            }
        }
    }
    for url in &plan.http {
        if let Err(e) = probes.http_ok(url).await {
            problem.get_or_insert(format!("HTTP check {url}: {e}"));
        }
    }
    if plan.kubelet_version.is_some() || plan.node_ready {
        let kubelet = match kubelet {
            Some(state) => Ok(state),
            None => systemd.unit_state(KUBELET_UNIT).await,
        };
        let node_problem = match kubelet {
            Ok(kubelet) => node_problem(plan, probes.node_status().await, kubelet.active_since()),
            Err(e) => Some(format!("when {KUBELET_UNIT} started: {e}")),
        };
        if let Some(p) = node_problem {
            problem.get_or_insert(p);
        }
    }
    match problem {
        None => Sample::Healthy,
        Some(p) => Sample::Unhealthy(p),
    }
}

/// What is wrong with the Node as `read`, for the Node checks the plan has, when the kubelet
/// running now started at `kubelet_started`; the kubelet version first, because a wrong
/// version says more than the `Ready` of a kubelet, then whether that kubelet posted it.
fn node_problem(
    plan: &Plan<'_>,
    read: Result<NodeReport, String>,
    kubelet_started: Option<SystemTime>,
) -> Option<String> {
    let node = match read {
        Ok(node) => node,
        Err(e) => return Some(format!("cannot read the Node: {e}")),
    };
    if let Some(expected) = plan.kubelet_version {
        match node.kubelet_version.as_deref() {
            Some(v) if v == expected => {}
            Some(v) => return Some(format!("the node reports kubelet {v}, expected {expected}")),
            None => return Some("the node reports no kubelet version".into()),
        }
    }
    if let Some(started) = kubelet_started
        && !node.posted_since(started)
    {
        return Some(stale_status(&node, started));
    }
    if !plan.node_ready {
        return None;
    }
    match node.ready {
        Some(ready) if ready.status == "True" => None,
        Some(ready) => Some(format!("the Node is not Ready ({})", ready_detail(&ready))),
        None => Some("the Node has no Ready condition".into()),
    }
}

/// Why a Node status posted before the running kubelet started is not counted.
fn stale_status(node: &NodeReport, kubelet_started: SystemTime) -> String {
    let at = |t: SystemTime, precision| {
        chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(precision, true)
    };
    let started = at(kubelet_started, chrono::SecondsFormat::Millis);
    match node.ready.as_ref().and_then(|r| r.last_heartbeat) {
        Some(heartbeat) => format!(
            "the Node's status was posted at {} (its Ready heartbeat), before {KUBELET_UNIT} \
             started at {started}: waiting for the running kubelet to post its own",
            at(heartbeat, chrono::SecondsFormat::Secs)
        ),
        None => format!(
            "the Node's Ready condition has no heartbeat to show it was posted after \
             {KUBELET_UNIT} started at {started}"
        ),
    }
}

/// `False, KubeletNotReady: container runtime network not ready`, leaving out what is empty.
fn ready_detail(ready: &ReadyCondition) -> String {
    let why = [ready.reason.as_str(), ready.message.as_str()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    if why.is_empty() {
        ready.status.clone()
    } else {
        format!("{}, {why}", ready.status)
    }
}

/// Probes over HTTP (reqwest) and the API server (the Node object).
pub struct RealProbes {
    http: reqwest::Client,
    nodes: Option<kube::Api<k8s_openapi::api::core::v1::Node>>,
    node_name: String,
}

impl RealProbes {
    /// Probes for `node_name`; without a client the Node checks always fail.
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

    async fn node_status(&self) -> Result<NodeReport, String> {
        let nodes = self.nodes.as_ref().ok_or("no API client")?;
        let node = nodes
            .get(&self.node_name)
            .await
            .map_err(|e| e.to_string())?;
        Ok(NodeReport::of(node))
    }
}

#[cfg(test)]
mod tests;
