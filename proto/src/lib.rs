//! The `inplace.dev/v1alpha1` API: what a node should run ([`NodeRelease`]), where and how
//! fast ([`NodeRollout`]), and one node's plan ([`NodeUpdatePlan`]). Types only, plus the
//! pure functions every component shares: validation, the revision hash, CRD generation,
//! the reading of an agent's report ([`outcome`]) and the condition setter ([`condition`]).

pub mod architecture;
pub mod condition;
pub mod content;
pub mod crd;
pub mod duration;
pub mod gates;
pub mod maintenance_window;
pub mod oci;
pub mod outcome;
pub mod plan;
pub mod reason;
pub mod release;
pub mod revision;
pub mod rollout;
pub mod rollout_slots;
pub mod steering;
pub mod validate;
pub mod version;

pub use architecture::Architecture;
pub use condition::{ConditionUpdate, set_condition};
pub use content::{
    Activation, ActivationMode, AgentImage, ArchitectureBuild, ArchiveMember, Artifact,
    ArtifactType, CONFEXT_DIR, HealthChecks, HttpCheck, UpdateContent,
};
pub use duration::Duration;
pub use gates::RolloutGates;
pub use maintenance_window::{MaintenanceWindow, Weekday};
pub use outcome::{AgentReport, Outcome};
pub use plan::{
    ArtifactProgress, DesiredState, NodeUpdatePlan, NodeUpdatePlanSpec, NodeUpdatePlanStatus, Phase,
};
pub use reason::Reason;
pub use release::{NodeRelease, NodeReleaseSpec, NodeReleaseStatus, Unusable};
pub use revision::revision_of;
pub use rollout::{
    Disruption, DrainSpec, ForeignDisruption, NodeCounts, NodeFailure, NodeRollout,
    NodeRolloutSpec, NodeRolloutStatus, OnDrainTimeout, StagingSpec, TopologySpread,
};
pub use steering::Steering;
pub use validate::{FieldError, Problems};

/// The API group.
pub const GROUP: &str = "inplace.dev";
/// The API version.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` as written in objects.
pub const API_VERSION: &str = "inplace.dev/v1alpha1";
