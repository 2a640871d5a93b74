//! Every report's text: what the agent says at each step, as a [`Report`] (phase, reason,
//! message, and the degradation shown beside it).

use inplace_proto::{Phase, Problems, Reason, UpdateContent};

use crate::journal::{FailedRevision, Failure};
use crate::machine::PlanView;

/// A report about the plan's target revision.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::update) struct Report {
    pub(in crate::update) phase: Phase,
    pub(in crate::update) reason: Reason,
    pub(in crate::update) message: String,
    /// Shown as `Degraded=True` with its reason and message.
    pub(in crate::update) degraded: Option<Failure>,
}

impl Report {
    pub(in crate::update) fn new(phase: Phase, reason: Reason, message: impl Into<String>) -> Self {
        Report {
            phase,
            reason,
            message: message.into(),
            degraded: None,
        }
    }

    /// A rollback failed earlier; nothing is done until a person clears it.
    pub(in crate::update) fn degraded_node(failure: Failure) -> Self {
        let message = format!("node degraded, no automatic action: {}", failure.message);
        Report {
            degraded: Some(failure),
            ..Report::new(Phase::Failed, Reason::RollbackFailed, message)
        }
    }

    /// The committed revision is the plan's; `drift` says how the host differs, if it does.
    pub(in crate::update) fn up_to_date(
        revision: &str,
        content: Option<&UpdateContent>,
        drift: Option<String>,
    ) -> Self {
        match drift {
            None => Report::committed(revision, content),
            Some(drift) => Report {
                degraded: Some(Failure {
                    reason: Reason::Drifted,
                    message: drift,
                }),
                ..Report::new(
                    Phase::Succeeded,
                    Reason::Succeeded,
                    format!("revision {revision} is committed, but the host drifted"),
                )
            },
        }
    }

    /// The revision was verified healthy and committed; for a plan that restarts the
    /// kubelet, whether the node's reported kubelet version was checked (and if not why),
    /// and whether the Node's Ready was.
    pub(in crate::update) fn committed(revision: &str, content: Option<&UpdateContent>) -> Self {
        let kubelet = content.map(kubelet_note).unwrap_or_default();
        Report::new(
            Phase::Succeeded,
            Reason::Succeeded,
            format!("revision {revision} is committed and healthy{kubelet}"),
        )
    }

    /// The plan is invalid or outside the node's policy.
    pub(in crate::update) fn refused(problems: &Problems) -> Self {
        Report::new(Phase::Failed, problems.reason(), problems.to_string())
    }

    /// The revision failed here before (and was rolled back, if it had been activated).
    pub(in crate::update) fn denied(failed: &FailedRevision) -> Self {
        let (revision, failure) = (failed.revision(), failed.failure());
        let (reason, message) = (failure.reason, &failure.message);
        if failed.rolled_back() {
            Report::new(
                Phase::RolledBack,
                Reason::RolledBack,
                format!(
                    "rolled back revision {revision} ({reason}: {message}); the previous revision runs; not retried until the plan changes"
                ),
            )
        } else {
            Report::new(
                Phase::Failed,
                Reason::RevisionDenied,
                format!(
                    "revision {revision} failed on this node before ({reason}: {message}); not retried until the plan changes"
                ),
            )
        }
    }

    /// The old agent arms the guard and swaps its own image (it is restarted as the new).
    pub(in crate::update) fn switching(version: &str) -> Self {
        Report::new(
            Phase::Activating,
            Reason::Activating,
            format!("switching to agent {version}; the new agent confirms itself"),
        )
    }

    /// The new agent's proof that it can do its job: this status, written with its
    /// identity.
    pub(in crate::update) fn confirming(version: &str) -> Self {
        Report::new(
            Phase::Activating,
            Reason::Activating,
            format!("confirming agent {version}"),
        )
    }

    /// The new agent confirmed itself; the node's content is unchanged.
    pub(in crate::update) fn switched(revision: &str, version: &str) -> Self {
        Report::new(
            Phase::Succeeded,
            Reason::Succeeded,
            format!("revision {revision} is committed: agent {version} confirmed itself"),
        )
    }

    /// The revision failed before anything that runs was touched.
    pub(in crate::update) fn failed(failure: Failure) -> Self {
        Report::new(Phase::Failed, failure.reason, failure.message)
    }

    /// Artifacts are being downloaded and verified.
    pub(in crate::update) fn downloading(view: &PlanView) -> Self {
        Report::new(
            Phase::Downloading,
            Reason::Downloading,
            format!(
                "downloading and verifying {} artifact(s) of revision {}",
                view.content.artifacts.len(),
                view.revision
            ),
        )
    }

    /// Staged, and asked for no more.
    pub(in crate::update) fn staged(revision: &str) -> Self {
        Report::new(
            Phase::Staged,
            Reason::Staged,
            format!("revision {revision} is staged; the running revision is untouched"),
        )
    }

    /// Links are being swapped and units restarted.
    pub(in crate::update) fn activating(revision: &str) -> Self {
        Report::new(
            Phase::Activating,
            Reason::Activating,
            format!("activating revision {revision}"),
        )
    }

    /// Health checks run; `progress` is the health clock ("… healthy for 12s of 30s").
    pub(in crate::update) fn verifying(progress: String) -> Self {
        Report::new(Phase::Verifying, Reason::Verifying, progress)
    }

    /// Going back, because of `failure` (`None`: the plan moved on); `why` describes it.
    pub(in crate::update) fn rolling_back(
        revision: &str,
        failure: Option<&Failure>,
        why: &str,
    ) -> Self {
        Report::new(
            Phase::RollingBack,
            failure.map_or(Reason::Activating, |f| f.reason),
            format!("rolling back revision {revision}: {why}"),
        )
    }

    /// What ran before runs again and is healthy.
    pub(in crate::update) fn rolled_back(revision: &str, why: &str) -> Self {
        Report::new(
            Phase::RolledBack,
            Reason::RolledBack,
            format!(
                "rolled back revision {revision} ({why}); the previous revision runs and is healthy"
            ),
        )
    }

    /// A reboot (`back`: into the previous revision) waits for `blocking` inhibitors.
    pub(in crate::update) fn reboot_inhibited(revision: &str, blocking: &str, back: bool) -> Self {
        let (phase, what) = if back {
            (Phase::RollingBack, "the reboot back from revision")
        } else {
            (Phase::Activating, "the reboot into revision")
        };
        Report::new(
            phase,
            Reason::RebootInhibited,
            format!("{what} {revision} waits: a shutdown inhibitor blocks it: {blocking}"),
        )
    }

    /// logind accepted the reboot (`back`: into the previous revision); the agent that
    /// starts after it verifies the boot.
    pub(in crate::update) fn rebooting(revision: &str, back: bool) -> Self {
        if back {
            Report::new(
                Phase::RollingBack,
                Reason::Rebooting,
                format!("rebooting into the previous revision: revision {revision} is rolled back"),
            )
        } else {
            Report::new(
                Phase::Activating,
                Reason::Rebooting,
                format!("rebooting into revision {revision}; its checks run after the boot"),
            )
        }
    }

    /// The rollback failed: the node is degraded.
    pub(in crate::update) fn rollback_failed(degraded: Failure) -> Self {
        Report {
            degraded: Some(degraded.clone()),
            ..Report::new(Phase::Failed, Reason::RollbackFailed, degraded.message)
        }
    }
}

/// What a committed plan that restarts `kubelet.service` proved of the kubelet: the version
/// the Node reports (`healthChecks.nodeKubeletVersion`), or why it was not checked, and
/// that the Node reports Ready (`healthChecks.nodeReady`). Empty for a plan that does not
/// restart the kubelet.
pub(super) fn kubelet_note(content: &UpdateContent) -> String {
    let restarts_kubelet = content
        .activation
        .restart_units
        .iter()
        .any(|u| u.as_str() == crate::health::KUBELET_UNIT);
    if !restarts_kubelet {
        return String::new();
    }
    let checks = &content.health_checks;
    let ready = if checks.node_ready {
        "; the node reports Ready"
    } else {
        ""
    };
    match (
        checks.node_kubelet_version,
        content.kubernetes_version.as_deref(),
    ) {
        (true, Some(version)) if checks.node_ready => {
            format!("; the node reports kubelet {version} and Ready")
        }
        (true, Some(version)) => format!("; the node reports kubelet {version}"),
        (false, _) => format!(
            "; kubelet version not checked: healthChecks.nodeKubeletVersion is not set{ready}"
        ),
        (true, None) => {
            format!("; kubelet version not checked: the plan names no kubernetesVersion{ready}")
        }
    }
}
