//! Waiting for a node's plan: the one loop every suite uses to wait until a plan's status
//! says what the test expects. The status is read again until the check is done, wrong or
//! out of time; a read that fails (an API outage the test makes, a restarting server) is
//! read again, so the wait outlasts what the test does to the API.

use std::time::Duration;

use inplace_proto::{NodeUpdatePlan, NodeUpdatePlanStatus, Phase};
use kube::Api;

/// How often the status is read.
const EVERY: Duration = Duration::from_millis(100);

/// What a check makes of one reading of the status.
pub enum Seen<T> {
    /// What the test waited for.
    Done(T),
    /// Not yet.
    Wait,
    /// Something that must never be seen (for example `Succeeded` for an unhealthy
    /// revision): stop waiting at once, saying what.
    Wrong(String),
}

/// Why a wait ended without its status.
#[derive(Debug)]
pub enum Unmet {
    /// Out of time; the last status read, if any.
    TimedOut(Option<Box<NodeUpdatePlanStatus>>),
    /// The check saw something wrong.
    Wrong(String),
}

impl std::fmt::Display for Unmet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unmet::TimedOut(last) => write!(f, "timed out; status now: {last:?}"),
            Unmet::Wrong(what) => f.write_str(what),
        }
    }
}

/// Reads `name`'s plan status until `check` is done or wrong, or `timeout` passes.
pub async fn wait_status<T>(
    plans: &Api<NodeUpdatePlan>,
    name: &str,
    timeout: Duration,
    mut check: impl FnMut(&NodeUpdatePlanStatus) -> Seen<T>,
) -> Result<T, Unmet> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = None;
    loop {
        if let Some(status) = plans.get(name).await.ok().and_then(|p| p.status) {
            match check(&status) {
                Seen::Done(value) => return Ok(value),
                Seen::Wrong(what) => return Err(Unmet::Wrong(what)),
                Seen::Wait => {}
            }
            last = Some(Box::new(status));
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Unmet::TimedOut(last));
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Whether `status` reports `phase` for `revision`.
pub fn reports(status: &NodeUpdatePlanStatus, phase: Phase, revision: &str) -> bool {
    status.phase == Some(phase) && status.target_revision.as_deref() == Some(revision)
}

/// Reads `name`'s plan status until it reports `phase` for `revision`, and returns it.
pub async fn wait_phase(
    plans: &Api<NodeUpdatePlan>,
    name: &str,
    phase: Phase,
    revision: &str,
    timeout: Duration,
) -> Result<NodeUpdatePlanStatus, Unmet> {
    wait_status(plans, name, timeout, |status| {
        if reports(status, phase, revision) {
            Seen::Done(status.clone())
        } else {
            Seen::Wait
        }
    })
    .await
}
