//! The inplace node agent as a library: everything but argument parsing.
//!
//! One module per external system and per concern: [`settings`] (configuration),
//! [`check_config`] (what `check-config` checks on the node),
//! [`policy`] (node-local policy, pure), [`machine`] (the state machine, pure), [`journal`]
//! (crash-safe local state), [`links`] (atomic swaps), [`store`] (where files live),
//! [`fetch`] (downloads), [`signature`] (minisign signatures), [`archive`] (hardened tar extraction), [`systemd`] (D-Bus),
//! [`health`] (checks), [`status`] (the plan's status), [`watch`] (the plan), [`notify`]
//! (sd_notify), [`metrics`] and [`metrics_server`] (Prometheus), [`self_update`] (the guard of
//! an agent switch), and [`update`], which coordinates them.

/// This build's version, as the agent reports it (`--version`, the plan's status, its user
/// agent) and as an agent switch checks it against `spec.agent.version`. The package version,
/// unless `INPLACE_AGENT_VERSION` is set at build time: the node tests build a second and a
/// third agent from this tree that way, rebuilding only this crate rather than every
/// dependency at a bumped package version.
pub const BUILD_VERSION: &str = match option_env!("INPLACE_AGENT_VERSION") {
    Some(version) => version,
    None => env!("CARGO_PKG_VERSION"),
};

pub mod archive;
pub mod beneath;
pub mod check_config;
pub mod confext;
pub mod credentials;
pub mod failpoints;
pub mod fetch;
pub mod health;
pub mod journal;
pub mod kube_client;
pub mod links;
pub mod machine;
pub mod metrics;
pub mod metrics_server;
pub mod mirrors;
pub mod notify;
pub mod owner;
pub mod policy;
pub mod policy_table;
pub mod power;
pub mod registry;
pub mod self_update;
pub mod settings;
pub mod signature;
pub mod status;
pub mod store;
pub mod systemd;
pub mod sysupdate;
pub mod update;
pub mod url_prefix;
pub mod watch;
