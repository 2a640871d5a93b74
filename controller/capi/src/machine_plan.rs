//! The NodeUpdatePlan the extension writes for a Machine: the release's content for its
//! node, annotated with the Machine and owned by the Node (deleted with it).

use inplace_proto::{DesiredState, NodeUpdatePlan, NodeUpdatePlanSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};

use crate::catalog::FoundRelease;
use crate::extension::FIELD_MANAGER;
use crate::target::MachineTarget;

/// Annotation on plans written by the extension: `<namespace>/<machine>`.
pub const MACHINE_ANNOTATION: &str = "inplace.dev/capi-machine";

/// The node's plan for `release` in `desired_state`: `existing` when it says so already (then
/// nothing is written, so repeated calls do not even touch the object), else the plan
/// applied (server-side, forced: the extension takes over a plan the controller wrote).
pub async fn ensure(
    plans: &Api<NodeUpdatePlan>,
    existing: Option<NodeUpdatePlan>,
    target: &MachineTarget,
    release: &FoundRelease,
    desired_state: DesiredState,
    node: &Node,
) -> Result<NodeUpdatePlan, kube::Error> {
    match existing {
        Some(plan) if is_current(&plan, target, release, desired_state) => Ok(plan),
        _ => {
            let desired = desired(target, release, desired_state, node);
            let params = PatchParams::apply(FIELD_MANAGER).force();
            plans
                .patch(&target.node, &params, &Patch::Apply(&desired))
                .await
        }
    }
}

/// Whether `plan` already says what [`desired`] would write.
fn is_current(
    plan: &NodeUpdatePlan,
    target: &MachineTarget,
    release: &FoundRelease,
    desired_state: DesiredState,
) -> bool {
    plan.spec
        == NodeUpdatePlanSpec::for_release(
            &target.node,
            &release.name,
            &release.spec,
            desired_state,
        )
        && plan
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MACHINE_ANNOTATION))
            .is_some_and(|m| *m == format!("{}/{}", target.namespace, target.name))
        && plan
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Node" && o.name == target.node)
}

/// The plan this extension applies: the release's content for the node, owned by the Node
/// (deleted with it), annotated with the Machine it serves.
fn desired(
    target: &MachineTarget,
    release: &FoundRelease,
    desired_state: DesiredState,
    node: &Node,
) -> NodeUpdatePlan {
    let spec =
        NodeUpdatePlanSpec::for_release(&target.node, &release.name, &release.spec, desired_state);
    let mut plan = NodeUpdatePlan::new(&target.node, spec);
    plan.metadata.annotations = Some(
        [(
            MACHINE_ANNOTATION.to_owned(),
            format!("{}/{}", target.namespace, target.name),
        )]
        .into(),
    );
    if let Some(uid) = node.metadata.uid.clone() {
        plan.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: target.node.clone(),
            uid,
            ..Default::default()
        }]);
    }
    plan
}
