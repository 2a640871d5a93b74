//! The three hooks, wired to the I/O edges: the release catalog (management cluster), the
//! workload clusters (through their kubeconfig Secrets) and the drainer. The decisions
//! themselves are the pure functions in [`crate::claim`] and [`crate::progress`].

use std::sync::Arc;

use inplace_proto::{DesiredState, NodeUpdatePlan};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde_json::Value;

use crate::catalog::{ReleaseCatalog, ReleaseLookup};
use crate::claim::{self, ObjectPair, architecture, control_plane};
use crate::drain::{DrainStatus, Drainer};
use crate::error::Error;
use crate::hooks::{
    CanUpdateMachineRequest, CanUpdateMachineResponse, CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse, HOOKS_API_VERSION, Patch, PatchType, ResponseStatus,
    UpdateMachineRequest, UpdateMachineResponse,
};
use crate::machine_plan;
use crate::machines::{self, ManagementMachines};
use crate::progress::{self, Answer, NextStep};
use crate::target::{MachineTarget, cluster_of};
use crate::workload::WorkloadClusters;

/// The field manager of the plan specs this extension writes (server-side apply). Distinct
/// from the standalone controller's `inplace-controller`, so `managedFields` tell who wrote
/// a plan; the apply is forced, so the extension takes over a plan the controller wrote.
pub const FIELD_MANAGER: &str = "inplace-capi";

/// How the hooks behave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookSettings {
    /// `retryAfterSeconds` while an update is in progress.
    pub retry_after_seconds: i32,
    /// Whether to drain a node (after staging, before activation).
    pub drain: bool,
    /// How long one `UpdateMachine` call may spend on the clusters before it answers "in
    /// progress" instead (kept below the `timeoutSeconds` announced to Cluster API, so a
    /// slow workload cluster gives a retry, not a timed-out call).
    pub update_machine_deadline: std::time::Duration,
}

impl Default for HookSettings {
    fn default() -> Self {
        HookSettings {
            retry_after_seconds: 5,
            drain: false,
            update_machine_deadline: std::time::Duration::from_secs(25),
        }
    }
}

/// The hook handlers and what they need.
pub struct Extension {
    catalog: Arc<dyn ReleaseCatalog>,
    machines: Arc<dyn ManagementMachines>,
    workloads: Arc<dyn WorkloadClusters>,
    drainer: Arc<dyn Drainer>,
    settings: HookSettings,
}

impl Extension {
    /// Handlers over the given edges.
    pub fn new(
        catalog: Arc<dyn ReleaseCatalog>,
        machines: Arc<dyn ManagementMachines>,
        workloads: Arc<dyn WorkloadClusters>,
        drainer: Arc<dyn Drainer>,
        settings: HookSettings,
    ) -> Self {
        Extension {
            catalog,
            machines,
            workloads,
            drainer,
            settings,
        }
    }

    /// The release for a changed version, and whether the object's node and workload
    /// cluster can take a plan at all: a claim for a Machine whose node the release has no
    /// build for, for a Cluster the management cluster does not hold, for a cluster without
    /// the NodeUpdatePlan CRD (so without agents) or without a usable kubeconfig Secret
    /// would be a claim the extension cannot honour.
    async fn lookup_if_changed(
        &self,
        change: Option<&claim::VersionChange>,
        object: &Value,
    ) -> Result<Option<ReleaseLookup>, Error> {
        let Some(change) = change else {
            return Ok(None);
        };
        let lookup = self.catalog.lookup(&change.to).await?;
        if !matches!(lookup, ReleaseLookup::Found(_)) {
            return Ok(Some(lookup));
        }
        let architecture = self.node_architecture(object).await?;
        let lookup = architecture::restrict(lookup, architecture.as_deref());
        if !matches!(lookup, ReleaseLookup::Found(_)) {
            return Ok(Some(lookup));
        }
        let Some((namespace, cluster)) = cluster_of(object) else {
            return Ok(Some(ReleaseLookup::ClusterNotReady(
                "the object names no Cluster (label cluster.x-k8s.io/cluster-name, spec.clusterName) and no namespace".into(),
            )));
        };
        // The request names namespace and cluster: only a Cluster the management cluster
        // holds has its kubeconfig Secret read (a Secret named like one elsewhere is
        // whoever wrote it).
        if !self.machines.cluster_exists(&namespace, &cluster).await? {
            return Ok(Some(ReleaseLookup::ClusterNotReady(format!(
                "Cluster {namespace}/{cluster} does not exist in the management cluster"
            ))));
        }
        let client = match self.workloads.client(&namespace, &cluster).await {
            Ok(client) => client,
            Err(error @ Error::Kubeconfig(_)) => {
                return Ok(Some(ReleaseLookup::ClusterNotReady(error.to_string())));
            }
            Err(error) => return Err(error),
        };
        let plans = Api::<NodeUpdatePlan>::all(client);
        match plans.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => Ok(Some(lookup)),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                Ok(Some(ReleaseLookup::ClusterNotReady(format!(
                    "workload cluster {namespace}/{cluster} has no NodeUpdatePlan CRD, so no inplace agents"
                ))))
            }
            Err(source) => Err(Error::Workload {
                cluster: format!("{namespace}/{cluster}"),
                action: "listing NodeUpdatePlans".into(),
                source,
            }),
        }
    }

    /// The architecture of a Machine's node, as the stored Machine has it (Cluster API copies
    /// its Node's `nodeInfo`; the hooks' requests carry no status). `None` for a MachineSet,
    /// a Machine not stored or not yet on a node.
    async fn node_architecture(&self, object: &Value) -> Result<Option<String>, Error> {
        let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
        let (Some("Machine"), Some(namespace), Some(name)) = (
            text("/kind"),
            text("/metadata/namespace"),
            text("/metadata/name"),
        ) else {
            return Ok(None);
        };
        let stored = self.machines.machine(namespace, name).await?;
        Ok(stored
            .as_ref()
            .and_then(architecture::of_machine)
            .map(str::to_owned))
    }

    /// The claim for one request: `main` holds the version at `version_pointer`, `others`
    /// are the provider objects. `Err` is a message for a `Failure` answer (a broken
    /// request, or a release lookup that could not be made).
    async fn decide_claim(
        &self,
        hook: &str,
        main: ObjectPair<'_>,
        others: &[ObjectPair<'_>],
        version_pointer: &str,
    ) -> Result<claim::Claim, String> {
        if !main.current.is_object() || !main.desired.is_object() {
            return Err(format!(
                "the request needs current.{0} and desired.{0} objects",
                main.label
            ));
        }
        let change = claim::version_change(main.current, main.desired, version_pointer);
        let lookup = self
            .lookup_if_changed(change.as_ref(), main.desired)
            .await
            .map_err(|error| error.to_string())?;
        let claim = claim::claim(main, others, version_pointer, lookup.as_ref());
        tracing::info!(
            object = %object_key(main.desired),
            claimed = !claim.operations.is_empty(),
            "{hook}: {}",
            claim.message
        );
        Ok(claim)
    }

    /// `CanUpdateMachine`: claims `spec.version` when a valid release brings it.
    pub async fn can_update_machine(
        &self,
        request: &CanUpdateMachineRequest,
    ) -> CanUpdateMachineResponse {
        let (current, desired) = (&request.current, &request.desired);
        let pair = |label, current, desired| ObjectPair {
            label,
            current,
            desired,
            compared: claim::MACHINE_SPEC,
        };
        let decision = self
            .decide_claim(
                "CanUpdateMachine",
                pair("machine", &current.machine, &desired.machine),
                &[
                    pair(
                        "infrastructureMachine",
                        &current.infrastructure_machine,
                        &desired.infrastructure_machine,
                    ),
                    pair(
                        "bootstrapConfig",
                        &current.bootstrap_config,
                        &desired.bootstrap_config,
                    ),
                ],
                claim::MACHINE_VERSION,
            )
            .await;
        let (status, message, machine_patch) = match decision {
            Ok(claim) => (
                ResponseStatus::Success,
                claim.message.clone(),
                claim.patch_bytes().map(json_patch),
            ),
            Err(message) => (ResponseStatus::Failure, message, None),
        };
        CanUpdateMachineResponse {
            api_version: HOOKS_API_VERSION.to_owned(),
            kind: "CanUpdateMachineResponse".to_owned(),
            status,
            message,
            machine_patch,
            infrastructure_machine_patch: None,
            bootstrap_config_patch: None,
            affects_availability: None,
        }
    }

    /// `CanUpdateMachineSet`: claims `spec.template.spec.version` when a valid release
    /// brings it.
    pub async fn can_update_machine_set(
        &self,
        request: &CanUpdateMachineSetRequest,
    ) -> CanUpdateMachineSetResponse {
        let (current, desired) = (&request.current, &request.desired);
        let pair = |label, current, desired| ObjectPair {
            label,
            current,
            desired,
            compared: claim::TEMPLATE_SPEC,
        };
        let decision = self
            .decide_claim(
                "CanUpdateMachineSet",
                pair("machineSet", &current.machine_set, &desired.machine_set),
                &[
                    pair(
                        "infrastructureMachineTemplate",
                        &current.infrastructure_machine_template,
                        &desired.infrastructure_machine_template,
                    ),
                    pair(
                        "bootstrapConfigTemplate",
                        &current.bootstrap_config_template,
                        &desired.bootstrap_config_template,
                    ),
                ],
                claim::MACHINE_SET_VERSION,
            )
            .await;
        let (status, message, machine_set_patch) = match decision {
            Ok(claim) => (
                ResponseStatus::Success,
                claim.message.clone(),
                claim.patch_bytes().map(json_patch),
            ),
            Err(message) => (ResponseStatus::Failure, message, None),
        };
        CanUpdateMachineSetResponse {
            api_version: HOOKS_API_VERSION.to_owned(),
            kind: "CanUpdateMachineSetResponse".to_owned(),
            status,
            message,
            machine_set_patch,
            infrastructure_machine_template_patch: None,
            bootstrap_config_template_patch: None,
            affects_availability: None,
        }
    }

    /// `UpdateMachine`: ensures the node's plan for the release (drained first when
    /// configured) and answers from its status. Idempotent.
    pub async fn update_machine(&self, request: &UpdateMachineRequest) -> UpdateMachineResponse {
        let deadline = self.settings.update_machine_deadline;
        let answer =
            match tokio::time::timeout(deadline, self.drive(&request.desired.machine)).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) if error.is_transient() => {
                    Answer::InProgress(format!("retrying after a transient error: {error}"))
                }
                Ok(Err(error)) => Answer::Failed(error.to_string()),
                Err(_) => Answer::InProgress(format!(
                    "the clusters did not answer within {}s; retrying",
                    deadline.as_secs()
                )),
            };
        tracing::info!(
            machine = %object_key(&request.desired.machine),
            "UpdateMachine: {answer:?}"
        );
        answer.into_response(self.settings.retry_after_seconds)
    }

    async fn drive(&self, machine: &Value) -> Result<Answer, Error> {
        let target = self.verified_target(machine).await?;
        // Checked again here, on the stored Machine: a CanUpdateMachine claim is no proof
        // that this call follows one (anyone who reaches the extension can call).
        let lookup = self.catalog.lookup(&target.version).await?;
        let unusable = |lookup: ReleaseLookup| {
            Error::NoRelease(format!(
                "cannot update Machine {}/{} in place: {}",
                target.namespace,
                target.name,
                lookup.explain(&target.version)
            ))
        };
        let release = match control_plane::restrict(lookup, target.control_plane) {
            ReleaseLookup::Found(found) => found,
            other => return Err(unusable(other)),
        };
        let cluster_key = format!("{}/{}", target.namespace, target.cluster);
        let client = self
            .workloads
            .client(&target.namespace, &target.cluster)
            .await?;
        let workload_error = |action: String| {
            let cluster = cluster_key.clone();
            move |source| Error::Workload {
                cluster,
                action,
                source,
            }
        };
        let node = Api::<Node>::all(client.clone())
            .get_opt(&target.node)
            .await
            .map_err(workload_error(format!("reading node {}", target.node)))?
            .ok_or_else(|| Error::NodeNotFound {
                cluster: cluster_key.clone(),
                node: target.node.clone(),
            })?;
        // A node the release has no build for is refused before any plan is written (its
        // agent would refuse the plan); the claim does the same when the Machine says.
        let on_node = architecture::of_node(&node);
        let release = match architecture::restrict(ReleaseLookup::Found(release), on_node) {
            ReleaseLookup::Found(found) => *found,
            other => return Err(unusable(other)),
        };
        let plans = Api::<NodeUpdatePlan>::all(client.clone());
        let existing = plans
            .get_opt(&target.node)
            .await
            .map_err(workload_error(format!(
                "reading NodeUpdatePlan {}",
                target.node
            )))?;

        let desired_state =
            match progress::next_step(existing.as_ref(), &release.revision, self.settings.drain) {
                NextStep::Write(state) => state,
                NextStep::Drain => match self.drainer.drain(&client, &target.node).await {
                    DrainStatus::Drained => DesiredState::Active,
                    DrainStatus::InProgress(message) => {
                        return Ok(Answer::InProgress(format!(
                            "node {}: Staged {}; draining: {message}",
                            target.node, release.name
                        )));
                    }
                    DrainStatus::Failed(message) => {
                        // Nothing on the node changed (the plan is still Staged): give it
                        // back to the scheduler before reporting the failure.
                        let message = match self.drainer.uncordon(&client, &target.node).await {
                            Ok(()) => message,
                            Err(error) => format!("{message} (uncordoning failed too: {error})"),
                        };
                        return Err(Error::Drain {
                            node: target.node.clone(),
                            message,
                        });
                    }
                },
            };

        let plan = machine_plan::ensure(&plans, existing, &target, &release, desired_state, &node)
            .await
            .map_err(workload_error(format!(
                "applying NodeUpdatePlan {}",
                target.node
            )))?;

        let answer = progress::answer(&target.node, &release.name, &release.revision, &plan);
        // Done, or failed back onto the previous (verified) revision: either way the node
        // is fit to run pods again.
        if self.settings.drain
            && !matches!(answer, Answer::InProgress(_))
            && let Err(message) = self.drainer.uncordon(&client, &target.node).await
        {
            return Ok(Answer::InProgress(format!(
                "{}; uncordoning failed, retrying: {message}",
                answer.message()
            )));
        }
        Ok(answer)
    }
}

impl Extension {
    /// What `UpdateMachine` may act on: the stored Machine the request names, when Cluster
    /// API is updating it in place and it wants what the request says, in an existing
    /// Cluster (see `machines.rs`).
    async fn verified_target(&self, requested: &Value) -> Result<MachineTarget, Error> {
        let requested = MachineTarget::from_request(requested)?;
        let stored = self
            .machines
            .machine(&requested.namespace, &requested.name)
            .await?;
        let target = machines::verify_request(&requested, stored.as_ref())?;
        if !self
            .machines
            .cluster_exists(&target.namespace, &target.cluster)
            .await?
        {
            return Err(Error::NotUpdatingInPlace(format!(
                "Machine {}/{}: its Cluster {} does not exist in the management cluster; nothing was done",
                target.namespace, target.name, target.cluster
            )));
        }
        Ok(target)
    }
}

fn json_patch(bytes: Vec<u8>) -> Patch {
    Patch {
        patch_type: PatchType::JSONPatch,
        patch: bytes,
    }
}

fn object_key(object: &Value) -> String {
    let text = |p: &str| object.pointer(p).and_then(Value::as_str).unwrap_or("?");
    format!("{}/{}", text("/metadata/namespace"), text("/metadata/name"))
}
