//! The agent image's signature: its trusted comment must name `spec.agent.version`,
//! whatever `require_signatures` says; a refusal names the field and both versions.

use std::io::Cursor;
use std::path::Path;

use async_trait::async_trait;
use inplace_proto::AgentImage;

use super::*;
use crate::fetch::{FetchError, Fetched, Progress};
use crate::settings::Policy;

const URL: &str = "https://dl.example/inplace-agent-0.2.0.raw";
const SIGNATURE_URL: &str = "https://dl.example/inplace-agent-0.2.0.raw.minisig";

/// Serves one signature; the image itself is never asked for before its signature passed.
struct SignatureOnly(Vec<u8>);

#[async_trait]
impl Fetcher for SignatureOnly {
    async fn fetch(&self, a: &Artifact, _: &Path, _: Progress<'_>) -> Result<Fetched, FetchError> {
        panic!("{} was downloaded before its signature was checked", a.name)
    }

    async fn fetch_small(&self, _: &str, url: &str, _: usize) -> Result<Vec<u8>, FetchError> {
        assert_eq!(url, SIGNATURE_URL);
        Ok(self.0.clone())
    }
}

fn agent() -> AgentImage {
    AgentImage {
        version: "0.2.0".into(),
        url: URL.into(),
        sha256: "b".repeat(64),
        size: Some(4),
        signature_url: Some(SIGNATURE_URL.into()),
    }
}

/// A node trusting a fresh key (which does not require signatures for other artifacts),
/// and the fetcher serving that key's signature with `comment`.
fn node_signing(comment: &str) -> (tempfile::TempDir, Policy, SignatureOnly) {
    let pair = minisign::KeyPair::generate_unencrypted_keypair().expect("a key pair");
    let dir = tempfile::tempdir().expect("a temp dir");
    let public = pair.pk.to_box().expect("a key box").into_string();
    std::fs::write(dir.path().join("release.pub"), public).expect("written");
    let mut policy = crate::settings::from_toml("", || Some("node".into()))
        .expect("settings")
        .policy;
    policy.trusted_keys_dir = dir.path().to_path_buf();
    policy.require_signatures = false;
    let signature = minisign::sign(
        Some(&pair.pk),
        &pair.sk,
        Cursor::new(b"next"),
        Some(comment),
        None,
    )
    .expect("a signature")
    .into_string();
    (dir, policy, SignatureOnly(signature.into_bytes()))
}

async fn prepared(comment: &str) -> Result<(), Failure> {
    let (_keys, policy, fetcher) = node_signing(comment);
    let agent = agent();
    prepare_signature(
        &fetcher,
        &agent,
        &as_artifact(&agent),
        &policy.trusted_keys_dir,
    )
    .await
    .map(|signature| assert!(signature.is_some()))
}

#[test]
fn the_agent_image_is_staged_as_the_agents_own_sysext() {
    let artifact = as_artifact(&agent());
    assert_eq!(artifact.name, OWN_EXTENSION);
    assert_eq!(artifact.kind, ArtifactType::Sysext);
    assert_eq!(
        (artifact.url.as_str(), artifact.size),
        (URL, Some(4)),
        "the image's own URL and size are enforced"
    );
    assert_eq!(artifact.signature_url.as_deref(), Some(SIGNATURE_URL));
}

#[tokio::test]
async fn a_signature_for_the_ordered_version_passes() {
    prepared("timestamp:1 file:inplace-agent-0.2.0.raw version:0.2.0")
        .await
        .expect("signed for 0.2.0");
}

#[tokio::test]
async fn a_signature_for_another_agent_version_is_refused_naming_both() {
    let failure = prepared("timestamp:1 file:inplace-agent-0.2.0.raw version:0.1.0")
        .await
        .expect_err("signed for 0.1.0");
    assert_eq!(failure.reason, Reason::SignatureInvalid);
    for word in [
        "spec.agent.signatureUrl",
        "0.1.0",
        "spec.agent.version 0.2.0",
    ] {
        assert!(
            failure.message.contains(word),
            "{word:?} not in {}",
            failure.message
        );
    }
}

/// Where require_signatures is off, a comment without a version would pass for a
/// Kubernetes artifact; for the agent image it never does.
#[tokio::test]
async fn a_signature_naming_no_version_is_refused_whatever_require_signatures_says() {
    let failure = prepared("timestamp:1 file:inplace-agent-0.2.0.raw")
        .await
        .expect_err("no version");
    assert_eq!(failure.reason, Reason::SignatureInvalid);
    for word in [
        "spec.agent.signatureUrl",
        "names no version",
        "version:0.2.0",
    ] {
        assert!(
            failure.message.contains(word),
            "{word:?} not in {}",
            failure.message
        );
    }
}
