//! The inplace controller: validates NodeReleases, and turns NodeRollouts into per-node
//! NodeUpdatePlans, a few activation slots at a time.
//!
//! The rollout's rules are one pure function ([`decision::decide`]); everything else here
//! gathers its inputs from watch caches and carries out its actions.

pub mod alert_gate;
pub mod api_server_version;
pub mod cache_readiness;
pub mod context;
pub mod decision;
pub mod error;
pub mod events;
pub mod kured_lock;
pub mod leader;
pub mod metrics;
pub mod node_readiness;
pub mod plan_watch;
pub mod plans;
pub mod preview;
pub mod release_controller;
pub mod release_fetch;
pub mod release_import;
pub mod request_counting;
pub mod rollout_controller;
pub mod rollout_view;
pub mod rollout_writes;
pub mod round_pacing;
pub mod run;
pub mod status_pacing;
pub mod teardown;
pub mod watch_backoff;

pub use error::{Error, Result};
