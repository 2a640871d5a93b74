//! The Cluster API in-place update extension (Runtime SDK hooks `CanUpdateMachine`,
//! `CanUpdateMachineSet`, `UpdateMachine`), served by `inplace-controller capi`.
//!
//! It runs in the **management** cluster. `CanUpdate*` claims a Kubernetes version change
//! when a valid NodeRelease (in the management cluster) brings the desired version;
//! `UpdateMachine` copies that release into the node's NodeUpdatePlan in the **workload**
//! cluster (reached through the `<cluster>-kubeconfig` Secret), drains first when
//! configured, and answers from the plan's status. See `docs/usage/cluster-api.md`.
//!
//! Layout: [`hooks`] (wire types), [`claim`] and [`progress`] (pure decisions),
//! [`target`] (what a call is about), [`catalog`], [`workload`] (with [`kubeconfig`]: inline
//! credentials only), [`drain`] (I/O edges behind traits), [`extension`] (the hooks
//! wired to the edges), [`tls`] and [`server`] (HTTPS), [`run`] (the entry point).

pub mod catalog;
pub mod claim;
pub mod drain;
pub mod error;
pub mod extension;
pub mod hooks;
pub mod kubeconfig;
pub mod machine_plan;
pub mod machines;
pub mod progress;
pub mod server;
pub mod target;
pub mod tls;
pub mod workload;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use inplace_proto::OnDrainTimeout;

pub use drain::{CordonAndEvict, DrainStatus, Drainer, NoDrain};
pub use error::Error;
pub use extension::{Extension, FIELD_MANAGER, HookSettings};
pub use inplace_drain::{DrainError, DrainProgress, Evictions};
pub use server::Server;

/// Everything `inplace-controller capi` configures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Where to listen (`0.0.0.0:9443` in the shipped Deployment).
    pub listen: SocketAddr,
    /// PEM certificate chain (`tls.crt` of the cert-manager Secret). Reloaded on change.
    pub cert_file: PathBuf,
    /// PEM private key (`tls.key`). Reloaded on change.
    pub key_file: PathBuf,
    /// `retryAfterSeconds` while an update is in progress (1 to 600).
    pub retry_after_seconds: i32,
    /// `timeoutSeconds` announced for `UpdateMachine` (1 to 30, Cluster API's limit).
    pub update_machine_timeout_seconds: i32,
    /// Drain nodes after staging and before activation (Cluster API does not).
    pub drain: bool,
    /// Give a drain up after this long (the update then fails, naming what blocks it).
    pub drain_timeout: std::time::Duration,
    /// What a drain past `drain_timeout` does: `Halt` fails the update; `Force` deletes the
    /// pods left without eviction and fails only if they are still there another
    /// `drain_timeout` later. `Skip` is refused: a Machine is updated or replaced.
    pub drain_on_timeout: OnDrainTimeout,
}

impl Config {
    /// A configuration with the defaults for everything but the address and files.
    pub fn new(listen: SocketAddr, cert_file: PathBuf, key_file: PathBuf) -> Self {
        Config {
            listen,
            cert_file,
            key_file,
            retry_after_seconds: 5,
            update_machine_timeout_seconds: 30,
            drain: false,
            drain_timeout: std::time::Duration::from_secs(600),
            drain_on_timeout: OnDrainTimeout::Halt,
        }
    }

    /// Checks the ranges; the message names the offending setting.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=600).contains(&self.retry_after_seconds) {
            return Err(format!(
                "retry-after-seconds {} must be from 1 to 600",
                self.retry_after_seconds
            ));
        }
        if !(1..=30).contains(&self.update_machine_timeout_seconds) {
            return Err(format!(
                "update-machine-timeout-seconds {} must be from 1 to 30",
                self.update_machine_timeout_seconds
            ));
        }
        if self.drain && self.drain_timeout.is_zero() {
            return Err("drain-timeout must be positive".into());
        }
        if self.drain_on_timeout == OnDrainTimeout::Skip {
            return Err(
                "drain-on-timeout Skip cannot apply to a Machine (Cluster API updates \
                        or replaces it): use Halt or Force"
                    .into(),
            );
        }
        Ok(())
    }

    fn hook_settings(&self) -> HookSettings {
        HookSettings {
            retry_after_seconds: self.retry_after_seconds,
            drain: self.drain,
            // Leave Cluster API's client a margin to receive the answer.
            update_machine_deadline: std::time::Duration::from_secs(
                u64::try_from(self.update_machine_timeout_seconds.saturating_sub(3).max(1))
                    .unwrap_or(1),
            ),
        }
    }
}

/// The extension over the real edges: NodeReleases and kubeconfig Secrets read through
/// `management`, `drainer` for nodes (pass [`NoDrain`] unless `config.drain`).
pub fn extension(
    config: &Config,
    management: kube::Client,
    drainer: Arc<dyn Drainer>,
) -> Extension {
    Extension::new(
        Arc::new(catalog::KubeReleaseCatalog::new(management.clone())),
        Arc::new(machines::KubeMachines::new(management.clone())),
        Arc::new(workload::SecretKubeconfigs::new(management)),
        drainer,
        config.hook_settings(),
    )
}

/// Serves the hooks until `shutdown` completes: the entry point of
/// `inplace-controller capi`. With `config.drain`, nodes are drained by [`CordonAndEvict`]
/// (the one inplace drain, through the Eviction API).
/// Fails at start when the configuration is out of range, the certificate cannot be loaded
/// or the address cannot be bound.
pub async fn run(
    config: Config,
    management: kube::Client,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    config.validate().map_err(Error::Config)?;
    let drainer: Arc<dyn Drainer> = if config.drain {
        Arc::new(CordonAndEvict::new(
            config.drain_timeout,
            config.drain_on_timeout,
        ))
    } else {
        Arc::new(NoDrain)
    };
    let extension = Arc::new(extension(&config, management, drainer));
    serve(config, extension, shutdown).await
}

/// Serves an [`Extension`] built by the caller (custom edges) until `shutdown` completes.
pub async fn serve(
    config: Config,
    extension: Arc<Extension>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), Error> {
    config.validate().map_err(Error::Config)?;
    let server = Server::bind(
        config.listen,
        &config.cert_file,
        &config.key_file,
        extension,
        config.update_machine_timeout_seconds,
    )
    .await?;
    server.serve(shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_ranges_are_checked() {
        let mut config = Config::new(
            "127.0.0.1:9443".parse().unwrap(),
            "/tls/tls.crt".into(),
            "/tls/tls.key".into(),
        );
        assert_eq!(config.validate(), Ok(()));
        config.retry_after_seconds = 0;
        assert!(
            config
                .validate()
                .unwrap_err()
                .contains("retry-after-seconds")
        );
        config.retry_after_seconds = 5;
        config.update_machine_timeout_seconds = 31;
        assert!(config.validate().unwrap_err().contains("timeout"));
        config.update_machine_timeout_seconds = 30;
        config.drain_on_timeout = OnDrainTimeout::Skip;
        assert!(
            config
                .validate()
                .unwrap_err()
                .starts_with("drain-on-timeout Skip cannot apply to a Machine")
        );
        config.drain_on_timeout = OnDrainTimeout::Force;
        assert_eq!(config.validate(), Ok(()));
    }
}
