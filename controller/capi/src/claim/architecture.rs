//! Machines whose node has no build in the release (issue 39): decided in one place for
//! `CanUpdateMachine` (the claim, from the stored Machine's `status.nodeInfo.architecture`,
//! since Cluster API sends the hooks no status) and `UpdateMachine` (from the workload
//! Node's `kubernetes.io/arch` label, before any plan is written).
//!
//! A release whose artifacts are built for some architectures only cannot run on a node of
//! another: its agent would refuse the plan (`ArchitectureUnsupported`) and the update would
//! fail. Left unclaimed, the change is Cluster API's to make by replacing the Machine.

use inplace_proto::architecture::{ARCHITECTURE_LABEL, Architecture};
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use crate::catalog::ReleaseLookup;

/// Where a Machine holds its node's architecture (Cluster API copies the Node's
/// `status.nodeInfo`).
pub const MACHINE_ARCHITECTURE: &str = "/status/nodeInfo/architecture";

/// The lookup as it stands for a node of `architecture` (as Kubernetes names it; `None` when
/// unknown, which restricts nothing: the agent still refuses what it cannot run): a release
/// found with no build for it becomes [`ReleaseLookup::Refused`], naming the architecture
/// and the builds the release has. Anything else is returned unchanged.
pub fn restrict(lookup: ReleaseLookup, architecture: Option<&str>) -> ReleaseLookup {
    let (ReleaseLookup::Found(found), Some(architecture)) = (&lookup, architecture) else {
        return lookup;
    };
    let Some(builds) = found.spec.content.architectures() else {
        return lookup;
    };
    if Architecture::parse(architecture).is_some_and(|a| builds.contains(&a)) {
        return lookup;
    }
    let builds: Vec<&str> = builds.iter().map(|a| a.as_str()).collect();
    ReleaseLookup::Refused(format!(
        "the node runs {architecture} and NodeRelease {} has no build for it (its artifacts are built for {}), so Cluster API replaces the Machine instead",
        found.name,
        if builds.is_empty() {
            "no architecture every artifact is built for".to_owned()
        } else {
            builds.join(", ")
        }
    ))
}

/// The architecture a workload Node is labelled with (`kubernetes.io/arch`), if any.
pub fn of_node(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(ARCHITECTURE_LABEL))
        .map(String::as_str)
}

/// The node architecture a Machine object carries, if any.
pub fn of_machine(machine: &Value) -> Option<&str> {
    machine
        .pointer(MACHINE_ARCHITECTURE)
        .and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::select_release;
    use crate::catalog::tests::release;

    /// A release whose one artifact is built for amd64 only.
    pub(crate) fn amd64_only() -> ReleaseLookup {
        let mut built = release("kubernetes-v1.31.2", "v1.31.2");
        built.spec.content.artifacts[0].architecture = Some(Architecture::Amd64);
        select_release(&[built], "v1.31.2")
    }

    #[test]
    fn a_node_without_a_build_is_refused_naming_its_architecture_and_the_builds() {
        let ReleaseLookup::Refused(why) = restrict(amd64_only(), Some("arm64")) else {
            panic!("not refused");
        };
        assert_eq!(
            why,
            "the node runs arm64 and NodeRelease kubernetes-v1.31.2 has no build for it (its artifacts are built for amd64), so Cluster API replaces the Machine instead"
        );
        assert!(matches!(
            restrict(amd64_only(), Some("mips")),
            ReleaseLookup::Refused(_)
        ));
    }

    #[test]
    fn a_node_with_a_build_an_unknown_node_and_a_release_for_every_architecture_pass() {
        assert_eq!(restrict(amd64_only(), Some("amd64")), amd64_only());
        assert_eq!(restrict(amd64_only(), None), amd64_only());
        let anywhere = select_release(&[release("kubernetes-v1.31.2", "v1.31.2")], "v1.31.2");
        assert_eq!(restrict(anywhere.clone(), Some("arm64")), anywhere);
        assert_eq!(
            restrict(ReleaseLookup::NotFound, Some("arm64")),
            ReleaseLookup::NotFound
        );
    }
}
