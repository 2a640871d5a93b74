//! Which NodeRelease brings a Kubernetes version. Releases live in the **management**
//! cluster (where Cluster API and this extension run); the extension copies the chosen
//! release's content into the workload cluster's NodeUpdatePlan, so workload clusters need
//! the NodeUpdatePlan CRD and the agent only, never a NodeRelease.

use async_trait::async_trait;
use inplace_proto::NodeRelease;
use kube::api::{Api, ListParams};

use crate::error::Error;

/// A usable release for a version: its name and content.
#[derive(Clone, Debug, PartialEq)]
pub struct FoundRelease {
    /// The NodeRelease's name.
    pub name: String,
    /// Its spec (content copied into plans).
    pub spec: inplace_proto::NodeReleaseSpec,
    /// The revision hash of its content: what a node runs once it is updated.
    pub revision: String,
}

/// The answer to "which release brings Kubernetes version X".
#[derive(Clone, Debug, PartialEq)]
pub enum ReleaseLookup {
    /// Exactly one valid release has this `kubernetesVersion`.
    Found(Box<FoundRelease>),
    /// No release has this `kubernetesVersion`.
    NotFound,
    /// Releases with this version exist, but none is valid (names and why).
    Invalid(Vec<(String, String)>),
    /// Several valid releases have this version; the extension will not guess.
    Ambiguous(Vec<String>),
    /// A release exists, but the machine's workload cluster cannot run it (no Cluster, no
    /// usable kubeconfig Secret, no NodeUpdatePlan CRD); the message says which.
    ClusterNotReady(String),
    /// A release exists, but this Machine may not take it (see `claim::control_plane`); the
    /// message says why and how to allow it.
    Refused(String),
}

impl ReleaseLookup {
    /// Why no release can be used, in words ("" when one was found).
    pub fn explain(&self, version: &str) -> String {
        match self {
            ReleaseLookup::Found(_) => String::new(),
            ReleaseLookup::NotFound => {
                format!("no NodeRelease with kubernetesVersion {version} in the management cluster")
            }
            ReleaseLookup::Invalid(bad) => {
                let list: Vec<String> = bad
                    .iter()
                    .map(|(name, why)| format!("{name} ({why})"))
                    .collect();
                format!(
                    "no valid NodeRelease with kubernetesVersion {version}: {}",
                    list.join("; ")
                )
            }
            ReleaseLookup::Ambiguous(names) => format!(
                "{} valid NodeReleases have kubernetesVersion {version} ({}); keep exactly one",
                names.len(),
                names.join(", ")
            ),
            ReleaseLookup::ClusterNotReady(why) | ReleaseLookup::Refused(why) => why.clone(),
        }
    }
}

/// Picks the release for `kubernetes_version` among `releases`: the one that is usable
/// (`NodeRelease::usable`, the judgement the rollouts make too).
pub fn select_release(releases: &[NodeRelease], kubernetes_version: &str) -> ReleaseLookup {
    let mut valid = Vec::new();
    let mut invalid = Vec::new();
    for release in releases {
        if release.spec.content.kubernetes_version.as_deref() != Some(kubernetes_version) {
            continue;
        }
        let name = release.metadata.name.clone().unwrap_or_default();
        match release.usable() {
            Ok(revision) => valid.push((name, release, revision)),
            Err(unusable) => invalid.push((name, unusable.to_string())),
        }
    }
    match valid.len() {
        0 if invalid.is_empty() => ReleaseLookup::NotFound,
        0 => ReleaseLookup::Invalid(invalid),
        1 => {
            let (name, release, revision) = valid.remove(0);
            ReleaseLookup::Found(Box::new(FoundRelease {
                name,
                revision,
                spec: release.spec.clone(),
            }))
        }
        _ => {
            let mut names: Vec<String> = valid.into_iter().map(|(name, ..)| name).collect();
            names.sort();
            ReleaseLookup::Ambiguous(names)
        }
    }
}

/// Finds releases by Kubernetes version.
#[async_trait]
pub trait ReleaseCatalog: Send + Sync {
    /// The release that brings `kubernetes_version`.
    async fn lookup(&self, kubernetes_version: &str) -> Result<ReleaseLookup, Error>;
}

/// Reads NodeReleases from the management cluster on every call (a handful of small
/// objects; hooks are rare).
pub struct KubeReleaseCatalog {
    api: Api<NodeRelease>,
}

impl KubeReleaseCatalog {
    /// A catalog over the management cluster's NodeReleases.
    pub fn new(management: kube::Client) -> Self {
        KubeReleaseCatalog {
            api: Api::all(management),
        }
    }
}

#[async_trait]
impl ReleaseCatalog for KubeReleaseCatalog {
    async fn lookup(&self, kubernetes_version: &str) -> Result<ReleaseLookup, Error> {
        let list = self
            .api
            .list(&ListParams::default())
            .await
            .map_err(|source| Error::Management {
                action: "listing NodeReleases".into(),
                source,
            })?;
        Ok(select_release(&list.items, kubernetes_version))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use inplace_proto::{NodeReleaseStatus, revision_of};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    pub(crate) fn release(name: &str, kubernetes_version: &str) -> NodeRelease {
        let spec = serde_json::from_value(serde_json::json!({
            "version": kubernetes_version,
            "kubernetesVersion": kubernetes_version,
            "artifacts": [{
                "name": "kubernetes",
                "type": "Sysext",
                "url": format!("https://extensions.example/kubernetes-{kubernetes_version}-x86-64.raw"),
                "sha256": "4f0c".repeat(16),
                "size": 1000,
            }],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"units": ["kubelet.service"], "window": "30s", "timeout": "5m"},
        }))
        .unwrap();
        NodeRelease::new(name, spec)
    }

    fn with_valid(mut release: NodeRelease, status: &str) -> NodeRelease {
        release.status = Some(NodeReleaseStatus {
            conditions: vec![Condition {
                type_: "Valid".into(),
                status: status.into(),
                reason: "InvalidRelease".into(),
                message: "spec.artifacts[0].url: bad".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }],
            ..Default::default()
        });
        release
    }

    #[test]
    fn finds_the_one_valid_release_for_a_version() {
        let releases = [
            release("k-1.31.1", "v1.31.1"),
            release("k-1.31.2", "v1.31.2"),
        ];
        match select_release(&releases, "v1.31.2") {
            ReleaseLookup::Found(found) => {
                assert_eq!(found.name, "k-1.31.2");
                assert_eq!(found.revision, revision_of(&releases[1].spec.content));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_version_is_not_found() {
        let lookup = select_release(&[release("a", "v1.31.1")], "v1.32.0");
        assert_eq!(lookup, ReleaseLookup::NotFound);
        assert!(lookup.explain("v1.32.0").contains("no NodeRelease"));
    }

    #[test]
    fn a_release_marked_invalid_or_failing_validation_is_not_used() {
        let marked = with_valid(release("marked", "v1.31.2"), "False");
        let mut broken = release("broken", "v1.31.2");
        broken.spec.content.artifacts[0].sha256 = "nothex".into();
        let lookup = select_release(&[marked, broken], "v1.31.2");
        let ReleaseLookup::Invalid(bad) = &lookup else {
            panic!("{lookup:?}")
        };
        assert_eq!(bad.len(), 2);
        let text = lookup.explain("v1.31.2");
        assert!(text.contains("marked") && text.contains("broken"), "{text}");
    }

    #[test]
    fn a_valid_condition_true_is_fine_and_one_invalid_beside_a_valid_one_is_ignored() {
        let good = with_valid(release("good", "v1.31.2"), "True");
        let bad = with_valid(release("bad", "v1.31.2"), "False");
        assert!(matches!(
            select_release(&[bad, good], "v1.31.2"),
            ReleaseLookup::Found(f) if f.name == "good"
        ));
    }

    #[test]
    fn two_valid_releases_for_one_version_are_ambiguous() {
        let lookup = select_release(
            &[release("b", "v1.31.2"), release("a", "v1.31.2")],
            "v1.31.2",
        );
        assert_eq!(
            lookup,
            ReleaseLookup::Ambiguous(vec!["a".into(), "b".into()])
        );
        assert!(lookup.explain("v1.31.2").contains("keep exactly one"));
    }
}
