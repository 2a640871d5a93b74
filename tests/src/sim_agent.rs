//! Simulated agents: a test double that follows the agent's status protocol on every
//! node's NodeUpdatePlan, with configurable timings and failures. [`Fleet`] runs every node's
//! steps on timers; [`Stepper`] moves them one phase per call. Both take their steps from
//! `protocol`.
//!
//! Protocol (what the real agent reports, reduced to its phases):
//! a plan with a new revision → `Downloading` → `Staged` (target = the plan's revision);
//! `desiredState: Active` on a staged plan → `Activating` → `Verifying` → `Succeeded`
//! (current = target), or, for a node configured to fail, `RolledBack` / `Failed` with a
//! `Ready=False` condition carrying the reason. A retry token on the plan
//! (`inplace.dev/retry`) is honoured once while the plan asks for `Staged`, as the agent
//! does: the revision is staged again and the token reported in `status.retryHonoured`
//! (a node in [`SimConfig::fixed_by_retry`] then succeeds). One fleet watches all plans (one watch), and
//! each node's steps run in their own task, so 30,000 nodes cost one watch and a timer each.
//!
//! [`Fleet::start_as_nodes`] writes each plan's status as that node's own identity
//! (`system:node:NAME`), through the shipped agent RBAC and admission policy, as the agent
//! does; [`Fleet::start`] writes every status with one client (the scale benchmark).

mod download;
mod protocol;
mod stepper;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use inplace_proto::{NodeUpdatePlan, Phase};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};

pub use protocol::{Failure, SimConfig};
use protocol::{Local, Seen, next_step, status_patch};
pub use stepper::Stepper;

#[derive(Default)]
struct Shared {
    seen: HashMap<String, Seen>,
    local: HashMap<String, Local>,
    running: HashSet<String>,
    /// Each node's own plans API, once made ([`Writer::PerNode`]).
    node_apis: HashMap<String, Api<NodeUpdatePlan>>,
}

/// A client acting as a node's own identity, made on first use.
pub type NodeClientFn = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = anyhow::Result<kube::Client>> + Send>>
        + Send
        + Sync,
>;

/// Who writes a plan's status.
#[derive(Clone)]
enum Writer {
    /// The watching client writes every status.
    Shared,
    /// Each node writes its own plan's status as itself.
    PerNode(NodeClientFn),
}

/// Observations of the whole fleet.
#[derive(Default)]
pub struct FleetStats {
    /// Nodes between `Activating` and a final phase right now.
    pub activating_now: AtomicUsize,
    /// The most nodes ever activating at once.
    pub max_activating: AtomicUsize,
    /// Status writes made.
    pub status_writes: AtomicUsize,
    /// Nodes that reached `Succeeded`.
    pub succeeded: AtomicUsize,
    /// Order in which nodes started activating.
    pub activation_order: Mutex<Vec<String>>,
    /// The nodes between `Activating` and a final phase right now.
    pub activating: Mutex<BTreeSet<String>>,
    /// Each time a node started activating, every node activating then (itself included):
    /// who was ever unavailable together.
    pub activating_together: Mutex<Vec<BTreeSet<String>>>,
    /// Nodes that reported `Downloading` and not yet anything else, right now.
    pub staging_now: AtomicUsize,
    /// The most nodes ever staging at once (`every_phase` only).
    pub max_staging: AtomicUsize,
    /// With [`SimConfig::download_from`]: each node's download, when it ended and how
    /// long it took.
    pub downloads: Mutex<Vec<Download>>,
    /// With [`SimConfig::download_from`]: the attempts that failed and were repeated.
    pub failed_downloads: AtomicUsize,
}

impl FleetStats {
    /// `node` is no longer activating.
    fn leave_activating(&self, node: &str) {
        self.activating_now.fetch_sub(1, Ordering::SeqCst);
        lock(&self.activating).remove(node);
    }

    /// `node` is about to write `phase`, coming from `was`: it leaves the activating and the
    /// staging nodes before the write, since the controller may see the write and grant the
    /// next node before this task runs again, and that node must not find this one still
    /// counted beside it (a loaded run saw three nodes "together" where the controller had
    /// granted two). Final phases come only after `Activating`.
    fn leaving(&self, node: &str, was: Option<Phase>, phase: Phase) {
        if phase.is_final() {
            self.leave_activating(node);
        }
        if was == Some(Phase::Downloading) && phase != Phase::Downloading {
            self.staging_now.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// `node`'s plan was deleted before `phase` could be written: it leaves whatever
    /// [`Self::leaving`] kept it in.
    fn gone(&self, node: &str, was: Option<Phase>, phase: Phase) {
        if matches!(was, Some(Phase::Activating | Phase::Verifying)) && !phase.is_final() {
            self.leave_activating(node);
        }
        if was == Some(Phase::Downloading) && phase == Phase::Downloading {
            self.staging_now.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// `node`'s status moved from `before` to `phase` (written): counts a node that began
    /// staging or activating, or succeeded.
    fn written(&self, node: &str, before: Option<Phase>, phase: Phase) {
        if phase == Phase::Downloading && before != Some(Phase::Downloading) {
            let now = self.staging_now.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_staging.fetch_max(now, Ordering::SeqCst);
        }
        if phase == Phase::Activating && before != Some(Phase::Activating) {
            let now = self.activating_now.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_activating.fetch_max(now, Ordering::SeqCst);
            lock(&self.activation_order).push(node.to_owned());
            let mut activating = lock(&self.activating);
            activating.insert(node.to_owned());
            lock(&self.activating_together).push(activating.clone());
        }
        if phase == Phase::Succeeded {
            self.succeeded.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// One node's download ([`SimConfig::download_from`]).
#[derive(Debug, Clone, Copy)]
pub struct Download {
    /// When its last byte arrived.
    pub ended: std::time::Instant,
    /// From its first attempt to its last byte.
    pub took: Duration,
}

/// A running fleet of simulated agents.
pub struct Fleet {
    /// What it saw.
    pub stats: Arc<FleetStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fleet {
    /// Starts simulated agents for every plan the client can see; the same client writes
    /// every status.
    pub fn start(client: kube::Client, config: SimConfig) -> Fleet {
        Self::start_with(client, Writer::Shared, config)
    }

    /// Starts simulated agents for every plan `client` can see; each writes its plan's
    /// status as its node's identity, a client `node_client` makes.
    pub fn start_as_nodes(
        client: kube::Client,
        node_client: NodeClientFn,
        config: SimConfig,
    ) -> Fleet {
        Self::start_with(client, Writer::PerNode(node_client), config)
    }

    fn start_with(client: kube::Client, writer: Writer, config: SimConfig) -> Fleet {
        let stats = Arc::new(FleetStats::default());
        let shared = Arc::new(Mutex::new(Shared::default()));
        let config = Arc::new(config);
        let api: Api<NodeUpdatePlan> = Api::all(client.clone());
        let task = {
            let stats = stats.clone();
            tokio::spawn(async move {
                let mut events = watcher(api.clone(), watcher::Config::default())
                    .default_backoff()
                    .boxed();
                loop {
                    let (plan, deleted) = match events.try_next().await {
                        Ok(Some(watcher::Event::Apply(plan) | watcher::Event::InitApply(plan))) => {
                            (plan, false)
                        }
                        Ok(Some(watcher::Event::Delete(plan))) => (plan, true),
                        Ok(Some(_)) => continue,
                        Ok(None) => return,
                        Err(_) => continue,
                    };
                    let Some(name) = plan.metadata.name.clone() else {
                        continue;
                    };
                    let start = {
                        let mut s = lock(&shared);
                        if deleted || plan.metadata.deletion_timestamp.is_some() {
                            s.seen.remove(&name);
                        } else {
                            s.seen.insert(name.clone(), Seen::of(&plan));
                        }
                        s.running.insert(name.clone())
                    };
                    if start {
                        tokio::spawn(drive(
                            name,
                            api.clone(),
                            writer.clone(),
                            shared.clone(),
                            config.clone(),
                            stats.clone(),
                        ));
                    }
                }
            })
        };
        Fleet { stats, task }
    }

    /// The most nodes ever activating at once.
    pub fn max_activating(&self) -> usize {
        self.stats.max_activating.load(Ordering::SeqCst)
    }

    /// The most nodes ever staging (between `Downloading` and the next phase) at once.
    pub fn max_staging(&self) -> usize {
        self.stats.max_staging.load(Ordering::SeqCst)
    }
}

/// The plans API `node`'s status writes go through.
async fn status_api(
    node: &str,
    shared_api: &Api<NodeUpdatePlan>,
    writer: &Writer,
    shared: &Mutex<Shared>,
) -> anyhow::Result<Api<NodeUpdatePlan>> {
    let Writer::PerNode(node_client) = writer else {
        return Ok(shared_api.clone());
    };
    if let Some(api) = lock(shared).node_apis.get(node) {
        return Ok(api.clone());
    }
    let api = Api::all(node_client(node.to_owned()).await?);
    lock(shared).node_apis.insert(node.to_owned(), api.clone());
    Ok(api)
}

async fn drive(
    node: String,
    shared_api: Api<NodeUpdatePlan>,
    writer: Writer,
    shared: Arc<Mutex<Shared>>,
    config: Arc<SimConfig>,
    stats: Arc<FleetStats>,
) {
    loop {
        let step = {
            let mut s = lock(&shared);
            let local = s
                .local
                .get(&node)
                .cloned()
                .unwrap_or_else(|| Local::new(&config));
            let step = s.seen.get(&node).and_then(|seen| {
                next_step(&local, seen, &config, &node).map(|st| (st, seen.clone()))
            });
            if step.is_none() {
                s.running.remove(&node);
            }
            step.map(|(step, seen)| {
                let staged = step.1.phase == Some(Phase::Staged) && local.phase != step.1.phase;
                (step, seen, staged, local.phase)
            })
        };
        let Some(((delay, next), seen, staged, was)) = step else {
            return;
        };
        match &config.download_from {
            Some(url) if staged => {
                let (took, failed) = download::download(url).await;
                let ended = std::time::Instant::now();
                lock(&stats.downloads).push(Download { ended, took });
                stats.failed_downloads.fetch_add(failed, Ordering::Relaxed);
            }
            _ if !delay.is_zero() => tokio::time::sleep(delay).await,
            _ => {}
        }
        let phase = next.phase.unwrap_or(Phase::Pending);
        stats.leaving(&node, was, phase);
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let status = status_patch(&next, &seen, &config, &node, &now);
        let mut written = false;
        // Retried for two minutes (an outage, a kube-apiserver restarting on a loaded
        // machine): only a deleted plan ends the agent.
        let give_up = tokio::time::Instant::now() + Duration::from_secs(120);
        while tokio::time::Instant::now() < give_up {
            let api = match status_api(&node, &shared_api, &writer, &shared).await {
                Ok(api) => api,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            match api
                .patch_status(&node, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                Ok(_) => {
                    written = true;
                    break;
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        stats.status_writes.fetch_add(1, Ordering::Relaxed);
        if !written {
            // The plan is gone (its node was deleted): this agent stops.
            let mut s = lock(&shared);
            s.running.remove(&node);
            s.local.remove(&node);
            stats.gone(&node, was, phase);
            return;
        }
        // Only this task writes the node's local state: it was `was` until now.
        lock(&shared).local.insert(node.clone(), next);
        stats.written(&node, was, phase);
    }
}

/// Locks, ignoring poisoning (a panicked test has already failed).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
