//! The agent's configuration: TOML fragments read once, merged, validated into [`Settings`].
//!
//! Layers, later ones win key by key (lists are replaced, not appended):
//! `/usr/lib/inplace/agent.toml` (vendor defaults), `/etc/inplace/agent.toml`, then
//! `/etc/inplace/agent.d/*.toml` in lexical order. Every field of every fragment is optional;
//! unknown keys are errors that name the file and the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration as StdDuration;

use inplace_proto::Duration;
use serde::Deserialize;

use crate::url_prefix::UrlPrefix;

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

/// One TOML file. Every field optional, unknown fields refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fragment {
    node_name: Option<String>,
    state_dir: Option<PathBuf>,
    #[serde(default)]
    kubernetes: KubernetesFragment,
    #[serde(default)]
    policy: PolicyFragment,
    #[serde(default)]
    download: DownloadFragment,
    #[serde(default)]
    activation: ActivationFragment,
    #[serde(default)]
    paths: PathsFragment,
    #[serde(default)]
    metrics: MetricsFragment,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct KubernetesFragment {
    kubeconfig: Option<PathBuf>,
    token_file: Option<PathBuf>,
    server: Option<String>,
    ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFragment {
    allowed_url_prefixes: Option<Vec<String>>,
    allow_http: Option<bool>,
    allowed_target_dirs: Option<Vec<PathBuf>>,
    allowed_units: Option<Vec<String>>,
    max_artifact_size: Option<u64>,
    reserved_disk_space: Option<u64>,
    allow_remote_health_checks: Option<bool>,
    require_signatures: Option<bool>,
    trusted_keys_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DownloadFragment {
    attempts: Option<u32>,
    connect_timeout: Option<Duration>,
    stall_timeout: Option<Duration>,
    min_speed: Option<u64>,
    artifact_deadline: Option<Duration>,
    initial_backoff: Option<Duration>,
    max_backoff: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActivationFragment {
    max_attempts: Option<u32>,
    health_interval: Option<Duration>,
    job_timeout: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathsFragment {
    extensions_dir: Option<PathBuf>,
    images_dir: Option<PathBuf>,
    merged_root: Option<PathBuf>,
    lock_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsFragment {
    enabled: Option<bool>,
    socket: Option<PathBuf>,
    listen: Option<String>,
}

impl Fragment {
    /// Lays `other` over `self`: every key `other` sets wins.
    fn merge(&mut self, other: Fragment) {
        fn over<T>(base: &mut Option<T>, top: Option<T>) {
            if top.is_some() {
                *base = top;
            }
        }
        over(&mut self.node_name, other.node_name);
        over(&mut self.state_dir, other.state_dir);
        let (k, o) = (&mut self.kubernetes, other.kubernetes);
        over(&mut k.kubeconfig, o.kubeconfig);
        over(&mut k.token_file, o.token_file);
        over(&mut k.server, o.server);
        over(&mut k.ca_file, o.ca_file);
        let (p, o) = (&mut self.policy, other.policy);
        over(&mut p.allowed_url_prefixes, o.allowed_url_prefixes);
        over(&mut p.allow_http, o.allow_http);
        over(&mut p.allowed_target_dirs, o.allowed_target_dirs);
        over(&mut p.allowed_units, o.allowed_units);
        over(&mut p.max_artifact_size, o.max_artifact_size);
        over(&mut p.reserved_disk_space, o.reserved_disk_space);
        over(
            &mut p.allow_remote_health_checks,
            o.allow_remote_health_checks,
        );
        over(&mut p.require_signatures, o.require_signatures);
        over(&mut p.trusted_keys_dir, o.trusted_keys_dir);
        let (d, o) = (&mut self.download, other.download);
        over(&mut d.attempts, o.attempts);
        over(&mut d.connect_timeout, o.connect_timeout);
        over(&mut d.stall_timeout, o.stall_timeout);
        over(&mut d.min_speed, o.min_speed);
        over(&mut d.artifact_deadline, o.artifact_deadline);
        over(&mut d.initial_backoff, o.initial_backoff);
        over(&mut d.max_backoff, o.max_backoff);
        let (a, o) = (&mut self.activation, other.activation);
        over(&mut a.max_attempts, o.max_attempts);
        over(&mut a.health_interval, o.health_interval);
        over(&mut a.job_timeout, o.job_timeout);
        let (q, o) = (&mut self.paths, other.paths);
        over(&mut q.extensions_dir, o.extensions_dir);
        over(&mut q.images_dir, o.images_dir);
        over(&mut q.merged_root, o.merged_root);
        over(&mut q.lock_file, o.lock_file);
        let (m, o) = (&mut self.metrics, other.metrics);
        over(&mut m.enabled, o.enabled);
        over(&mut m.socket, o.socket);
        over(&mut m.listen, o.listen);
    }
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
    /// Root of the merged tree checked for `usr/lib/extension-release.d` (`/`).
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

fn parse_fragment(path: &Path, text: &str) -> Result<Fragment, SettingsError> {
    toml::from_str(text).map_err(|e| SettingsError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().replace('\n', " "),
    })
}

fn invalid(key: &str, message: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key: key.to_owned(),
        message: message.into(),
    }
}

fn duration(value: Option<Duration>, default: StdDuration) -> StdDuration {
    value.map_or(default, |d| d.get())
}

fn build(
    f: Fragment,
    hostname: impl FnOnce() -> Option<String>,
) -> Result<Settings, SettingsError> {
    let node_name = match f.node_name {
        Some(name) => name,
        // The kubelet registers the lowercased hostname.
        None => hostname()
            .map(|h| h.to_lowercase())
            .ok_or_else(|| invalid("node_name", "not set and the hostname could not be read"))?,
    };
    // Node names are what the kubelet registers: lowercase RFC 1123 names.
    let node_name = node_name.trim().to_owned();
    inplace_proto::validate::check_object_name(&node_name).map_err(|m| invalid("node_name", m))?;

    let state_dir = f
        .state_dir
        .unwrap_or_else(|| PathBuf::from("/var/lib/inplace"));
    absolute("state_dir", &state_dir)?;

    let k = f.kubernetes;
    let kube = match (k.token_file, k.kubeconfig) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "kubernetes.token_file",
                "set either kubeconfig or token_file, not both",
            ));
        }
        (Some(token_file), None) => {
            let server = k.server.ok_or_else(|| {
                invalid("kubernetes.server", "required with kubernetes.token_file")
            })?;
            url::Url::parse(&server)
                .map_err(|e| invalid("kubernetes.server", format!("{server:?}: {e}")))?;
            KubeAuth::TokenFile {
                server,
                token_file,
                ca_file: k.ca_file,
            }
        }
        (None, kubeconfig) => {
            if k.server.is_some() || k.ca_file.is_some() {
                return Err(invalid(
                    "kubernetes.server",
                    "server and ca_file go with token_file; a kubeconfig names its own",
                ));
            }
            KubeAuth::Kubeconfig(
                kubeconfig.unwrap_or_else(|| PathBuf::from("/etc/kubernetes/kubelet.conf")),
            )
        }
    };

    let p = f.policy;
    let allow_http = p.allow_http.unwrap_or(false);
    let mut allowed_url_prefixes = Vec::new();
    for text in p.allowed_url_prefixes.unwrap_or_default() {
        let prefix: UrlPrefix = text
            .parse()
            .map_err(|e| invalid("policy.allowed_url_prefixes", e))?;
        if prefix.scheme() == "http" && !allow_http {
            return Err(invalid(
                "policy.allowed_url_prefixes",
                format!("{text:?} is http but policy.allow_http is false"),
            ));
        }
        allowed_url_prefixes.push(prefix);
    }
    let allowed_target_dirs = p
        .allowed_target_dirs
        .unwrap_or_else(|| vec![PathBuf::from("/opt/bin")]);
    for dir in &allowed_target_dirs {
        absolute("policy.allowed_target_dirs", dir)?;
        if dir == Path::new("/") {
            return Err(invalid(
                "policy.allowed_target_dirs",
                "\"/\" would allow every file on the node",
            ));
        }
    }
    let allowed_units = p.allowed_units.unwrap_or_else(|| {
        vec![
            "kubelet.service".to_owned(),
            "containerd.service".to_owned(),
        ]
    });
    for unit in &allowed_units {
        inplace_proto::validate::check_unit_name(unit)
            .map_err(|m| invalid("policy.allowed_units", m))?;
    }
    let trusted_keys_dir = p
        .trusted_keys_dir
        .unwrap_or_else(|| PathBuf::from("/etc/inplace/keys"));
    absolute("policy.trusted_keys_dir", &trusted_keys_dir)?;
    let max_artifact_size = p.max_artifact_size.unwrap_or(8 << 30);
    if max_artifact_size == 0 {
        return Err(invalid("policy.max_artifact_size", "must be positive"));
    }

    let d = f.download;
    let download = DownloadSettings {
        attempts: d.attempts.unwrap_or(5),
        connect_timeout: duration(d.connect_timeout, StdDuration::from_secs(10)),
        stall_timeout: duration(d.stall_timeout, StdDuration::from_secs(30)),
        min_speed: d.min_speed.unwrap_or(1024),
        // 8 GiB (the default max_artifact_size) at 400 KiB/s.
        artifact_deadline: duration(d.artifact_deadline, StdDuration::from_secs(6 * 3600)),
        initial_backoff: duration(d.initial_backoff, StdDuration::from_secs(1)),
        max_backoff: duration(d.max_backoff, StdDuration::from_secs(60)),
    };
    if download.attempts == 0 {
        return Err(invalid("download.attempts", "must be at least 1"));
    }
    if download.artifact_deadline.is_zero() {
        return Err(invalid("download.artifact_deadline", "must be positive"));
    }
    if download.stall_timeout.is_zero() || download.connect_timeout.is_zero() {
        return Err(invalid(
            "download.stall_timeout",
            "timeouts must be positive",
        ));
    }

    let a = f.activation;
    let activation = ActivationSettings {
        max_attempts: a.max_attempts.unwrap_or(3),
        health_interval: duration(a.health_interval, StdDuration::from_secs(1)),
        job_timeout: duration(a.job_timeout, StdDuration::from_secs(300)),
    };
    if activation.max_attempts == 0 {
        return Err(invalid("activation.max_attempts", "must be at least 1"));
    }
    if activation.health_interval.is_zero() || activation.job_timeout.is_zero() {
        return Err(invalid(
            "activation.health_interval",
            "intervals and timeouts must be positive",
        ));
    }

    let q = f.paths;
    let paths = Paths {
        extensions_dir: q
            .extensions_dir
            .unwrap_or_else(|| PathBuf::from("/etc/extensions")),
        images_dir: q
            .images_dir
            .unwrap_or_else(|| PathBuf::from("/opt/extensions")),
        merged_root: q.merged_root.unwrap_or_else(|| PathBuf::from("/")),
        lock_file: q
            .lock_file
            .unwrap_or_else(|| PathBuf::from("/run/inplace/agent.lock")),
    };
    absolute("paths.extensions_dir", &paths.extensions_dir)?;
    absolute("paths.images_dir", &paths.images_dir)?;
    absolute("paths.merged_root", &paths.merged_root)?;
    absolute("paths.lock_file", &paths.lock_file)?;

    let metrics = metrics_settings(f.metrics)?;

    Ok(Settings {
        node_name,
        state_dir,
        kube,
        policy: Policy {
            allowed_url_prefixes,
            allow_http,
            allowed_target_dirs,
            allowed_units,
            max_artifact_size,
            reserved_disk_space: p.reserved_disk_space.unwrap_or(1 << 30),
            allow_remote_health_checks: p.allow_remote_health_checks.unwrap_or(false),
            require_signatures: p.require_signatures.unwrap_or(false),
            trusted_keys_dir,
        },
        download,
        activation,
        paths,
        metrics,
    })
}

fn metrics_settings(m: MetricsFragment) -> Result<MetricsSettings, SettingsError> {
    let socket = m
        .socket
        .unwrap_or_else(|| PathBuf::from("/run/inplace/metrics.sock"));
    absolute("metrics.socket", &socket)?;
    let listen = match m.listen {
        None => None,
        Some(text) => {
            let addr: SocketAddr = text.parse().map_err(|_| {
                invalid(
                    "metrics.listen",
                    format!("{text:?} is not an address like \"127.0.0.1:9477\" or \"[::1]:9477\""),
                )
            })?;
            if !addr.ip().is_loopback() {
                return Err(invalid(
                    "metrics.listen",
                    format!(
                        "{addr} is not a loopback address; the metrics have no authentication, so serve them on 127.0.0.1 or [::1] (or the Unix socket) and let a local exporter forward them"
                    ),
                ));
            }
            Some(addr)
        }
    };
    Ok(MetricsSettings {
        enabled: m.enabled.unwrap_or(true),
        socket,
        listen,
    })
}

fn absolute(key: &str, path: &Path) -> Result<(), SettingsError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("{} is not an absolute path", path.display()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Option<String> {
        Some("worker-7".into())
    }

    #[test]
    fn defaults_are_safe() {
        let s = from_toml("", host).unwrap();
        assert_eq!(s.node_name, "worker-7");
        assert_eq!(s.state_dir, PathBuf::from("/var/lib/inplace"));
        assert_eq!(
            s.kube,
            KubeAuth::Kubeconfig("/etc/kubernetes/kubelet.conf".into())
        );
        assert!(s.policy.allowed_url_prefixes.is_empty());
        assert!(!s.policy.allow_http);
        assert!(!s.policy.allow_remote_health_checks);
        assert!(!s.policy.require_signatures);
        assert_eq!(
            s.policy.trusted_keys_dir,
            PathBuf::from("/etc/inplace/keys")
        );
        assert_eq!(s.paths.extensions_dir, PathBuf::from("/etc/extensions"));
    }

    #[test]
    fn unknown_keys_name_file_and_key() {
        let err = from_toml("[policy]\nallow_htp = true\n", host).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("<inline>"), "{text}");
        assert!(text.contains("allow_htp"), "{text}");
        let err = from_toml("colour = 1\n", host).unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn wrong_types_are_errors() {
        let err = from_toml("[policy]\nmax_artifact_size = \"big\"\n", host).unwrap_err();
        assert!(err.to_string().contains("max_artifact_size"), "{err}");
        let err = from_toml("[download]\nstall_timeout = \"soon\"\n", host).unwrap_err();
        assert!(err.to_string().contains("soon"), "{err}");
    }

    #[test]
    fn layers_merge_key_by_key_and_dropins_sort() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("agent.toml");
        std::fs::write(
            &main,
            "node_name = \"a\"\n[policy]\nallowed_url_prefixes = [\"https://x.example/\"]\nallow_http = false\n",
        )
        .unwrap();
        let d = dir.path().join("agent.d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("20-b.toml"), "node_name = \"c\"\n").unwrap();
        std::fs::write(
            d.join("10-a.toml"),
            "node_name = \"b\"\n[policy]\nallow_http = true\n",
        )
        .unwrap();
        std::fs::write(d.join("ignored.conf"), "garbage").unwrap();
        let s = load(&main, || None).unwrap();
        assert_eq!(s.node_name, "c");
        assert!(s.policy.allow_http);
        assert_eq!(
            s.policy.allowed_url_prefixes[0].to_string(),
            "https://x.example/"
        );
    }

    #[test]
    fn error_in_dropin_names_that_file() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("agent.toml");
        let d = dir.path().join("agent.d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("50-bad.toml"), "[paths]\nnope = 1\n").unwrap();
        let err = load(&main, host).unwrap_err().to_string();
        assert!(err.contains("50-bad.toml") && err.contains("nope"), "{err}");
    }

    #[test]
    fn semantic_errors_name_the_key() {
        let cases = [
            ("node_name = \"Not_A_Node\"", "node_name"),
            ("state_dir = \"relative\"", "state_dir"),
            (
                "[policy]\nallowed_url_prefixes = [\"http://x/\"]",
                "policy.allowed_url_prefixes",
            ),
            (
                "[policy]\nallowed_url_prefixes = [\"file:///x\"]",
                "policy.allowed_url_prefixes",
            ),
            (
                "[policy]\nallowed_url_prefixes = [\"https://dl.example/kube-\"]",
                "policy.allowed_url_prefixes",
            ),
            (
                "[policy]\nallowed_target_dirs = [\"/\"]",
                "policy.allowed_target_dirs",
            ),
            (
                "[policy]\nallowed_units = [\"sshd.socket\"]",
                "policy.allowed_units",
            ),
            (
                "[policy]\nmax_artifact_size = 0",
                "policy.max_artifact_size",
            ),
            ("[kubernetes]\ntoken_file = \"/t\"", "kubernetes.server"),
            (
                "[kubernetes]\ntoken_file = \"/t\"\nkubeconfig = \"/k\"\nserver = \"https://a\"",
                "kubernetes.token_file",
            ),
            ("[activation]\nmax_attempts = 0", "activation.max_attempts"),
            (
                "[policy]\ntrusted_keys_dir = \"keys\"",
                "policy.trusted_keys_dir",
            ),
            ("[download]\nattempts = 0", "download.attempts"),
            (
                "[download]\nartifact_deadline = \"0s\"",
                "download.artifact_deadline",
            ),
            ("[metrics]\nsocket = \"metrics.sock\"", "metrics.socket"),
            ("[metrics]\nlisten = \"0.0.0.0:9477\"", "metrics.listen"),
            ("[metrics]\nlisten = \"[::]:9477\"", "metrics.listen"),
            ("[metrics]\nlisten = \"10.0.0.7:9477\"", "metrics.listen"),
            ("[metrics]\nlisten = \"localhost\"", "metrics.listen"),
        ];
        for (text, key) in cases {
            match from_toml(text, host) {
                Err(SettingsError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn metrics_default_to_the_socket_and_accept_loopback_only() {
        let s = from_toml("", host).unwrap();
        assert!(s.metrics.enabled);
        assert_eq!(s.metrics.socket, PathBuf::from("/run/inplace/metrics.sock"));
        assert_eq!(s.metrics.listen, None);
        let s = from_toml("[metrics]\nlisten = \"[::1]:9477\"\n", host).unwrap();
        assert_eq!(s.metrics.listen, Some("[::1]:9477".parse().unwrap()));
        let err = from_toml("[metrics]\nlisten = \"192.0.2.1:9477\"\n", host).unwrap_err();
        assert!(err.to_string().contains("not a loopback address"), "{err}");
    }

    #[test]
    fn token_file_auth() {
        let s = from_toml(
            "[kubernetes]\ntoken_file = \"/etc/inplace/token\"\nserver = \"https://api:6443\"\n",
            host,
        )
        .unwrap();
        assert!(matches!(s.kube, KubeAuth::TokenFile { .. }));
    }

    #[test]
    fn shipped_defaults_parse_and_document_only_known_keys() {
        let shipped = include_str!("../../packaging/agent/agent.toml");
        assert_eq!(
            from_toml(shipped, host).unwrap(),
            from_toml("", host).unwrap()
        );
        // Every commented example is a real key with a valid value (the token-file
        // alternative excluded: it conflicts with kubeconfig by design).
        let uncommented: String = shipped
            .lines()
            .map(|line| match line.strip_prefix('#') {
                Some(rest)
                    if rest.contains(" = ")
                        && !rest.starts_with(' ')
                        && !["token_file", "server", "ca_file"]
                            .iter()
                            .any(|k| rest.starts_with(k)) =>
                {
                    rest
                }
                _ => line,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let s = from_toml(&uncommented, host).unwrap();
        assert_eq!(s.node_name, "worker-7");
        assert_eq!(s.policy.allowed_url_prefixes.len(), 2);
    }

    #[test]
    fn hostname_default_is_lowercased_like_the_kubelet_does() {
        let s = from_toml("", || Some("Worker-7.Example".into())).unwrap();
        assert_eq!(s.node_name, "worker-7.example");
    }

    #[test]
    fn missing_hostname_without_node_name_is_an_error() {
        assert!(from_toml("", || None).is_err());
    }
}
