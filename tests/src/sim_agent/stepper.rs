//! Simulated agents that move one phase per [`Stepper::step`]: for tests that interleave the
//! agents' progress with their own calls (Cluster API's hooks polled between steps).

use inplace_proto::NodeUpdatePlan;
use kube::api::{Api, Patch, PatchParams};

use super::SimConfig;
use super::protocol::{Local, Seen, next_step, status_patch};

/// One simulated agent per node, each reading and writing only its own plan through the
/// client it was given (the node's own identity, through the shipped RBAC and admission
/// policy, as the agent does). What the agent knows is read back from the plan's status,
/// so a step needs nothing but the plan.
pub struct Stepper {
    nodes: Vec<(String, Api<NodeUpdatePlan>)>,
    config: SimConfig,
}

impl Stepper {
    /// Agents for `nodes`, each with the client its node's plan is read and written with.
    pub fn new(nodes: Vec<(String, kube::Client)>, config: SimConfig) -> Stepper {
        let nodes = nodes
            .into_iter()
            .map(|(node, client)| (node, Api::all(client)))
            .collect();
        Stepper { nodes, config }
    }

    /// Moves every node's plan one phase on (the step's duration is not waited for).
    pub async fn step(&self) -> anyhow::Result<()> {
        for (node, plans) in &self.nodes {
            let Some(plan) = plans.get_opt(node).await? else {
                continue;
            };
            let seen = Seen::of(&plan);
            let local = Local::of(&plan, &self.config);
            let Some((_, next)) = next_step(&local, &seen, &self.config, node) else {
                continue;
            };
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let patch = status_patch(&next, &seen, &self.config, node, &now);
            plans
                .patch_status(node, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        Ok(())
    }
}
