//! The agent image (`spec.agent`) staged as any sysext is (step 1 of
//! docs/design/agent-self-update.md): as the artifact `inplace-agent`, under
//! `<images_dir>/inplace-agent/`, its sha256, size and signature checked. Unlike other
//! artifacts its signature is always required (admission refuses an unsigned one) and its
//! trusted comment must name `version:` equal to `spec.agent.version`, whatever
//! `require_signatures` says: a signature without it would vouch for every build of the
//! file name, and the new agent confirms only the version it was ordered to be.

use std::path::Path;
use std::sync::Arc;

use inplace_proto::{AgentImage, Artifact, ArtifactType, Reason};

use crate::fetch::Fetcher;
use crate::journal::Failure;
use crate::policy::OWN_EXTENSION;
use crate::signature::{self, CheckedSignature, PrepareError, SignatureError, Vouch};

/// The agent image as the sysext artifact staging stores and links.
pub fn as_artifact(agent: &AgentImage) -> Artifact {
    Artifact {
        signature_url: agent.signature_url.clone(),
        size: agent.size,
        ..Artifact::new(
            OWN_EXTENSION,
            ArtifactType::Sysext,
            &agent.url,
            &agent.sha256,
        )
    }
}

/// The agent image's signature, downloaded and checked as far as it goes without the
/// image's bytes (`artifact` is [`as_artifact`]'s), against the keys in
/// `trusted_keys_dir` (`[self_update] trusted_keys_dir`). A refusal names
/// `spec.agent.signatureUrl`.
pub async fn prepare_signature(
    fetcher: &dyn Fetcher,
    agent: &AgentImage,
    artifact: &Artifact,
    trusted_keys_dir: &Path,
) -> Result<Option<Arc<CheckedSignature>>, Failure> {
    let vouch = Vouch {
        version: Some(&agent.version),
        version_required: true,
    };
    signature::prepare_vouching(fetcher, artifact, vouch, trusted_keys_dir)
        .await
        .map_err(|e| match e {
            PrepareError::Fetch(failure) => failure,
            PrepareError::Signature(e) => refused(agent, &e),
        })
}

/// The refusal of the agent image's signature, naming the field and, when the trusted
/// comment is for another version (or none), both versions.
fn refused(agent: &AgentImage, e: &SignatureError) -> Failure {
    let what = match e {
        SignatureError::WrongSubject { comment, .. }
        | SignatureError::VersionMissing { comment, .. } => match signed_version(comment) {
            Some(signed) if signed != agent.version => format!(
                "the signature is for agent version {signed}, not spec.agent.version {} (trusted comment {comment:?})",
                agent.version
            ),
            Some(_) => e.to_string(),
            None => format!(
                "the signature names no version, and the agent image's must name spec.agent.version (version:{}) (trusted comment {comment:?})",
                agent.version
            ),
        },
        other => other.to_string(),
    };
    Failure {
        reason: Reason::SignatureInvalid,
        message: format!("spec.agent.signatureUrl: {what}"),
    }
}

/// The `version:` token of a trusted comment.
fn signed_version(comment: &str) -> Option<&str> {
    comment
        .split_whitespace()
        .find_map(|token| token.strip_prefix("version:"))
}

#[cfg(test)]
mod tests;
