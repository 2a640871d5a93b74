//! The NodeRollout wing: everything between a rollout object and the plans it writes. The
//! controller ([`controller`]) gathers the rollout's per-node view ([`view`]) from the watch
//! caches, asks the pure decision (`crate::decision`) and carries out its actions ([`writes`]);
//! the rest are the inputs it reads (plans, Node readiness, alerts, kured's lock) and the pacing
//! of its rounds and status writes.

pub mod alert_gate;
pub mod controller;
pub mod events;
pub mod fleetlock;
pub mod kured_lock;
pub mod node_readiness;
pub mod plan_watch;
pub mod plans;
pub mod preview;
pub mod round_pacing;
pub mod status_pacing;
pub mod teardown;
pub mod view;
pub mod writes;
