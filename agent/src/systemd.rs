//! systemd, through PID 1's D-Bus API: restart units and wait for the job's result,
//! daemon-reload, read unit state for health checks.
//!
//! A restart subscribes to `JobRemoved` *before* calling `RestartUnit`, so the signal
//! cannot be missed, then waits for the signal whose job path matches; any result other
//! than `done` (`failed`, `timeout`, `dependency`, `canceled`, `skipped`) fails the step.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use zbus_systemd::systemd1::{ManagerProxy, ServiceProxy, UnitProxy};
use zbus_systemd::zbus;

/// What health checks read about a unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitState {
    /// `active`, `activating`, `failed`, ...
    pub active_state: String,
    /// `running`, `auto-restart`, ...
    pub sub_state: String,
    /// Service restarts counted by systemd (`NRestarts`), when the unit is a service.
    pub n_restarts: Option<u32>,
    /// When the unit last entered the active state (CLOCK_MONOTONIC, µs).
    pub active_enter_monotonic: u64,
}

/// Why a systemd operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// The job ended with a result other than `done`.
    #[error("{unit}: restart job ended {result:?}")]
    JobFailed {
        /// The unit.
        unit: String,
        /// systemd's job result.
        result: String,
    },
    /// No `JobRemoved` within the job timeout.
    #[error("{unit}: restart job did not finish within {timeout:?}")]
    Timeout {
        /// The unit.
        unit: String,
        /// How long we waited.
        timeout: Duration,
    },
    /// The bus call itself failed.
    #[error("systemd D-Bus: {0}")]
    Bus(String),
}

impl From<zbus::Error> for SystemdError {
    fn from(e: zbus::Error) -> Self {
        SystemdError::Bus(e.to_string())
    }
}

/// The systemd operations the agent needs.
#[async_trait]
pub trait SystemdManager: Send + Sync {
    /// Restarts `unit` (mode `replace`) and waits for the job to end `done`.
    async fn restart_unit(&self, unit: &str) -> Result<(), SystemdError>;
    /// Reloads unit files (daemon-reload); returns when the reload is done.
    async fn daemon_reload(&self) -> Result<(), SystemdError>;
    /// Reads a unit's state.
    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError>;
}

/// The real manager, over the system bus.
pub struct DbusSystemd {
    connection: zbus::Connection,
    job_timeout: Duration,
}

impl DbusSystemd {
    /// Connects to the system bus and subscribes to manager signals.
    pub async fn connect(job_timeout: Duration) -> Result<Self, SystemdError> {
        let connection = zbus::Connection::system().await?;
        ManagerProxy::new(&connection).await?.subscribe().await?;
        Ok(DbusSystemd {
            connection,
            job_timeout,
        })
    }
}

#[async_trait]
impl SystemdManager for DbusSystemd {
    async fn restart_unit(&self, unit: &str) -> Result<(), SystemdError> {
        let manager = ManagerProxy::new(&self.connection).await?;
        // Listen first: the job may finish before RestartUnit's reply arrives.
        let mut removed = manager.receive_job_removed().await?;
        let job = manager
            .restart_unit(unit.to_owned(), "replace".to_owned())
            .await?;
        let wait = async {
            while let Some(signal) = removed.next().await {
                let args = signal.args()?;
                if args.job().as_str() == job.as_str() {
                    return Ok(args.result().to_owned());
                }
            }
            Err(SystemdError::Bus("JobRemoved stream ended".into()))
        };
        let result = tokio::time::timeout(self.job_timeout, wait)
            .await
            .map_err(|_| SystemdError::Timeout {
                unit: unit.to_owned(),
                timeout: self.job_timeout,
            })??;
        if result == "done" {
            Ok(())
        } else {
            Err(SystemdError::JobFailed {
                unit: unit.to_owned(),
                result,
            })
        }
    }

    async fn daemon_reload(&self) -> Result<(), SystemdError> {
        let manager = ManagerProxy::new(&self.connection).await?;
        tokio::time::timeout(self.job_timeout, manager.reload())
            .await
            .map_err(|_| SystemdError::Timeout {
                unit: "daemon-reload".into(),
                timeout: self.job_timeout,
            })??;
        Ok(())
    }

    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        let manager = ManagerProxy::new(&self.connection).await?;
        let path = manager.load_unit(unit.to_owned()).await?;
        let unit_proxy = UnitProxy::builder(&self.connection)
            .path(path.clone())
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?;
        let n_restarts = if unit.ends_with(".service") {
            let service = ServiceProxy::builder(&self.connection)
                .path(path)
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await?;
            service.n_restarts().await.ok()
        } else {
            None
        };
        Ok(UnitState {
            active_state: unit_proxy.active_state().await?,
            sub_state: unit_proxy.sub_state().await?,
            n_restarts,
            active_enter_monotonic: unit_proxy.active_enter_timestamp_monotonic().await?,
        })
    }
}
