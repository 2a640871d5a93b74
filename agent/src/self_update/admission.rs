//! Whether this node may take a plan's agent update (`spec.agent`): pure, before any I/O,
//! like the rest of the node policy. Every refusal names the field.
//!
//! The rules (docs/design/agent-self-update.md): `[self_update] allow` (off by default);
//! only an agent installed as a system extension can switch (a package owns `/usr/bin`, and
//! the agent cannot swap it under `ProtectSystem=strict`); the image is always signed,
//! because it runs as root, and comes from where `[policy]` lets artifacts come from; a
//! lower version than the running build is a downgrade, refused unless `[self_update]
//! allow_downgrade` says otherwise (an old agent is signed as well as a new one). The
//! version that already runs replaces nothing, so none of this applies to it: the plan is
//! up to date (`machine::decide`).

use std::cmp::Ordering;
use std::path::Path;

use inplace_proto::validate::FieldError;
use inplace_proto::{AgentImage, Reason, UpdateContent};

use crate::policy::{OWN_EXTENSION, url_problem};
use crate::settings::{Policy, SelfUpdateSettings};

/// How this agent was installed, which decides whether it can replace itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installation {
    /// From its system extension image, linked as `<extensions_dir>/inplace-agent.raw`.
    Sysext,
    /// From a package (the .deb): no extension link of its own.
    Package,
}

impl Installation {
    /// Looks for the agent's own extension link in `extensions_dir`.
    pub fn detect(extensions_dir: &Path) -> Installation {
        let link = extensions_dir.join(format!("{OWN_EXTENSION}.raw"));
        if link.symlink_metadata().is_ok() {
            Installation::Sysext
        } else {
            Installation::Package
        }
    }
}

/// What the check needs to know about this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The `[self_update]` settings.
    pub settings: SelfUpdateSettings,
    /// How the running agent was installed.
    pub installation: Installation,
    /// The version the running agent was built as.
    pub running_version: String,
    /// Why the guard does not cover this node (its path unit not active, as read at the
    /// agent's start); `None` when it does.
    pub guard_missing: Option<String>,
}

impl Admission {
    /// Whether `content` asks for the agent build that runs already (then it replaces
    /// nothing: the plan is up to date, whatever this node allows).
    pub fn runs(&self, content: &UpdateContent) -> bool {
        content
            .agent
            .as_ref()
            .is_some_and(|agent| agent.version == self.running_version)
    }
}

/// The problems of `content`'s agent update on this node (none when it has no `agent`).
pub fn check(content: &UpdateContent, policy: &Policy, admission: &Admission) -> Vec<FieldError> {
    let Some(agent) = content.agent.as_ref().filter(|_| !admission.runs(content)) else {
        return Vec::new();
    };
    let problem = |path: &str, reason, message: String| FieldError {
        path: format!("spec.agent{path}"),
        reason,
        message,
    };
    // The first three refuse the whole idea on this node: nothing else is worth reporting.
    if !admission.settings.allow {
        return vec![problem(
            "",
            Reason::PolicyDenied,
            format!(
                "agent {} would replace this node's agent and [self_update] allow is false",
                agent.version
            ),
        )];
    }
    if admission.installation == Installation::Package {
        return vec![problem(
            "",
            Reason::SelfUpdateUnsupported,
            format!(
                "agent {}: this agent was installed by a package, not as the {OWN_EXTENSION} system extension, and cannot replace itself; update the package",
                agent.version
            ),
        )];
    }
    if let Some(why) = &admission.guard_missing {
        return vec![problem(
            "",
            Reason::SelfUpdateUnsupported,
            format!(
                "agent {}: {why}, so nothing would restore a broken agent; install and enable the guard units (inplace-agent-guard.path and .service)",
                agent.version
            ),
        )];
    }
    downgrade_problem(agent, admission)
        .into_iter()
        .chain(image_problems(agent, policy))
        .map(|(path, reason, message)| problem(path, reason, message))
        .collect()
}

/// A lower version than the running build (or one that cannot be ordered against it),
/// unless the node allows downgrades.
fn downgrade_problem(
    agent: &AgentImage,
    admission: &Admission,
) -> Option<(&'static str, Reason, String)> {
    if admission.settings.allow_downgrade {
        return None;
    }
    let running = &admission.running_version;
    let why = match inplace_proto::version::compare_builds(&agent.version, running) {
        Some(Ordering::Less) => format!(
            "{} is lower than {running}, which this node runs",
            agent.version
        ),
        None => format!(
            "{} cannot be ordered against {running}, which this node runs (not both semver)",
            agent.version
        ),
        Some(_) => return None,
    };
    Some((
        ".version",
        Reason::DowngradeDenied,
        format!("agent {why}; set [self_update] allow_downgrade = true on the node to allow it"),
    ))
}

fn image_problems(agent: &AgentImage, policy: &Policy) -> Vec<(&'static str, Reason, String)> {
    let mut problems = Vec::new();
    if let Some(message) = url_problem(&agent.url, policy) {
        problems.push((".url", Reason::PolicyDenied, message));
    }
    if let Some(size) = agent.size
        && size > policy.max_artifact_size
    {
        problems.push((
            ".size",
            Reason::PolicyDenied,
            format!(
                "{size} bytes is more than this node's limit of {} bytes",
                policy.max_artifact_size
            ),
        ));
    }
    match &agent.signature_url {
        Some(url) => {
            if let Some(message) = url_problem(url, policy) {
                problems.push((".signatureUrl", Reason::PolicyDenied, message));
            }
        }
        // After the PolicyDenied ones, as in the node policy: the reason is the first one's.
        None => problems.push((
            ".signatureUrl",
            Reason::SignatureInvalid,
            format!(
                "agent {} has no signatureUrl; the agent image runs as root and is always verified",
                agent.version
            ),
        )),
    }
    problems
}

#[cfg(test)]
mod tests;
