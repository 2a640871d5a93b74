//! The agent's status protocol, reduced to its phases: what a simulated agent writes next
//! for a plan, and after how long. Both drivers ([`super::Fleet`], on timers, and
//! [`super::Stepper`], one phase per call) take every step from here.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use inplace_proto::{DesiredState, NodeUpdatePlan, Phase};
use serde_json::{Value, json};

/// How a simulated node fails after activation.
#[derive(Debug, Clone)]
pub struct Failure {
    /// `RolledBack` or `Failed`.
    pub phase: Phase,
    /// The `Ready` condition's reason.
    pub reason: String,
    /// The `Ready` condition's message.
    pub message: String,
}

impl Failure {
    /// A rollback for `reason`, with a message that says it was simulated.
    pub fn rolled_back(reason: &str) -> Failure {
        Failure {
            phase: Phase::RolledBack,
            reason: reason.to_owned(),
            message: format!("simulated {reason}"),
        }
    }
}

/// Timings and failures of the simulated agents.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Time from seeing a new revision to `Staged`.
    pub download: Duration,
    /// Time in `Activating`.
    pub activate: Duration,
    /// Time in `Verifying` before the final phase.
    pub verify: Duration,
    /// Per-node overrides of `activate + verify`.
    pub slow: HashMap<String, Duration>,
    /// Nodes that fail after activation, and how.
    pub failures: HashMap<String, Failure>,
    /// Report `Downloading` and `Verifying` too (the full protocol); off for scale runs.
    pub every_phase: bool,
    /// Failing nodes that succeed once a retry was honoured.
    pub fixed_by_retry: HashSet<String>,
    /// The revision a node runs before its first plan, if the status should name one.
    pub running_before: Option<String>,
    /// When set, staging downloads the bytes at this `http://` URL (each node its own
    /// connection, the body read and dropped) instead of waiting `download`: the fan-out
    /// as an artifact server sees it.
    pub download_from: Option<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            download: Duration::from_millis(50),
            activate: Duration::from_millis(150),
            verify: Duration::from_millis(150),
            slow: HashMap::new(),
            failures: HashMap::new(),
            every_phase: true,
            fixed_by_retry: HashSet::new(),
            running_before: None,
            download_from: None,
        }
    }
}

/// What the agent knows of its node: what its plan's status says.
#[derive(Debug, Clone, Default)]
pub(super) struct Local {
    pub target: Option<String>,
    pub current: Option<String>,
    pub phase: Option<Phase>,
    /// The last retry token honoured.
    pub retry_honoured: Option<String>,
}

impl Local {
    /// What a node knows before its agent wrote anything.
    pub fn new(config: &SimConfig) -> Local {
        Local {
            current: config.running_before.clone(),
            ..Local::default()
        }
    }

    /// What the agent wrote last, read back from the plan's status (or `new` without one).
    pub fn of(plan: &NodeUpdatePlan, config: &SimConfig) -> Local {
        let Some(status) = plan.status.as_ref().filter(|s| s.phase.is_some()) else {
            return Local::new(config);
        };
        Local {
            target: status.target_revision.clone(),
            current: status.current_revision.clone(),
            phase: status.phase,
            retry_honoured: status.retry_honoured.clone(),
        }
    }
}

/// What the agent reads of its plan's spec.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub revision: Option<String>,
    pub desired: DesiredState,
    pub generation: Option<i64>,
    /// The plan's retry token.
    pub retry: Option<String>,
    /// The first artifact's name and size, whose download the status shows.
    pub artifact: Option<(String, u64)>,
}

impl Seen {
    pub fn of(plan: &NodeUpdatePlan) -> Seen {
        Seen {
            revision: plan.spec.revision.clone(),
            desired: plan.spec.desired_state,
            generation: plan.metadata.generation,
            retry: inplace_proto::steering::pending_retry(plan.metadata.annotations.as_ref(), None)
                .map(str::to_owned),
            artifact: plan
                .spec
                .content
                .artifacts
                .first()
                .map(|a| (a.name.clone(), a.size.unwrap_or(100))),
        }
    }
}

/// The next step of one node (how long it takes, and what the agent knows after it), or
/// `None` when it waits for the plan to change.
pub(super) fn next_step(
    local: &Local,
    seen: &Seen,
    config: &SimConfig,
    node: &str,
) -> Option<(Duration, Local)> {
    let revision = seen.revision.clone()?;
    let mut next = local.clone();
    if local.target.as_ref() != Some(&revision) {
        next.target = Some(revision);
        next.phase = Some(if config.every_phase {
            Phase::Downloading
        } else {
            Phase::Staged
        });
        let delay = if config.every_phase {
            Duration::ZERO
        } else {
            config.download
        };
        return Some((delay, next));
    }
    if seen.desired == DesiredState::Staged
        && seen.retry.is_some()
        && seen.retry != local.retry_honoured
    {
        next.retry_honoured = seen.retry.clone();
        next.phase = Some(Phase::Downloading);
        return Some((Duration::ZERO, next));
    }
    let (activate, verify) = match config.slow.get(node) {
        Some(total) => (*total / 2, *total / 2),
        None => (config.activate, config.verify),
    };
    let finish = |mut next: Local| {
        next.phase = Some(final_phase(config, node, local));
        if next.phase == Some(Phase::Succeeded) {
            next.current = next.target.clone();
        }
        next
    };
    match local.phase? {
        Phase::Downloading => {
            next.phase = Some(Phase::Staged);
            Some((config.download, next))
        }
        Phase::Staged if seen.desired == DesiredState::Active => {
            next.phase = Some(Phase::Activating);
            Some((Duration::ZERO, next))
        }
        Phase::Activating if config.every_phase => {
            next.phase = Some(Phase::Verifying);
            Some((activate, next))
        }
        Phase::Activating => Some((activate + verify, finish(next))),
        Phase::Verifying => Some((verify, finish(next))),
        _ => None,
    }
}

fn final_phase(config: &SimConfig, node: &str, local: &Local) -> Phase {
    if local.retry_honoured.is_some() && config.fixed_by_retry.contains(node) {
        return Phase::Succeeded;
    }
    config
        .failures
        .get(node)
        .map_or(Phase::Succeeded, |f| f.phase)
}

/// The status patch that reports `next`, as the agent words it: half the first artifact's
/// bytes while downloading (all of them after), the unit being restarted and checked, and the failure's reason.
pub(super) fn status_patch(
    next: &Local,
    seen: &Seen,
    config: &SimConfig,
    node: &str,
    now: &str,
) -> Value {
    let phase = next.phase.unwrap_or(Phase::Pending);
    let (ready, reason, message) = match phase {
        Phase::Succeeded => (
            "True",
            "Succeeded".to_owned(),
            "runs the target revision".into(),
        ),
        Phase::RolledBack | Phase::Failed => {
            let failure = config.failures.get(node);
            let reason = failure.map_or("RolledBack".into(), |f| f.reason.clone());
            let message = failure.map_or(format!("simulated {reason}"), |f| f.message.clone());
            ("False", reason, message)
        }
        Phase::Downloading => (
            "False",
            "Downloading".into(),
            format!(
                "downloading {}",
                seen.artifact.as_ref().map_or("artifacts", |(name, _)| name)
            ),
        ),
        Phase::Staged => ("False", "Staged".into(), "every artifact staged".into()),
        Phase::Activating => (
            "False",
            "Activating".into(),
            "restarting kubelet.service".into(),
        ),
        Phase::Verifying => (
            "False",
            "Verifying".into(),
            "kubelet.service 12s/30s".into(),
        ),
        other => ("False", format!("{other:?}"), format!("{other:?}")),
    };
    let mut status = json!({
        "observedGeneration": seen.generation,
        "phase": phase,
        "targetRevision": next.target,
        "currentRevision": next.current,
        "retryHonoured": next.retry_honoured,
        "conditions": [{
            "type": "Ready", "status": ready, "reason": reason, "message": message,
            "lastTransitionTime": now,
        }],
    });
    if let Some((name, size)) = &seen.artifact {
        let done = if phase == Phase::Downloading {
            size / 2
        } else {
            *size
        };
        status["artifacts"] = json!([{"name": name, "bytesDone": done, "bytesTotal": size}]);
    }
    json!({ "status": status })
}
