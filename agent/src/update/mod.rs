//! The coordinator: carries out what [`machine::decide`] chooses, one atomic step at a
//! time, persisting the journal before each step's first side effect and reporting every
//! step into the plan's status.
//!
//! The invariant after any crash: the node runs the committed revision or the new verified
//! one; links only ever point at complete, verified files; the previous revision stays on
//! disk until the new one is committed.
//!
//! One file per stage: `staging.rs` (download, verify, store; a denial before anything
//! that runs is touched), `activation.rs` (activate, verify, commit, roll back), `swap.rs`
//! (the primitives those use: switch the links, refresh sysext and units, restore the
//! priors, detect drift), `agent_switch.rs` (an agent update: the old agent's switch, the
//! new one's confirmation, the guard's rollback reported), `collect.rs` (files no kept
//! revision references), `report.rs` (what
//! the agent says: report texts, the status as a pure function of journal, plan and what
//! was observed, and its publishing). The journal moves
//! only through its named transitions ([`crate::journal::Journal`]).

mod activation;
mod agent_switch;
mod collect;
mod reboot;
mod report;
mod staging;
mod swap;

use std::sync::{Arc, Mutex};

use inplace_proto::NodeUpdatePlan;

use crate::fetch::Fetcher;
use crate::health::Probes;
use crate::journal::{Failure, Journal, JournalError, JournalFile, Step, TransitionError};
use crate::machine::{self, Action, NodeFacts, PlanView, RollbackCause};
use crate::metrics::AgentMetrics;
use crate::power::Power;
use crate::self_update::admission::{Admission, Installation};
use crate::self_update::host::RunningAgent;
use crate::settings::Settings;
use crate::status::StatusSink;
use crate::systemd::SystemdManager;
use report::{Report, Shown};
use staging::Staging;

/// Errors that stop the agent (the journal cannot be written: acting on would break the
/// crash-safety promise). Step failures are not errors: they are reported and rolled back.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The journal could not be read or written.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The journal refused a step transition: a bug in the coordinator. Stopping leaves
    /// the journal on disk as it was, consistent.
    #[error(transparent)]
    Transition(#[from] TransitionError),
}

/// The edges the coordinator talks to.
#[derive(Clone)]
pub struct Host {
    /// PID 1.
    pub systemd: Arc<dyn SystemdManager>,
    /// Downloads.
    pub fetcher: Arc<dyn Fetcher>,
    /// HTTP and kubelet-version checks.
    pub probes: Arc<dyn Probes>,
    /// The plan's status.
    pub status: Arc<dyn StatusSink>,
    /// Human-readable "what am I doing" (sd_notify `STATUS=`).
    pub notify: Arc<dyn Fn(&str) + Send + Sync>,
    /// This agent's build version and binary (an agent switch needs both).
    pub running: RunningAgent,
    /// logind (reboots, inhibitors) and this boot's ID.
    pub power: Arc<dyn Power>,
}

/// The agent's coordinator.
pub struct Agent {
    settings: Settings,
    host: Host,
    journal_file: JournalFile,
    journal: Journal,
    boot_id: Option<String>,
    /// What the status shows about the plan being handled.
    shown: Mutex<Shown>,
    /// The plan channel, when following one (lets a long staging notice a new plan).
    plans: Option<tokio::sync::watch::Receiver<crate::watch::PlanState>>,
    /// What the metrics endpoint shows.
    metrics: Arc<AgentMetrics>,
    /// Whether plans may replace this agent, read once at start.
    self_update: Admission,
}

impl Agent {
    /// Loads the journal. An unreadable journal is moved aside and the node marked
    /// degraded: without it the agent cannot know what to restore.
    pub async fn open(settings: Settings, host: Host) -> Result<Agent, AgentError> {
        let state_dir = settings.state_dir.clone();
        if let Err(e) = blocking(move || crate::store::restrict_state(&state_dir)).await {
            tracing::warn!(error = %e, "cannot restrict the state directory's modes");
        }
        let journal_file = JournalFile::new(&settings.state_dir);
        let journal = match journal_file.load().await {
            Ok(journal) => journal,
            Err(e @ JournalError::Corrupt { .. }) => {
                tracing::error!(error = %e, "journal unreadable; marking the node degraded");
                let mut journal = Journal::default();
                journal.mark_degraded(Failure {
                    reason: inplace_proto::Reason::RollbackFailed,
                    message: format!("{e}; a person must check this node"),
                });
                journal_file.save(&journal).await?;
                journal
            }
            Err(e) => return Err(e.into()),
        };
        let self_update = Admission {
            settings: settings.self_update.clone(),
            installation: Installation::detect(&settings.paths.extensions_dir),
            running_version: host.running.version.clone(),
            // Looked at with each plan that carries spec.agent (`look_at_guard`).
            guard_missing: None,
        };
        let boot_id = host.power.boot_id();
        let agent = Agent {
            settings,
            host,
            journal_file,
            journal,
            boot_id,
            shown: Mutex::new(Shown::default()),
            plans: None,
            metrics: Arc::default(),
            self_update,
        };
        agent.record_running();
        Ok(agent)
    }

    /// The agent's metrics, for the metrics endpoint.
    pub fn metrics(&self) -> Arc<AgentMetrics> {
        self.metrics.clone()
    }

    /// Follows the plan channel fed by `watch::run`: acts on every new plan state, until
    /// the channel closes. Before the first complete list nothing is done, except that an
    /// interrupted rollback (or rollback by reboot) is finished (it does not depend on the
    /// plan).
    pub async fn follow(
        &mut self,
        mut plans: tokio::sync::watch::Receiver<crate::watch::PlanState>,
    ) -> Result<(), AgentError> {
        self.plans = Some(plans.clone());
        if matches!(
            self.journal.step(),
            Some(Step::RollingBack | Step::RebootingBack)
        ) {
            self.handle(None).await?;
        }
        loop {
            let state = plans.borrow_and_update().clone();
            if let Some(plan) = state {
                self.handle(plan.as_ref()).await?;
            }
            if plans.changed().await.is_err() {
                return Ok(());
            }
        }
    }

    /// The journal as it is now (for tests and diagnostics).
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Acts on the plan (or its absence) until the node is at a stable point: the plan's
    /// revision committed, staged, refused, or rolled back.
    pub async fn handle(&mut self, plan: Option<&NodeUpdatePlan>) -> Result<(), AgentError> {
        use tracing::Instrument;
        let plan = plan.filter(|p| p.metadata.name.as_deref() == Some(&self.settings.node_name));
        if plan.is_some_and(|p| p.spec.content.agent.is_some()) {
            self.look_at_guard().await;
        }
        let facts = match plan {
            Some(plan) => self.node_facts(plan).await,
            None => NodeFacts::default(),
        };
        let view = plan.map(|p| PlanView::new(p, &self.settings, &self.self_update, &facts));
        // Every log line of this pass carries the plan's revision and generation (journald
        // fields REVISION, GENERATION).
        let span = tracing::info_span!(
            "plan",
            revision = view.as_ref().map_or("", |v| v.revision.as_str()),
            generation = view.as_ref().and_then(|v| v.generation),
        );
        self.handle_view(view).instrument(span).await
    }

    /// What `plan` needs read from the node: systemd-sysupdate's transfers (at every plan,
    /// so that removing a conflicting one needs no restart), and PID 1's version when the
    /// plan has a configuration extension.
    async fn node_facts(&self, plan: &NodeUpdatePlan) -> NodeFacts {
        let root = self.settings.paths.merged_root.clone();
        let transfers = blocking(move || Ok(crate::sysupdate::transfers(&root)))
            .await
            .unwrap_or_default();
        let systemd_version = if plan.spec.content.has_confext() {
            Some(self.host.systemd.version().await.map_err(|e| e.to_string()))
        } else {
            None
        };
        NodeFacts {
            transfers,
            systemd_version,
        }
    }

    async fn handle_view(&mut self, view: Option<PlanView>) -> Result<(), AgentError> {
        self.show_plan(view.as_ref());
        self.honour_retry(view.as_ref()).await?;
        loop {
            if machine::staging_is_stale(view.as_ref(), &self.journal) {
                self.abandon_staging().await?;
            }
            let action = machine::decide(
                view.as_ref(),
                &self.journal,
                self.settings.activation.max_attempts,
            );
            tracing::info!(action = action_name(&action), "decided");
            if !self.act(view.as_ref(), action).await? {
                return Ok(());
            }
        }
    }

    /// Reads whether the guard covers this node, for a plan that may switch the agent: its
    /// path unit must be active (installed and enabled, not failed). Only where a switch
    /// could be admitted at all (allowed, installed as the system extension); one D-Bus call
    /// per such plan view.
    async fn look_at_guard(&mut self) {
        let admission = &self.self_update;
        if !admission.settings.allow || admission.installation != Installation::Sysext {
            return;
        }
        let unit = crate::self_update::GUARD_PATH_UNIT;
        self.self_update.guard_missing = match self.host.systemd.unit_state(unit).await {
            Ok(state) if state.active_state == "active" => None,
            Ok(state) => Some(format!(
                "{unit} is {} ({})",
                state.active_state, state.sub_state
            )),
            Err(e) => Some(format!("the state of {unit} could not be read: {e}")),
        };
    }

    /// Honours the plan's retry token once ([`machine::retry_to_honour`]): the revision's
    /// failure is forgotten and the token kept, in one journal write, before deciding; the
    /// next report carries `status.retryHonoured` with the new attempt's phase.
    async fn honour_retry(&mut self, view: Option<&PlanView>) -> Result<(), AgentError> {
        let (Some(view), Some(token)) = (view, machine::retry_to_honour(view, &self.journal))
        else {
            return Ok(());
        };
        let forgotten = self.journal.honour_retry(token, &view.revision);
        self.save().await?;
        tracing::info!(
            token,
            forgotten = forgotten.is_some(),
            "retry honoured: the revision may be staged again"
        );
        Ok(())
    }

    /// Carries out one action. True when the plan must be decided on again at once (a
    /// superseded rollback: the node acts on the new plan).
    async fn act(&mut self, view: Option<&PlanView>, action: Action) -> Result<bool, AgentError> {
        match action {
            Action::Idle => {}
            Action::StayDegraded(failure) => self.report(view, Report::degraded_node(failure)),
            Action::UpToDate => {
                let revision = view.map(|v| v.revision.as_str()).unwrap_or_default();
                // Report only: re-applying could fight whoever changed the host; a new
                // plan revision (or putting the link back) ends it.
                let drift = self.drift();
                if let Some(drift) = &drift {
                    tracing::warn!(message = %drift, "host drifted from the committed revision");
                }
                let content = view.map(|v| &v.content);
                self.report(view, Report::up_to_date(revision, content, drift));
            }
            Action::Refuse(problems) => self.report(view, Report::refused(&problems)),
            // A rolled-back revision keeps saying so, also after a restart that finished
            // an interrupted rollback without a plan to report to.
            Action::Deny(failed) => self.report(view, Report::denied(&failed)),
            Action::Stage { activate } => {
                let Some(view) = view else {
                    return Ok(false);
                };
                match self.stage(view).await? {
                    Staging::Done if activate && view.content.agent.is_some() => {
                        self.switch_agent(view).await?;
                    }
                    Staging::Done if activate => self.activate(view).await?,
                    Staging::Done => self.report(Some(view), Report::staged(&view.revision)),
                    // Reported already; or the caller acts on the new plan (and abandons
                    // this staging).
                    Staging::Failed | Staging::Superseded => {}
                }
            }
            Action::ResumeActivation => {
                if let Some(view) = view {
                    self.activate(view).await?;
                }
            }
            Action::ResumeSwitch => {
                let switching = self.journal.in_flight().map(|f| f.revision().to_owned());
                self.resume_switch(view).await?;
                // A switch that ended while the plan asks for another revision: act on it.
                let ended = self.journal.in_flight().is_none();
                return Ok(ended && view.is_some_and(|v| Some(&v.revision) != switching.as_ref()));
            }
            Action::ResumeReboot => return self.resume_reboot(view).await,
            Action::RollBack(cause) => {
                let superseded = cause == RollbackCause::Superseded;
                self.roll_back(view, cause).await?;
                // Not while a reboot back is pending: the next boot ends the rollback.
                return Ok(superseded && self.journal.in_flight().is_none());
            }
        }
        Ok(false)
    }

    /// A crash-injection point (inert without the `failpoints` feature).
    fn failpoint(&self, name: &str) {
        crate::failpoints::hit(&self.settings.paths.lock_file, name);
    }

    async fn save(&self) -> Result<(), AgentError> {
        Ok(self.journal_file.save(&self.journal).await?)
    }
}

fn action_name(action: &Action) -> &'static str {
    match action {
        Action::Idle => "Idle",
        Action::StayDegraded(_) => "StayDegraded",
        Action::UpToDate => "UpToDate",
        Action::Refuse(_) => "Refuse",
        Action::Deny(_) => "Deny",
        Action::Stage { activate: false } => "Stage",
        Action::Stage { activate: true } => "StageAndActivate",
        Action::ResumeActivation => "ResumeActivation",
        Action::RollBack(_) => "RollBack",
        Action::ResumeSwitch => "ResumeSwitch",
        Action::ResumeReboot => "ResumeReboot",
    }
}

/// Runs blocking file work on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}
