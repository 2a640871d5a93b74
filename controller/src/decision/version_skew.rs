//! The version-skew guard, the decision's first phase: a release whose `kubernetesVersion`
//! breaks Kubernetes' version skew policy is refused before any node is touched — the
//! rules the Cluster API extension applies to a Machine (`inplace_proto::version`, one
//! comparison for both), plus the API server's own version:
//!
//! * a kubelet must not be a minor version newer than kube-apiserver (`allowVersionSkew`);
//! * a node moves one minor version at a time (`allowVersionSkew`);
//! * a node's kubelet never goes down (`allowDowngrade`).
//!
//! A release without a `kubernetesVersion`, and a node whose kubelet reports no version
//! that parses, are not judged: there is nothing to order.

use std::time::Duration;

use inplace_proto::reason::Reason;
use inplace_proto::version::{is_downgrade, is_newer_minor, skips_a_minor};

use inplace_proto::NodeRolloutSpec;

use super::{NodeView, RolloutInput};

/// How soon a rollout refused because the API server is older than the release is looked
/// at again: no watch says when the control plane is upgraded.
pub const SERVER_VERSION_RECHECK: Duration = Duration::from_secs(60);

/// Whether the guard needs the API server's version: for a release that brings a
/// Kubernetes version (`release`), unless the rollout allows skew. The rollout's round and
/// its preview ask `/version` only then.
pub fn asks_api_server(spec: &NodeRolloutSpec, release: Option<&str>) -> bool {
    release.is_some() && !spec.allow_version_skew
}

/// Nodes named in a refusal's message at most; the rest are counted.
const NAMED_NODES: usize = 10;

/// Why the rollout touches no node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refusal {
    /// `VersionSkewDenied` or `DowngradeDenied`.
    pub reason: Reason,
    /// Names the release, both versions and the nodes concerned.
    pub message: String,
    /// Whether the answer depends on the API server's version, which no watch follows.
    pub recheck_after: Option<Duration>,
}

/// The refusal of the rollout's release by the skew policy, if it breaks it. `owned` are
/// the nodes the rollout would update.
pub(super) fn refusal(input: &RolloutInput<'_>, owned: &[&NodeView]) -> Option<Refusal> {
    let release = input.versions.release.as_deref()?;
    let spec = input.spec;
    let name = &spec.release;
    if !spec.allow_version_skew
        && let Some(server) = input.versions.api_server.as_deref()
        && is_newer_minor(release, server)
    {
        return Some(Refusal {
            reason: Reason::VersionSkewDenied,
            message: format!(
                "release {name:?} brings kubelet {release}, a minor version newer than the API server's {server}: \
                 a kubelet must not be newer than kube-apiserver; upgrade the control plane first or set \
                 allowVersionSkew; no node is touched"
            ),
            recheck_after: Some(SERVER_VERSION_RECHECK),
        });
    }
    if !spec.allow_downgrade {
        let lower = nodes_where(owned, |kubelet| is_downgrade(kubelet, release));
        if !lower.is_empty() {
            return Some(Refusal {
                reason: Reason::DowngradeDenied,
                message: format!(
                    "release {name:?} brings kubelet {release}, lower than {}; set allowDowngrade to \
                     go down; no node is touched",
                    named(&lower)
                ),
                recheck_after: None,
            });
        }
    }
    if !spec.allow_version_skew {
        let behind = nodes_where(owned, |kubelet| skips_a_minor(kubelet, release));
        if !behind.is_empty() {
            return Some(Refusal {
                reason: Reason::VersionSkewDenied,
                message: format!(
                    "release {name:?} brings kubelet {release}, more than one minor version above {}: \
                     a node moves one minor version at a time; roll out the minor versions between \
                     first or set allowVersionSkew; no node is touched",
                    named(&behind)
                ),
                recheck_after: None,
            });
        }
    }
    None
}

/// The nodes whose kubelet version `breaks` the rule, with that version.
fn nodes_where<'a>(
    owned: &[&'a NodeView],
    breaks: impl Fn(&str) -> bool,
) -> Vec<(&'a str, &'a str)> {
    owned
        .iter()
        .filter_map(|n| Some((n.name.as_str(), n.kubelet_version.as_deref()?)))
        .filter(|(_, kubelet)| breaks(kubelet))
        .collect()
}

/// `the kubelet of 2 nodes: a (v1.36.3), b (v1.36.3)`, at most [`NAMED_NODES`] named.
fn named(nodes: &[(&str, &str)]) -> String {
    let mut text = match nodes.len() {
        1 => "the kubelet of 1 node: ".to_owned(),
        n => format!("the kubelet of {n} nodes: "),
    };
    let shown: Vec<String> = nodes
        .iter()
        .take(NAMED_NODES)
        .map(|(node, kubelet)| format!("{node} ({kubelet})"))
        .collect();
    text.push_str(&shown.join(", "));
    if nodes.len() > NAMED_NODES {
        text.push_str(&format!(" and {} more", nodes.len() - NAMED_NODES));
    }
    text
}
