//! The agent's configuration: TOML fragments read once, merged, validated into [`Settings`].
//!
//! Layers, later ones win key by key (lists are replaced, not appended):
//! `/usr/lib/inplace/agent.toml` (vendor defaults), `/etc/inplace/agent.toml`, then
//! `/etc/inplace/agent.d/*.toml` in lexical order. Every field of every fragment is optional;
//! unknown keys are errors that name the file and the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration as StdDuration;

use crate::url_prefix::UrlPrefix;
use build::build;
use fragment::{Fragment, parse_fragment};

/// The main configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/inplace/agent.toml";
/// The vendor defaults, shipped with the package.
pub const VENDOR_CONFIG: &str = "/usr/lib/inplace/agent.toml";

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file is not valid TOML, has an unknown key or a value of the wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What toml said (names the key and the line).
        message: String,
    },
    /// The merged settings break a rule.
    #[error("invalid setting {key}: {message}")]
    Invalid {
        /// The key, as `section.key`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// How the agent authenticates to the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeAuth {
    /// A kubeconfig file (by default the kubelet's own, so the agent is `system:node:<name>`).
    Kubeconfig(PathBuf),
    /// A bearer token read from a file, with the server URL and an optional CA bundle.
    TokenFile {
        /// The API server URL.
        server: String,
        /// The file holding the token (re-read by the client when it rotates).
        token_file: PathBuf,
        /// PEM CA bundle for the server's certificate; the system roots when absent.
        ca_file: Option<PathBuf>,
    },
}

impl Policy {
    /// Every directory the agent may make links in: the bases below which no symlink may
    /// be followed (`beneath.rs`).
    pub fn link_roots(&self) -> Vec<PathBuf> {
        self.allowed_target_dirs
            .iter()
            .chain(&self.allowed_config_roots)
            .cloned()
            .collect()
    }
}

/// What plans may ask of this node. Checked before any I/O (see `policy.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Artifact URLs must be under one of these (same scheme, host and port; the prefix's
    /// path segments first, see `url_prefix.rs`). Empty: no URL is allowed.
    pub allowed_url_prefixes: Vec<UrlPrefix>,
    /// Whether plain `http://` artifact URLs are allowed.
    pub allow_http: bool,
    /// Directories where Binary `path`s and Archive `to`s may land (the file itself, or
    /// any depth below).
    pub allowed_target_dirs: Vec<PathBuf>,
    /// Directories where Config artifacts' `path`s may land (any depth below). Empty by
    /// default: a node takes configuration only from where its policy says.
    pub allowed_config_roots: Vec<PathBuf>,
    /// Units a plan may restart or health-check.
    pub allowed_units: Vec<String>,
    /// Largest artifact accepted, in bytes; also caps downloads without a declared size.
    pub max_artifact_size: u64,
    /// Free bytes that extracting an archive may not eat into, on the state directory's file
    /// system (usually the kubelet's and containerd's too).
    pub reserved_disk_space: u64,
    /// Whether HTTP health checks may go to hosts other than loopback.
    pub allow_remote_health_checks: bool,
    /// Whether every artifact must carry a `signatureUrl` (a plan without one is refused
    /// before any I/O). Signatures that are given are verified either way.
    pub require_signatures: bool,
    /// Where the trusted minisign public keys (`*.pub`) live; read when a signature is
    /// verified, so adding or removing a key needs no restart.
    pub trusted_keys_dir: PathBuf,
}

/// Download behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadSettings {
    /// Attempts per artifact (first try included) before `DownloadFailed`.
    pub attempts: u32,
    /// TCP/TLS connect timeout.
    pub connect_timeout: StdDuration,
    /// Abort a transfer that delivers no byte for this long; also the window over which
    /// `min_speed` is measured.
    pub stall_timeout: StdDuration,
    /// Abort a transfer slower than this many bytes per second over a `stall_timeout`
    /// window (a server that sends one byte now and then is no stall, and would keep
    /// staging alive forever); 0 turns the check off.
    pub min_speed: u64,
    /// Give up on one artifact when it is not downloaded this long after its first
    /// request, retries and backoff included: a steady transfer just over `min_speed`
    /// would otherwise keep a multi-GiB download (and the rollout) going for days.
    pub artifact_deadline: StdDuration,
    /// First retry delay; doubled per attempt, with jitter.
    pub initial_backoff: StdDuration,
    /// Longest delay between attempts, `Retry-After` included.
    pub max_backoff: StdDuration,
}

/// Activation behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivationSettings {
    /// Activation attempts of one revision (agent restarts in the middle count) before the
    /// agent rolls back and gives up on it (`TooManyAttempts`).
    pub max_attempts: u32,
    /// How often health checks are sampled during the window.
    pub health_interval: StdDuration,
    /// Longest wait for one systemd job (restart, reload) to finish.
    pub job_timeout: StdDuration,
}

/// Host paths. Configurable so tests and unusual hosts can move them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// Where sysext links live (`/etc/extensions`).
    pub extensions_dir: PathBuf,
    /// Where sysext images are stored (`/opt/extensions`).
    pub images_dir: PathBuf,
    /// Root of the merged tree checked for `usr/lib/extension-release.d`, and below which
    /// systemd-sysupdate's transfer files are looked for (`/`).
    pub merged_root: PathBuf,
    /// The single-instance lock (`/run/inplace/agent.lock`).
    pub lock_file: PathBuf,
}

/// Where the agent serves its Prometheus metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    /// Whether to serve them at all.
    pub enabled: bool,
    /// The Unix socket (`/run/inplace/metrics.sock`, mode 0660).
    pub socket: PathBuf,
    /// An additional loopback TCP address; never a routable one (the metrics name the
    /// node's revision and failures, and the endpoint has no authentication).
    pub listen: Option<SocketAddr>,
}

/// Whether plans may replace the agent itself (`spec.agent`), and how long the new agent
/// has to confirm itself (docs/design/agent-self-update.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfUpdateSettings {
    /// Whether a plan may switch this node to another agent build. Off by default: a plan
    /// with `spec.agent` is `PolicyDenied` at `spec.agent`.
    pub allow: bool,
    /// Whether a plan may switch this node to a lower agent version than the running build.
    /// Off by default: such a plan is `DowngradeDenied` at `spec.agent.version` (an old
    /// agent is signed as well as a new one, so a signature alone does not stop a rollback
    /// to a vulnerable build).
    pub allow_downgrade: bool,
    /// The minisign public keys an agent image's signature must come from. Defaults to
    /// `policy.trusted_keys_dir` (the keys of Kubernetes artifacts); a separate directory
    /// keeps whoever signs node artifacts from signing the agent, which runs as root.
    pub trusted_keys_dir: PathBuf,
    /// The guard's deadline: the new agent must confirm itself (its version, its image's
    /// sha256, a status write with its identity) within this long, or the guard restores
    /// the previous agent.
    pub confirm_timeout: StdDuration,
}

/// The validated configuration, built once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// This node's name; the agent watches the plan of that name only.
    pub node_name: String,
    /// The agent's own state: journal, content-addressed store, temporary files.
    pub state_dir: PathBuf,
    /// Credentials for the API server.
    pub kube: KubeAuth,
    /// The node-local policy.
    pub policy: Policy,
    /// Download behaviour.
    pub download: DownloadSettings,
    /// Activation behaviour.
    pub activation: ActivationSettings,
    /// Host paths.
    pub paths: Paths,
    /// Metrics endpoints.
    pub metrics: MetricsSettings,
    /// Agent switches.
    pub self_update: SelfUpdateSettings,
    /// Where the node's registry and download credentials are (the files, never the secrets).
    pub credentials: crate::credentials::CredentialSettings,
    /// Other places serving the same artifacts, tried before the origin.
    pub mirrors: crate::mirrors::Mirrors,
}

/// The files read for a main configuration file: vendor defaults (only for the default
/// location), the file, and `agent.d/*.toml` beside it, sorted.
pub fn layer_files(main: &Path) -> Result<Vec<PathBuf>, SettingsError> {
    let mut files = Vec::new();
    if main == Path::new(DEFAULT_CONFIG) {
        files.push(PathBuf::from(VENDOR_CONFIG));
    }
    files.push(main.to_path_buf());
    let dropins = main.with_file_name("agent.d");
    match std::fs::read_dir(&dropins) {
        Ok(entries) => {
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|ext| ext == "toml"))
                .collect();
            found.sort();
            files.extend(found);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(SettingsError::Read {
                path: dropins,
                source,
            });
        }
    }
    Ok(files)
}

/// Reads `main` and its layers (missing files are skipped) into validated settings.
/// `hostname` supplies the default node name.
pub fn load(
    main: &Path,
    hostname: impl FnOnce() -> Option<String>,
) -> Result<Settings, SettingsError> {
    let mut merged = Fragment::default();
    for path in layer_files(main)? {
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(SettingsError::Read { path, source }),
        };
        merged.merge(parse_fragment(&path, &text)?);
    }
    build(merged, hostname)
}

/// Parses and validates one TOML text as if it were the only layer (for tests and
/// `check-config` on a single file).
pub fn from_toml(
    text: &str,
    hostname: impl FnOnce() -> Option<String>,
) -> Result<Settings, SettingsError> {
    build(parse_fragment(Path::new("<inline>"), text)?, hostname)
}

mod build;
mod fragment;
#[cfg(test)]
mod tests;
