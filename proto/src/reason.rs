//! The closed set of condition types and reasons that inplace writes.
//!
//! Every reason is stable: it is what people grep for, what alerts match and what the
//! metrics label failures with. `docs/usage/troubleshooting.md` explains each one.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Condition types on a NodeUpdatePlan.
pub mod plan_condition {
    /// True when the node runs the plan's target revision, committed and healthy (or, for
    /// `desiredState: Staged`, when the target is staged and ready to activate).
    pub const READY: &str = "Ready";
    /// True when the node needs a person: a rollback failed or the node drifted.
    pub const DEGRADED: &str = "Degraded";
}

/// Condition types on a NodeRelease.
pub mod release_condition {
    /// True when the release passed validation; its reason says why not otherwise.
    pub const VALID: &str = "Valid";
}

/// Condition types on a NodeRollout.
pub mod rollout_condition {
    /// True while the rollout still has work to do and is allowed to do it.
    pub const PROGRESSING: &str = "Progressing";
    /// True when every selected node runs the release.
    pub const COMPLETE: &str = "Complete";
    /// True when the rollout stopped itself because more nodes failed than `maxFailures`.
    pub const HALTED: &str = "Halted";
    /// True when selected nodes were left out because another rollout owns them (reason
    /// `NodeOwnedByOtherRollout`).
    pub const NODES_REFUSED: &str = "NodesRefused";
    /// True when selected nodes were passed over because the release has no build for their
    /// `kubernetes.io/arch` (reason `ArchitectureUnsupported`): counted as skipped.
    pub const NODES_UNSUPPORTED: &str = "NodesUnsupported";
}

macro_rules! reasons {
    ($( $(#[doc = $doc:literal])+ $variant:ident, )+) => {
        /// A condition reason. The set is closed: nothing else is ever written.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum Reason {
            $( $(#[doc = $doc])+ $variant, )+
        }

        impl Reason {
            /// Every reason, in documentation order.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant,)+];

            /// The reason as written into a condition (`PascalCase`, stable).
            pub fn as_str(self) -> &'static str {
                match self { $(Reason::$variant => stringify!($variant),)+ }
            }

            /// One line that explains the reason, for docs and `kubectl inplace`.
            pub fn description(self) -> &'static str {
                match self { $(Reason::$variant => concat!($($doc),+).trim_start(),)+ }
            }

            /// Parses a reason written by [`Reason::as_str`].
            pub fn parse(text: &str) -> Option<Reason> {
                match text { $(stringify!($variant) => Some(Reason::$variant),)+ _ => None }
            }
        }
    };
}

reasons! {
    /// Nothing is wrong.
    AsExpected,
    /// The agent has seen the plan and has not started on it yet.
    Pending,
    /// Artifacts are being downloaded and verified.
    Downloading,
    /// Every artifact is downloaded, verified and staged; the running revision is untouched.
    Staged,
    /// Links are being swapped and units restarted.
    Activating,
    /// The new revision is active and its health checks are running.
    Verifying,
    /// The new revision passed its health checks and is committed.
    Succeeded,
    /// The plan breaks a rule of the API (the message names the field); nothing was done.
    InvalidPlan,
    /// The plan asks for something this node's local policy forbids; nothing was done.
    PolicyDenied,
    /// An artifact has no build for a node's architecture: the agent refuses such a plan (the
    /// message names the artifact, the node's architecture and the ones it has), and a
    /// rollout passes such nodes over (condition `NodesUnsupported` names each node and its
    /// `kubernetes.io/arch`; they are counted as skipped, not failed); nothing was done.
    ArchitectureUnsupported,
    /// A binary's or archive member's directory is reached through a symlink below an
    /// allowed target directory (the message names it); nothing was changed.
    TargetThroughSymlink,
    /// An artifact could not be downloaded (the message names it and the HTTP status).
    DownloadFailed,
    /// A downloaded artifact's sha256 differs from the one in the plan; it was deleted.
    HashMismatch,
    /// An artifact is larger or smaller than declared; the download was aborted.
    SizeMismatch,
    /// The disk filled up while downloading or staging; temporary files were removed.
    DiskFull,
    /// A verified artifact could not be staged (for example an archive was refused).
    StagingFailed,
    /// An artifact's signature is missing (the node requires one), invalid, from a key the
    /// node does not trust, or names another file or version; nothing was installed.
    SignatureInvalid,
    /// The plan's `kubernetesVersion` is lower than the one the node runs and the plan does
    /// not set `allowDowngrade`, or its `spec.agent.version` is lower than the running
    /// agent's and the node's `[self_update] allow_downgrade` is off; nothing was done. On a
    /// rollout: its release's `kubernetesVersion` is lower than the kubelet of a selected
    /// node (the message names them and both versions) and it does not set
    /// `allowDowngrade`; no node is touched.
    DowngradeDenied,
    /// systemd-sysext skipped an extension (incompatible release file); rolled back.
    ExtensionNotMerged,
    /// A unit's restart job (or the extensions' refresh) did not end `done`, or a
    /// restarted unit did not start (unchanged InvocationID); rolled back.
    UnitFailed,
    /// A health check failed or did not pass within the timeout; rolled back.
    HealthCheckFailed,
    /// A revision activated by a reboot (`activation.mode: Reboot`): its links are swapped
    /// and logind was asked to reboot the node; the checks run after the boot.
    Rebooting,
    /// The reboot waits: a blocking shutdown inhibitor is held (the message names who holds
    /// it and why); the links are unchanged, or swapped and journaled, until it is released.
    RebootInhibited,
    /// logind refused the reboot with no inhibitor to explain it, or the node came back
    /// from its reboot without the revision's files in place; rolled back.
    RebootFailed,
    /// The new revision failed and the node runs the previous one again, verified healthy.
    RolledBack,
    /// The rollback itself failed; the node needs a person and nothing more is done.
    RollbackFailed,
    /// This revision failed on this node before and is not retried until the plan changes.
    RevisionDenied,
    /// The agent restarted too often in the middle of this update and gave up on it.
    TooManyAttempts,
    /// The host no longer matches the committed revision (a managed link was changed or
    /// removed by something else); the message names the path.
    Drifted,
    /// The plan asks to replace the agent (`spec.agent`) and this agent cannot switch
    /// itself: it was installed by a package, not as a system extension, its extension link
    /// is no longer a link, or the guard's path unit (`inplace-agent-guard.path`) is not
    /// active, so nothing would restore a broken agent; nothing was done.
    SelfUpdateUnsupported,
    /// The new agent did not confirm itself by the node's `[self_update] confirm_timeout`
    /// (it crashed, hung before READY=1 or could not reach the API server); the guard
    /// restored the previous agent, which reports `RolledBack` with this in its message.
    AgentNotConfirmed,
    /// The release passed validation.
    ValidRelease,
    /// The release breaks a rule (the message names every field).
    InvalidRelease,
    /// The rollout names a release that does not exist.
    ReleaseNotFound,
    /// The rollout's release is not valid.
    ReleaseInvalid,
    /// The rollout's release brings a kubelet a minor version newer than the API server, or
    /// more than one minor version above a selected node's kubelet (the message names both
    /// versions), and the rollout does not set `allowVersionSkew`; no node is touched.
    VersionSkewDenied,
    /// The rollout breaks a rule its CRD's schema does not enforce (stored before the rule,
    /// or by an API server without it); the message names every field. No node is touched
    /// until it is fixed.
    InvalidRollout,
    /// The rollout is activating nodes.
    RollingOut,
    /// The rollout is paused by its spec; staging continues, activation does not.
    Paused,
    /// Every selected node runs the release.
    AllNodesUpdated,
    /// The node selector matches no node.
    NoNodesSelected,
    /// More nodes failed than `maxFailures` allows; no new activations.
    TooManyFailures,
    /// A node could not be drained within `drainTimeout` (a PodDisruptionBudget, usually);
    /// failed, or skipped under `drain.onTimeout: Skip`.
    DrainTimeout,
    /// A node is already owned by another rollout and was left out.
    NodeOwnedByOtherRollout,
    /// The rollout has `maintenanceWindows` and none is open: no new activation starts
    /// (staging goes on); the message says when the next window opens.
    OutsideMaintenanceWindow,
    /// A maintenance window cannot be read (the message names the field, e.g. an unknown
    /// time zone, or a duration outside 1m to 168h); no new activation starts until it is
    /// fixed.
    InvalidMaintenanceWindow,
    /// A node held its activation slot longer than `progressDeadline` without reaching a
    /// final phase; counted as failed, its slot released, the node left cordoned.
    ProgressDeadlineExceeded,
    /// A node that already runs the rollout's release is not `Ready` (its Node's condition
    /// is False, Unknown or missing); no new activation starts until it is (the message
    /// names the nodes).
    NodeNotReady,
    /// An alert listed in `spec.gates.alerts` fires in Prometheus; no new activation starts
    /// until it resolves (the message names the alerts).
    AlertFiring,
    /// The alert gate cannot be read: no `--prometheus-url`, Prometheus unreachable, too
    /// slow or answering something other than its alerts JSON. The gate fails closed: no
    /// new activation starts (the message has the error).
    GateUnavailable,
    /// kured's reboot lock (the annotation on its DaemonSet, `--kured-daemonset`) is held by
    /// a kured daemon, or cannot be read or taken: no new activation starts until inplace
    /// can take it (the message names the holder).
    RebootLockHeld,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reasons as a Markdown table, kept in `docs/usage/troubleshooting.md` between the
/// markers `<!-- reasons:begin -->` and `<!-- reasons:end -->` (a test checks it).
pub fn markdown_table() -> String {
    let mut table = String::from("| reason | meaning |\n|---|---|\n");
    for reason in Reason::ALL {
        table.push_str(&format!(
            "| `{}` | {} |\n",
            reason.as_str(),
            reason.description()
        ));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_and_are_documented() {
        for reason in Reason::ALL {
            assert_eq!(Reason::parse(reason.as_str()), Some(*reason));
            assert!(!reason.description().is_empty());
        }
        assert_eq!(Reason::parse("NoSuchReason"), None);
    }
}
