//! The TOML layers as read: every key optional, unknown keys refused, merged key by key.

use std::path::{Path, PathBuf};

use inplace_proto::Duration;
use serde::Deserialize;

use super::SettingsError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Fragment {
    pub(super) node_name: Option<String>,
    pub(super) state_dir: Option<PathBuf>,
    #[serde(default)]
    pub(super) kubernetes: KubernetesFragment,
    #[serde(default)]
    pub(super) policy: PolicyFragment,
    #[serde(default)]
    pub(super) download: DownloadFragment,
    #[serde(default)]
    pub(super) activation: ActivationFragment,
    #[serde(default)]
    pub(super) paths: PathsFragment,
    #[serde(default)]
    pub(super) metrics: MetricsFragment,
    #[serde(default)]
    pub(super) self_update: SelfUpdateFragment,
    #[serde(default)]
    pub(super) credentials: CredentialsFragment,
    pub(super) mirrors: Option<Vec<MirrorFragment>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MirrorFragment {
    pub(super) registry: Option<String>,
    pub(super) url_prefix: Option<String>,
    #[serde(default)]
    pub(super) hosts: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CredentialsFragment {
    pub(super) docker_config: Option<PathBuf>,
    pub(super) token_files: Option<Vec<TokenFileFragment>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenFileFragment {
    pub(super) url_prefix: String,
    pub(super) path: PathBuf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KubernetesFragment {
    pub(super) kubeconfig: Option<PathBuf>,
    pub(super) token_file: Option<PathBuf>,
    pub(super) server: Option<String>,
    pub(super) ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyFragment {
    pub(super) allowed_url_prefixes: Option<Vec<String>>,
    pub(super) allow_http: Option<bool>,
    pub(super) allowed_target_dirs: Option<Vec<PathBuf>>,
    pub(super) allowed_config_roots: Option<Vec<PathBuf>>,
    pub(super) allowed_units: Option<Vec<String>>,
    pub(super) max_artifact_size: Option<u64>,
    pub(super) reserved_disk_space: Option<u64>,
    pub(super) allow_remote_health_checks: Option<bool>,
    pub(super) require_signatures: Option<bool>,
    pub(super) trusted_keys_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DownloadFragment {
    pub(super) attempts: Option<u32>,
    pub(super) connect_timeout: Option<Duration>,
    pub(super) stall_timeout: Option<Duration>,
    pub(super) min_speed: Option<u64>,
    pub(super) artifact_deadline: Option<Duration>,
    pub(super) initial_backoff: Option<Duration>,
    pub(super) max_backoff: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ActivationFragment {
    pub(super) max_attempts: Option<u32>,
    pub(super) health_interval: Option<Duration>,
    pub(super) job_timeout: Option<Duration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PathsFragment {
    pub(super) extensions_dir: Option<PathBuf>,
    pub(super) images_dir: Option<PathBuf>,
    pub(super) merged_root: Option<PathBuf>,
    pub(super) lock_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MetricsFragment {
    pub(super) enabled: Option<bool>,
    pub(super) socket: Option<PathBuf>,
    pub(super) listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SelfUpdateFragment {
    pub(super) allow: Option<bool>,
    pub(super) allow_downgrade: Option<bool>,
    pub(super) trusted_keys_dir: Option<PathBuf>,
    pub(super) confirm_timeout: Option<Duration>,
}

impl Fragment {
    /// Lays `other` over `self`: every key `other` sets wins.
    pub(super) fn merge(&mut self, other: Fragment) {
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
        over(&mut p.allowed_config_roots, o.allowed_config_roots);
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
        let (u, o) = (&mut self.self_update, other.self_update);
        over(&mut u.allow, o.allow);
        over(&mut u.allow_downgrade, o.allow_downgrade);
        over(&mut u.trusted_keys_dir, o.trusted_keys_dir);
        over(&mut u.confirm_timeout, o.confirm_timeout);
        let (c, o) = (&mut self.credentials, other.credentials);
        over(&mut c.docker_config, o.docker_config);
        over(&mut c.token_files, o.token_files);
        over(&mut self.mirrors, other.mirrors);
    }
}

pub(super) fn parse_fragment(path: &Path, text: &str) -> Result<Fragment, SettingsError> {
    toml::from_str(text).map_err(|e| SettingsError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().replace('\n', " "),
    })
}
