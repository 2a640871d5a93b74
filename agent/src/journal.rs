//! The local journal: what this node has committed, what it was before, and which step of
//! which revision is in flight. The only state the agent trusts after a crash, together
//! with what it reads back from the host. Written atomically (see `links.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use inplace_proto::{Reason, UpdateContent};
use serde::{Deserialize, Serialize};

use crate::links::Prior;
use crate::self_update::resume::Switch;

/// Failed revisions remembered (the oldest are forgotten first).
const MAX_FAILED: usize = 16;

/// One managed path and what it points at for a revision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    /// The path on the node (`/etc/extensions/kubernetes.raw`, `/opt/bin/kubectl`).
    pub path: PathBuf,
    /// The stored, verified file it points at.
    pub target: PathBuf,
    /// The sha256 of that file, re-checked before activation.
    pub sha256: String,
}

/// A revision installed on this node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Installed {
    /// The revision hash.
    revision: String,
    /// Its content (what to restart and check when going back to it).
    content: UpdateContent,
    /// Its links.
    links: Vec<Link>,
    /// When it was committed.
    committed_at: DateTime<Utc>,
}

impl Installed {
    /// The revision hash.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// Its content (what to restart and check when going back to it).
    pub fn content(&self) -> &UpdateContent {
        &self.content
    }

    /// Its links.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// When it was committed.
    pub fn committed_at(&self) -> DateTime<Utc> {
        self.committed_at
    }
}

/// The step of the in-flight revision. Persisted *before* the step's first side effect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Downloading and staging; nothing that runs is touched.
    Staging,
    /// Every artifact verified and stored; nothing that runs is touched.
    Staged,
    /// Links are being swapped and units restarted; `before` holds what to restore.
    Activating,
    /// The new links are in place; health checks are running.
    Verifying,
    /// Going back: `before` is being restored.
    RollingBack,
    /// The agent is switching to another build of itself (`spec.agent`); `switch` says
    /// from which image to which (docs/design/agent-self-update.md). Journaled before the
    /// guard is armed.
    SwitchingAgent,
    /// A revision activated by a reboot: its links are swapped and the reboot is asked
    /// for (`reboot` names the boot it was asked from); it takes effect at the next boot.
    Rebooting,
    /// Rolling back a revision the node booted into: the prior links are restored and the
    /// reboot into them is asked for (`reboot` names the boot it was asked from).
    RebootingBack,
}

/// The reboot a step asked for, by the boot it was asked from: a restart in the same boot
/// has yet to see it, a restart in another boot runs what it brought.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Reboot {
    /// `/proc/sys/kernel/random/boot_id` of the boot that asked for it.
    pub from_boot: String,
}

impl Reboot {
    /// Whether the node has booted since (`now` is this boot's ID; unknown counts as
    /// booted: the checks after the boot still decide, and a reboot loop is worse).
    pub fn happened(&self, now: Option<&str>) -> bool {
        now != Some(self.from_boot.as_str())
    }
}

/// Why a revision failed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// The condition reason.
    pub reason: Reason,
    /// The message, naming the artifact, unit or check.
    pub message: String,
}

/// A managed path and what it held before activation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Before {
    /// The path.
    pub path: PathBuf,
    /// What it held.
    pub prior: Prior,
}

/// What activation removes: the links of the committed revision that `next` no longer has
/// and that still point where the agent put them (`ours` reads that from the host). A path
/// someone changed since is left alone. Each comes with its prior, to be recorded in
/// [`InFlight::before`] with the rest, so a rollback puts it back like any replaced link.
pub fn retired(committed: &[Link], next: &[Link], ours: impl Fn(&Link) -> bool) -> Vec<Before> {
    committed
        .iter()
        .filter(|link| next.iter().all(|n| n.path != link.path) && ours(link))
        .map(|link| Before {
            path: link.path.clone(),
            prior: Prior::Symlink {
                target: link.target.clone(),
            },
        })
        .collect()
}

/// The revision being worked on. Changed only by the [`Journal`]'s transitions.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    /// The revision hash.
    revision: String,
    /// The plan generation that asked for it.
    generation: Option<i64>,
    /// Its content.
    content: UpdateContent,
    /// Where it stands.
    step: Step,
    /// Its links, known once staged.
    #[serde(default)]
    links: Vec<Link>,
    /// What each managed path held before activation (recorded before the first swap):
    /// the revision's own paths, and the committed revision's links it drops (see
    /// [`retired`]), which activation removes and a rollback puts back.
    #[serde(default)]
    before: Vec<Before>,
    /// Why it is being rolled back (set with `Step::RollingBack`).
    #[serde(default)]
    failure: Option<Failure>,
    /// When work on it started.
    started_at: DateTime<Utc>,
    /// The agent switch (set with `Step::SwitchingAgent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    switch: Option<Switch>,
    /// The reboot asked for (set with `Step::Rebooting`, kept while the node verifies the
    /// boot and rolls it back: a rollback then needs a reboot too; set again with
    /// `Step::RebootingBack`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reboot: Option<Reboot>,
}

impl InFlight {
    /// The revision hash.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The plan generation that asked for it.
    pub fn generation(&self) -> Option<i64> {
        self.generation
    }

    /// Its content.
    pub fn content(&self) -> &UpdateContent {
        &self.content
    }

    /// Where it stands.
    pub fn step(&self) -> Step {
        self.step
    }

    /// Its links (empty until staged).
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// What each managed path held before activation (empty until activating).
    pub fn before(&self) -> &[Before] {
        &self.before
    }

    /// Why it is being rolled back; `None` when the plan moved on (or not rolling back).
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// When work on it started.
    pub fn started_at(&self) -> DateTime<Utc> {
        self.started_at
    }

    /// The agent switch, when this revision is one.
    pub fn switch(&self) -> Option<&Switch> {
        self.switch.as_ref()
    }

    /// The reboot asked for, when the revision is activated (or rolled back) by one.
    pub fn reboot(&self) -> Option<&Reboot> {
        self.reboot.as_ref()
    }

    /// The paths activation removes: recorded in `before` but not linked by this revision
    /// (see [`retired`]). Derived from the journal, so a resumed activation removes the same.
    pub fn removals(&self) -> Vec<PathBuf> {
        self.before
            .iter()
            .filter(|b| self.links.iter().all(|l| l.path != b.path))
            .map(|b| b.path.clone())
            .collect()
    }
}

/// A revision that failed here and is not retried automatically.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FailedRevision {
    /// The revision hash.
    revision: String,
    /// Why.
    failure: Failure,
    /// When.
    at: DateTime<Utc>,
    /// Whether it had been activated and was rolled back (then the status keeps saying
    /// `RolledBack` for it, also after a restart); false for a staging failure.
    #[serde(default)]
    rolled_back: bool,
}

impl FailedRevision {
    /// The revision hash.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// Why it failed.
    pub fn failure(&self) -> &Failure {
        &self.failure
    }

    /// When it failed.
    pub fn at(&self) -> DateTime<Utc> {
        self.at
    }

    /// Whether it had been activated and was rolled back (false for a staging failure).
    pub fn rolled_back(&self) -> bool {
        self.rolled_back
    }
}

/// Everything the agent remembers across restarts.
///
/// The fields are private: the in-flight step only moves through the named transitions
/// below, each of which checks the step it starts from, so an impossible sequence is a
/// [`TransitionError`] here rather than a silently inconsistent journal on disk.
///
/// | transition | from | to |
/// |---|---|---|
/// | [`begin_staging`](Self::begin_staging) | nothing in flight | `Staging` |
/// | [`staged`](Self::staged) | `Staging`, `Staged` | `Staged` |
/// | [`abandon_staging`](Self::abandon_staging) | `Staging`, `Staged` | nothing in flight |
/// | [`deny`](Self::deny) | `Staging`, `Staged` | nothing in flight, revision denied |
/// | [`count_attempt`](Self::count_attempt) | `Staged`, `Activating`, `Verifying` | (same step, attempts + 1) |
/// | [`activating`](Self::activating) | `Staged` | `Activating` (priors recorded) |
/// | [`resume_activating`](Self::resume_activating) | `Activating`, `Verifying` | `Activating` |
/// | [`verifying`](Self::verifying) | `Activating` | `Verifying` |
/// | [`commit`](Self::commit) | `Verifying` | nothing in flight, committed |
/// | [`rolling_back`](Self::rolling_back) | `Activating`, `Verifying`, `RollingBack` | `RollingBack` |
/// | [`rolled_back`](Self::rolled_back) | `RollingBack`, `RebootingBack` | nothing in flight, denied if it failed |
/// | [`rollback_failed`](Self::rollback_failed) | `RollingBack`, `RebootingBack` | nothing in flight, denied if it failed, degraded |
/// | [`begin_switch`](Self::begin_switch) | `Staged` | `SwitchingAgent` |
/// | [`restart_switch`](Self::restart_switch) | `SwitchingAgent` | `SwitchingAgent` (next attempt) |
/// | [`confirm_switch`](Self::confirm_switch) | `SwitchingAgent` | nothing in flight, `agent` recorded (`committed` untouched) |
/// | [`switch_failed`](Self::switch_failed) | `SwitchingAgent` | nothing in flight, revision denied as rolled back |
/// | [`rebooting`](Self::rebooting) | `Activating` | `Rebooting` (the boot it is asked from) |
/// | [`rebooted`](Self::rebooted) | `Rebooting` | `Verifying` (the reboot kept) |
/// | [`reboot_refused`](Self::reboot_refused) | `Rebooting` | `RollingBack` (the reboot forgotten) |
/// | [`rebooting_back`](Self::rebooting_back) | `RollingBack` | `RebootingBack` (the boot it is asked from) |
/// | [`honour_retry`](Self::honour_retry) | any | (same step, the revision no longer denied) |
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    /// The committed revision: what the node runs.
    committed: Option<Installed>,
    /// The one before it, kept on disk as the rollback target.
    previous: Option<Installed>,
    /// The revision being staged, activated or rolled back.
    in_flight: Option<InFlight>,
    /// Activation attempts per revision (restarts in the middle count).
    #[serde(default)]
    attempts: BTreeMap<String, u32>,
    /// Revisions that failed and are denied until the node commits another one.
    #[serde(default)]
    failed: Vec<FailedRevision>,
    /// Set when a rollback failed: the node needs a person; nothing more is done.
    #[serde(default)]
    degraded: Option<Failure>,
    /// The agent build the last confirmed switch installed. Apart from `committed`: an
    /// agent update has no links, and the next release must still be diffed against (and
    /// roll back to) the node's content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent: Option<AgentInstalled>,
    /// The last retry token (`inplace.dev/retry`) honoured: kept with the denylist it
    /// changed, so a token is honoured once across restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_honoured: Option<String>,
}

/// A transition the journal refused: the step in flight (or none) does not lead there.
/// Always a bug in the caller; the journal is left as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("journal: `{transition}` is impossible from {}", from.map_or_else(|| "nothing in flight".to_owned(), |s| format!("step {s:?}")))]
pub struct TransitionError {
    /// The transition asked for.
    pub transition: &'static str,
    /// The step in flight then (`None`: nothing in flight).
    pub from: Option<Step>,
}

impl Journal {
    /// The committed revision: what the node runs.
    pub fn committed(&self) -> Option<&Installed> {
        self.committed.as_ref()
    }

    /// The revision before the committed one, kept on disk as the rollback target.
    pub fn previous(&self) -> Option<&Installed> {
        self.previous.as_ref()
    }

    /// The revision being staged, activated or rolled back.
    pub fn in_flight(&self) -> Option<&InFlight> {
        self.in_flight.as_ref()
    }

    /// The step in flight, if any.
    pub fn step(&self) -> Option<Step> {
        self.in_flight.as_ref().map(|f| f.step)
    }

    /// Activation attempts of `revision` so far (kept for the committed revision).
    pub fn attempts(&self, revision: &str) -> Option<u32> {
        self.attempts.get(revision).copied()
    }

    /// The denied revisions, oldest first.
    pub fn failed(&self) -> &[FailedRevision] {
        &self.failed
    }

    /// Why the node is degraded (a rollback failed), if it is.
    pub fn degraded(&self) -> Option<&Failure> {
        self.degraded.as_ref()
    }

    /// The agent build the last confirmed switch installed.
    pub fn agent(&self) -> Option<&AgentInstalled> {
        self.agent.as_ref()
    }

    /// The last retry token honoured ([`Self::honour_retry`]).
    pub fn retry_honoured(&self) -> Option<&str> {
        self.retry_honoured.as_deref()
    }

    /// Whether `revision` failed here before.
    pub fn failure_of(&self, revision: &str) -> Option<&FailedRevision> {
        self.failed.iter().find(|f| f.revision == revision)
    }

    /// The revision the node runs, if any.
    pub fn current_revision(&self) -> Option<&str> {
        self.committed.as_ref().map(|c| c.revision.as_str())
    }
}

mod file;
mod reboot;
mod switch;
mod transitions;

pub use file::{JournalError, JournalFile};
pub use switch::AgentInstalled;

#[cfg(test)]
pub(crate) mod tests;
