//! Signed artifacts and downgrade protection through the whole per-revision flow, against
//! the fake edges of `common/mod.rs`. Keys and signatures are made in each test with the
//! `minisign` crate (the reference implementation's Rust port), exactly as
//! `minisign -S -m FILE -t "file:FILE version:V"` makes them.

use crate::common;

use std::sync::atomic::Ordering;

use common::{Bed, Signer, bed_trusting};
use inplace_proto::{NodeUpdatePlan, Phase};

/// Signs every artifact of `plan` with `signer`, the trusted comment made by `comment`
/// from the artifact's file name, and serves each signature at `<url>.minisig`.
fn sign_plan(
    bed: &Bed,
    plan: &mut NodeUpdatePlan,
    signer: &Signer,
    comment: impl Fn(&str) -> String,
) {
    let mut objects = bed.fetcher.objects.lock().unwrap();
    for artifact in &mut plan.spec.content.artifacts {
        let file = artifact.url.rsplit('/').next().unwrap().to_owned();
        let signature = signer.sign(&objects[&artifact.url], &comment(&file));
        let url = format!("{}.minisig", artifact.url);
        objects.insert(url.clone(), signature);
        artifact.signature_url = Some(url);
    }
}

/// The trusted comment convention of docs/usage/signing.md.
fn for_file_and_version(file: &str) -> String {
    format!("timestamp:1764000000 file:{file} version:v1.31.2")
}

/// A signed v1 installed and committed.
async fn signed_v1(bed: &Bed, signer: &Signer) -> inplace_agent::update::Agent {
    let mut agent = bed.agent().await;
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    sign_plan(bed, &mut plan, signer, for_file_and_version);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(
        bed.last().phase,
        Some(Phase::Succeeded),
        "{:?}",
        bed.ready()
    );
    agent
}

/// A node that trusts a fresh signer and runs a signed v1.
async fn node_on_signed_v1(require: bool) -> (Signer, Bed, inplace_agent::update::Agent) {
    let signer = Signer::new();
    let bed = bed_trusting(&signer, require);
    let agent = signed_v1(&bed, &signer).await;
    (signer, bed, agent)
}

/// The plan for images `OK <tag>` / `kubectl <tag>`, signed by `signer` with `comment`.
fn signed_plan(
    bed: &Bed,
    tag: &str,
    signer: &Signer,
    comment: impl Fn(&str) -> String,
) -> NodeUpdatePlan {
    let mut plan = bed.plan(&format!("OK {tag}"), &format!("kubectl {tag}"), "Active");
    sign_plan(bed, &mut plan, signer, comment);
    plan
}

/// Files under the bed's state and image directories, for "nothing changed" checks.
fn files(bed: &Bed) -> Vec<String> {
    fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if !path.ends_with("journal.json") {
                out.push(path.display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(&bed.settings.state_dir, &mut out);
    walk(&bed.settings.paths.images_dir, &mut out);
    out.sort();
    out
}

/// Handles `plan` on a node running signed v1 and expects a refusal with `reason` whose
/// message holds every one of `words`; nothing on the node changes and the revision is
/// not retried.
async fn refused(
    bed: &Bed,
    agent: &mut inplace_agent::update::Agent,
    plan: &NodeUpdatePlan,
    reason: &str,
    words: &[&str],
) {
    let before = files(bed);
    agent.handle(Some(plan)).await.unwrap();
    let (status, got, message) = bed.ready();
    assert_eq!(
        (status.as_str(), got.as_str()),
        ("False", reason),
        "{message}"
    );
    for word in words {
        assert!(message.contains(word), "{word:?} not in {message}");
    }
    assert_eq!(bed.last().phase, Some(Phase::Failed));
    assert_eq!(bed.link(), "OK v1", "the running revision is untouched");
    assert_eq!(bed.kubectl(), "kubectl v1");
    assert_eq!(files(bed), before, "no file was added or left behind");
}

#[tokio::test]
async fn good_signatures_install() {
    let signer = Signer::new();
    let bed = bed_trusting(&signer, true);
    signed_v1(&bed, &signer).await;
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
}

#[tokio::test]
async fn a_bad_signature_is_refused_the_download_removed_and_the_revision_denied() {
    let signer = Signer::new();
    // Signatures that are given are verified even where they are not required.
    let bed = bed_trusting(&signer, false);
    let mut agent = signed_v1(&bed, &signer).await;
    let plan = signed_plan(&bed, "v2", &signer, for_file_and_version);
    // The server's signature is over other bytes than the plan's file.
    let url = plan.spec.content.artifacts[0].url.clone();
    bed.fetcher.objects.lock().unwrap().insert(
        format!("{url}.minisig"),
        signer.sign(b"OK v2 tampered", &for_file_and_version("kubernetes.raw")),
    );
    refused(
        &bed,
        &mut agent,
        &plan,
        "SignatureInvalid",
        &[
            "artifact kubernetes",
            "does not match the file's bytes",
            "release.pub",
        ],
    )
    .await;
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert!(bed.last().failed_revisions.contains(&revision));
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.ready().1, "RevisionDenied");
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
}

#[tokio::test]
async fn a_missing_signature_is_refused_before_any_download_where_required() {
    let (signer, bed, mut agent) = node_on_signed_v1(true).await;
    let mut plan = signed_plan(&bed, "v2", &signer, for_file_and_version);
    plan.spec.content.artifacts[1].signature_url = None;
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    refused(
        &bed,
        &mut agent,
        &plan,
        "SignatureInvalid",
        &[
            "spec.artifacts[1].signatureUrl",
            "artifact kubectl has no signatureUrl",
        ],
    )
    .await;
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches, "no I/O");

    // A signature URL that is not there: the download of the signature fails, named.
    let mut plan = signed_plan(&bed, "v3", &signer, for_file_and_version);
    plan.spec.content.artifacts[0].signature_url =
        Some("https://dl.example/k8s/gone/kubernetes.raw.minisig".into());
    refused(
        &bed,
        &mut agent,
        &plan,
        "DownloadFailed",
        &["kubernetes (signature)", "404"],
    )
    .await;
}

#[tokio::test]
async fn a_signature_from_an_untrusted_key_is_refused_before_the_artifact_is_downloaded() {
    let (signer, bed, mut agent) = node_on_signed_v1(true).await;
    let stranger = Signer::new();
    let plan = signed_plan(&bed, "v2", &stranger, for_file_and_version);
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    refused(
        &bed,
        &mut agent,
        &plan,
        "SignatureInvalid",
        &[
            "artifact kubernetes",
            "not a trusted key of this node",
            "release.pub",
        ],
    )
    .await;
    assert_eq!(
        bed.fetcher.calls.load(Ordering::SeqCst),
        fetches + 1,
        "only the signature was downloaded"
    );

    // With no trusted key at all, nothing verifies.
    std::fs::remove_file(bed.settings.policy.trusted_keys_dir.join("release.pub")).unwrap();
    let plan = signed_plan(&bed, "v3", &signer, for_file_and_version);
    refused(
        &bed,
        &mut agent,
        &plan,
        "SignatureInvalid",
        &["no *.pub key in"],
    )
    .await;
}

#[tokio::test]
async fn a_signature_replayed_for_another_file_is_refused() {
    let (signer, bed, mut agent) = node_on_signed_v1(true).await;
    // Valid over these very bytes, but vouching for another file.
    let plan = signed_plan(&bed, "v2", &signer, |_| {
        "timestamp:1764000000 file:kubelet-debug.raw version:v1.31.2".into()
    });
    refused(
        &bed,
        &mut agent,
        &plan,
        "SignatureInvalid",
        &[
            "artifact kubernetes",
            "is for file \"kubelet-debug.raw\", not \"kubernetes.raw\"",
        ],
    )
    .await;
    // A comment that names no file at all vouches for nothing.
    let plan = signed_plan(&bed, "v3", &signer, |_| "timestamp:1764000000".into());
    refused(
        &bed,
        &mut agent,
        &plan,
        "SignatureInvalid",
        &["does not name the file"],
    )
    .await;
}

#[tokio::test]
async fn an_older_versions_signature_replayed_for_a_newer_plan_is_refused() {
    let (signer, bed, mut agent) = node_on_signed_v1(true).await;
    // Same file name, valid over these bytes, but signed for v1.30.0.
    let plan = signed_plan(&bed, "v2", &signer, |file| {
        format!("timestamp:1700000000 file:{file} version:v1.30.0")
    });
    refused(
        &bed,
        &mut agent,
        &plan,
        "SignatureInvalid",
        &["is for version \"v1.30.0\", not the plan's kubernetesVersion \"v1.31.2\""],
    )
    .await;
}

/// minisign's default trusted comment, which names no version.
fn minisign_default(file: &str) -> String {
    format!("timestamp:1764000000\tfile:{file}\thashed")
}

/// A comment without a version vouches for every release of the file name, so an old
/// signed release could be served as the new one. Where signatures are required, the
/// plan's kubernetesVersion must be in the comment.
#[tokio::test]
async fn a_signature_without_a_version_is_refused_where_signatures_are_required() {
    let (signer, bed, mut agent) = node_on_signed_v1(true).await;
    let plan = signed_plan(&bed, "v2", &signer, minisign_default);
    refused(
        &bed,
        &mut agent,
        &plan,
        "SignatureInvalid",
        &[
            "artifact kubernetes",
            "does not name the version (version:v1.31.2)",
            "[policy] require_signatures",
        ],
    )
    .await;
}

/// Where signatures are not required, minisign's default comment is accepted (as
/// docs/usage/signing.md says: it permits any version).
#[tokio::test]
async fn a_signature_without_a_version_installs_where_signatures_are_not_required() {
    let (signer, bed, mut agent) = node_on_signed_v1(false).await;
    let plan = signed_plan(&bed, "v2", &signer, minisign_default);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(
        bed.last().phase,
        Some(Phase::Succeeded),
        "{:?}",
        bed.ready()
    );
    assert_eq!(bed.link(), "OK v2");
}

#[tokio::test]
async fn a_stored_file_is_verified_again_under_a_new_signature() {
    let (signer, bed, mut agent) = node_on_signed_v1(true).await;
    // kubectl v1 is already in the store; its new signature is from a stranger.
    let mut plan = bed.plan("OK v2", "kubectl v1", "Active");
    sign_plan(&bed, &mut plan, &signer, for_file_and_version);
    let url = plan.spec.content.artifacts[1].url.clone();
    bed.fetcher.objects.lock().unwrap().insert(
        format!("{url}.minisig"),
        Signer::new().sign(b"kubectl v1", &for_file_and_version("kubectl")),
    );
    refused(
        &bed,
        &mut agent,
        &plan,
        "SignatureInvalid",
        &["artifact kubectl", "not a trusted key"],
    )
    .await;
}

/// A plan for v1.30.0 on a node that runs v1.31.2.
fn older_plan(bed: &Bed, signer: &Signer) -> NodeUpdatePlan {
    let mut plan = bed.plan("OK v0", "kubectl v0", "Active");
    plan.spec.content.kubernetes_version = Some("v1.30.0".into());
    // The fake kubelet reports v1.31.2 whatever runs.
    plan.spec.content.health_checks.node_kubelet_version = false;
    sign_plan(bed, &mut plan, signer, |file| {
        format!("file:{file} version:v1.30.0")
    });
    plan
}

#[tokio::test]
async fn a_downgrade_is_refused_before_any_io() {
    let (signer, bed, mut agent) = node_on_signed_v1(true).await;
    let plan = older_plan(&bed, &signer);
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    refused(
        &bed,
        &mut agent,
        &plan,
        "DowngradeDenied",
        &[
            "spec.kubernetesVersion",
            "v1.30.0 is lower than v1.31.2",
            "allowDowngrade",
        ],
    )
    .await;
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches, "no I/O");
    // A refusal, not a failure: the revision is not denied, so allowing it works at once.
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert!(!bed.last().failed_revisions.contains(&revision));
}

#[tokio::test]
async fn a_downgrade_goes_ahead_when_the_plan_allows_it() {
    let (signer, bed, mut agent) = node_on_signed_v1(true).await;
    let mut plan = older_plan(&bed, &signer);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.ready().1, "DowngradeDenied");
    plan.spec.allow_downgrade = true;
    plan.metadata.generation = Some(2);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(
        bed.last().phase,
        Some(Phase::Succeeded),
        "{:?}",
        bed.ready()
    );
    assert_eq!(bed.link(), "OK v0");
    assert_eq!(bed.kubectl(), "kubectl v0");
}
