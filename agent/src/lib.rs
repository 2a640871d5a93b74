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
/// agent) and as an agent switch checks it against `spec.agent.version`: the stamp's.
pub fn build_version() -> &'static str {
    // Read through black_box, so that the bytes are read from the binary at run time and
    // never folded into the code: a stamped copy reports its stamp everywhere.
    let field = &std::hint::black_box(&VERSION_STAMP)[VERSION_STAMP_MARK_LEN..];
    let len = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    std::str::from_utf8(&field[..len]).unwrap_or(COMPILED_VERSION)
}

/// The version compiled in: the package version, unless `INPLACE_AGENT_VERSION` is set at
/// build time.
const COMPILED_VERSION: &str = match option_env!("INPLACE_AGENT_VERSION") {
    Some(version) => version,
    None => env!("CARGO_PKG_VERSION"),
};

/// The mark the version stamp starts with, once in the binary: the test beds make an agent
/// at another version by copying one build and writing the version after the mark
/// (`inplace_tests::agent_images::stamp_version`), where compiling the agent again per
/// version cost each node test about 90 s (docs/development/testing.md § Where the time
/// goes).
const VERSION_STAMP_MARK: &[u8] = b"inplace-agent version stamp:";

/// The mark's length, computed when compiling: `VERSION_STAMP_MARK.len()` in code that runs
/// kept a second copy of the mark in a build without MIR optimisations (clippy-driver's, which
/// `make test` builds with), and the stamping refuses a binary with two.
const VERSION_STAMP_MARK_LEN: usize = VERSION_STAMP_MARK.len();

/// Room for the version after the mark; unused bytes are NUL.
const VERSION_STAMP_ROOM: usize = 64;

static VERSION_STAMP: [u8; VERSION_STAMP_MARK.len() + VERSION_STAMP_ROOM] =
    version_stamp(COMPILED_VERSION);

const fn version_stamp(version: &str) -> [u8; VERSION_STAMP_MARK.len() + VERSION_STAMP_ROOM] {
    let version = version.as_bytes();
    assert!(
        version.len() <= VERSION_STAMP_ROOM,
        "the version does not fit its stamp"
    );
    let mut stamp = [0; VERSION_STAMP_MARK.len() + VERSION_STAMP_ROOM];
    let mut i = 0;
    while i < VERSION_STAMP_MARK.len() {
        stamp[i] = VERSION_STAMP_MARK[i];
        i += 1;
    }
    let mut j = 0;
    while j < version.len() {
        stamp[VERSION_STAMP_MARK.len() + j] = version[j];
        j += 1;
    }
    stamp
}

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
