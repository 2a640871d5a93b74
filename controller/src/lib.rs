//! The inplace controller: validates NodeReleases, and turns NodeRollouts into per-node
//! NodeUpdatePlans, a few activation slots at a time.
//!
//! The rollout's rules are one pure function ([`decision::decide`]); everything else here
//! gathers its inputs from watch caches and carries out its actions. The code lives in three
//! wings: [`rollout`] (rollouts to plans), [`release`] (releases) and [`runtime`] (what runs
//! them); [`context`], [`metrics`] and [`error`] are shared by all three.

pub mod context;
pub mod decision;
pub mod error;
pub mod metrics;
pub mod release;
pub mod rollout;
pub mod runtime;

pub use error::{Error, Result};
