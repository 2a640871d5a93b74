//! From the merged layers to validated [`Settings`], one named phase per section.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration as StdDuration;

use inplace_proto::Duration;

use super::fragment::{
    ActivationFragment, CredentialsFragment, DownloadFragment, Fragment, KubernetesFragment,
    MetricsFragment, MirrorFragment, PathsFragment, PolicyFragment, SelfUpdateFragment,
};
use super::{
    ActivationSettings, DownloadSettings, KubeAuth, MetricsSettings, Paths, Policy,
    SelfUpdateSettings, Settings, SettingsError,
};
use crate::credentials::{CredentialSettings, TokenFile};
use crate::mirrors::{MirrorRule, Mirrors};
use crate::policy::OWN_UNIT;
use crate::url_prefix::UrlPrefix;

fn invalid(key: &str, message: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        key: key.to_owned(),
        message: message.into(),
    }
}

fn duration(value: Option<Duration>, default: StdDuration) -> StdDuration {
    value.map_or(default, |d| d.get())
}

/// Validates the merged layers, section by section; the first broken rule is the error.
pub(super) fn build(
    f: Fragment,
    hostname: impl FnOnce() -> Option<String>,
) -> Result<Settings, SettingsError> {
    let state_dir = f
        .state_dir
        .unwrap_or_else(|| PathBuf::from("/var/lib/inplace"));
    absolute("state_dir", &state_dir)?;
    let policy = policy(f.policy)?;
    let self_update = self_update_settings(f.self_update, &policy.trusted_keys_dir)?;
    let paths = paths(f.paths)?;
    check_guard_covers(&self_update, &state_dir, &paths)?;
    Ok(Settings {
        node_name: node_name(f.node_name, hostname)?,
        state_dir,
        kube: kube_auth(f.kubernetes)?,
        policy,
        download: download_settings(f.download)?,
        activation: activation_settings(f.activation)?,
        paths,
        metrics: metrics_settings(f.metrics)?,
        self_update,
        credentials: credential_settings(f.credentials)?,
        mirrors: mirrors(f.mirrors.unwrap_or_default())?,
    })
}

fn mirrors(rules: Vec<MirrorFragment>) -> Result<Mirrors, SettingsError> {
    let rules = rules
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            MirrorRule::new(m.registry, m.url_prefix, &m.hosts)
                .map_err(|(key, e)| invalid(&format!("mirrors[{i}].{key}"), e))
        })
        .collect::<Result<_, _>>()?;
    Mirrors::new(rules).map_err(|(i, e)| invalid(&format!("mirrors[{i}]"), e))
}

fn credential_settings(c: CredentialsFragment) -> Result<CredentialSettings, SettingsError> {
    let token_files = c
        .token_files
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let url_prefix = t.url_prefix.parse().map_err(|e: String| {
                invalid(&format!("credentials.token_files[{i}].url_prefix"), e)
            })?;
            Ok(TokenFile {
                url_prefix,
                path: t.path,
            })
        })
        .collect::<Result<_, SettingsError>>()?;
    Ok(CredentialSettings {
        docker_config: c.docker_config,
        token_files,
    })
}

fn node_name(
    configured: Option<String>,
    hostname: impl FnOnce() -> Option<String>,
) -> Result<String, SettingsError> {
    let name = match configured {
        Some(name) => name,
        // The kubelet registers the lowercased hostname.
        None => hostname()
            .map(|h| h.to_lowercase())
            .ok_or_else(|| invalid("node_name", "not set and the hostname could not be read"))?,
    };
    // Node names are what the kubelet registers: lowercase RFC 1123 names.
    let name = name.trim().to_owned();
    inplace_proto::validate::check_object_name(&name).map_err(|m| invalid("node_name", m))?;
    Ok(name)
}

fn kube_auth(k: KubernetesFragment) -> Result<KubeAuth, SettingsError> {
    match (k.token_file, k.kubeconfig) {
        (Some(_), Some(_)) => Err(invalid(
            "kubernetes.token_file",
            "set either kubeconfig or token_file, not both",
        )),
        (Some(token_file), None) => {
            let server = k.server.ok_or_else(|| {
                invalid("kubernetes.server", "required with kubernetes.token_file")
            })?;
            url::Url::parse(&server)
                .map_err(|e| invalid("kubernetes.server", format!("{server:?}: {e}")))?;
            Ok(KubeAuth::TokenFile {
                server,
                token_file,
                ca_file: k.ca_file,
            })
        }
        (None, kubeconfig) => {
            if k.server.is_some() || k.ca_file.is_some() {
                return Err(invalid(
                    "kubernetes.server",
                    "server and ca_file go with token_file; a kubeconfig names its own",
                ));
            }
            Ok(KubeAuth::Kubeconfig(kubeconfig.unwrap_or_else(|| {
                PathBuf::from("/etc/kubernetes/kubelet.conf")
            })))
        }
    }
}

fn policy(p: PolicyFragment) -> Result<Policy, SettingsError> {
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
    let allowed_config_roots = p.allowed_config_roots.unwrap_or_default();
    for dir in &allowed_config_roots {
        absolute("policy.allowed_config_roots", dir)?;
        if dir == Path::new("/") || dir == Path::new("/etc") {
            return Err(invalid(
                "policy.allowed_config_roots",
                format!(
                    "{:?} would allow every configuration file on the node (name the directories, e.g. /etc/kubernetes)",
                    dir.display().to_string()
                ),
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
        if unit == OWN_UNIT {
            return Err(invalid(
                "policy.allowed_units",
                format!(
                    "{OWN_UNIT} is the agent itself: restarting it would end the activation that asked for it"
                ),
            ));
        }
    }
    let trusted_keys_dir = p
        .trusted_keys_dir
        .unwrap_or_else(|| PathBuf::from("/etc/inplace/keys"));
    absolute("policy.trusted_keys_dir", &trusted_keys_dir)?;
    let max_artifact_size = p.max_artifact_size.unwrap_or(8 << 30);
    if max_artifact_size == 0 {
        return Err(invalid("policy.max_artifact_size", "must be positive"));
    }
    Ok(Policy {
        allowed_url_prefixes,
        allow_http,
        allowed_target_dirs,
        allowed_config_roots,
        allowed_units,
        max_artifact_size,
        reserved_disk_space: p.reserved_disk_space.unwrap_or(1 << 30),
        allow_remote_health_checks: p.allow_remote_health_checks.unwrap_or(false),
        require_signatures: p.require_signatures.unwrap_or(false),
        trusted_keys_dir,
    })
}

fn download_settings(d: DownloadFragment) -> Result<DownloadSettings, SettingsError> {
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
    Ok(download)
}

fn activation_settings(a: ActivationFragment) -> Result<ActivationSettings, SettingsError> {
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
    Ok(activation)
}

/// How long the new agent has by default to confirm itself: it must start, read its
/// journal and write one status, seconds on a healthy node; minutes leave room for a slow
/// API server without leaving a broken agent in place for long.
const DEFAULT_CONFIRM_TIMEOUT: StdDuration = StdDuration::from_secs(120);

/// With agent switches allowed, the directories must be the ones the shipped guard units
/// watch and restore (`systemd/inplace-agent-guard.{path,service}`, fixed there): a switch
/// armed elsewhere would have no guard, and nothing would restore a broken agent.
fn check_guard_covers(
    self_update: &SelfUpdateSettings,
    state_dir: &Path,
    paths: &Paths,
) -> Result<(), SettingsError> {
    if !self_update.allow {
        return Ok(());
    }
    use crate::self_update::{GUARD_EXTENSIONS_DIR, GUARD_STATE_DIR};
    for (key, dir, guarded) in [
        ("state_dir", state_dir, GUARD_STATE_DIR),
        (
            "paths.extensions_dir",
            paths.extensions_dir.as_path(),
            GUARD_EXTENSIONS_DIR,
        ),
    ] {
        if dir != Path::new(guarded) {
            return Err(invalid(
                "self_update.allow",
                format!(
                    "{key} is {}, but the guard units (inplace-agent-guard.path and .service) watch and restore {guarded}: a switch there would have no guard; keep {key} at {guarded}, or set self_update.allow = false",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// `policy_keys` is `policy.trusted_keys_dir`, the default of `self_update.trusted_keys_dir`.
fn self_update_settings(
    u: SelfUpdateFragment,
    policy_keys: &Path,
) -> Result<SelfUpdateSettings, SettingsError> {
    let trusted_keys_dir = u
        .trusted_keys_dir
        .unwrap_or_else(|| policy_keys.to_path_buf());
    absolute("self_update.trusted_keys_dir", &trusted_keys_dir)?;
    let settings = SelfUpdateSettings {
        trusted_keys_dir,
        allow: u.allow.unwrap_or(false),
        allow_downgrade: u.allow_downgrade.unwrap_or(false),
        confirm_timeout: duration(u.confirm_timeout, DEFAULT_CONFIRM_TIMEOUT),
    };
    if settings.confirm_timeout.is_zero() {
        return Err(invalid(
            "self_update.confirm_timeout",
            "must be positive: the new agent needs time to confirm itself",
        ));
    }
    Ok(settings)
}

fn paths(q: PathsFragment) -> Result<Paths, SettingsError> {
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
    Ok(paths)
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
