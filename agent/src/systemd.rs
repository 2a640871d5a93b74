//! systemd, through PID 1's D-Bus API: restart units and wait for the job's result,
//! refresh system extensions, daemon-reload, read unit state for health checks.
//!
//! A job (restart, refresh) subscribes to `JobRemoved` *before* the call that queues it,
//! so the signal cannot be missed, then waits for the signal whose job path matches; any
//! result other than `done` (`failed`, `timeout`, `dependency`, `canceled`, `skipped`)
//! fails the step.
//!
//! Extensions are refreshed by `systemd-sysext refresh` run by PID 1 as a transient
//! oneshot unit, not by restarting `systemd-sysext.service`: on systemd 252 that unit's
//! start runs `merge`, which fails ("Hierarchy '/usr' is already merged") whenever the
//! unit is inactive while `/usr` is merged — after `systemd-sysext refresh` by hand, as a
//! running node is set up. `refresh` is right from every state (merged or not, unit active
//! or not) and leaves `systemd-sysext.service` alone, and running it in PID 1's mount
//! namespace (not the agent's private one) is what makes the merge the host's.

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
    /// The unit's current `InvocationID` (hex; empty when it never ran): a new one for
    /// every start.
    pub invocation_id: String,
}

impl UnitState {
    /// Whether the unit started since `before` was read: a new invocation, or a later
    /// entry into the active state. A restart job can end `done` without a start (a
    /// `Condition…=` not met), and then the old process may still be what runs.
    pub fn started_since(&self, before: &UnitState) -> bool {
        (!self.invocation_id.is_empty() && self.invocation_id != before.invocation_id)
            || self.active_enter_monotonic > before.active_enter_monotonic
    }
}

/// The transient unit in which PID 1 runs `systemd-sysext refresh`.
pub const SYSEXT_REFRESH_UNIT: &str = "inplace-sysext-refresh.service";

/// systemd-sysext, where systemd installs it (Flatcar, Debian, Fedora).
const SYSTEMD_SYSEXT: &str = "/usr/bin/systemd-sysext";

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
    /// Runs `systemd-sysext refresh` in PID 1's namespace (the transient unit
    /// [`SYSEXT_REFRESH_UNIT`]) and waits for it to exit 0: the linked images become
    /// the merged ones, whatever was merged before and however.
    async fn refresh_extensions(&self) -> Result<(), SystemdError>;
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
        self.wait_for_job(&mut removed, &job, unit).await
    }

    async fn refresh_extensions(&self) -> Result<(), SystemdError> {
        let manager = ManagerProxy::new(&self.connection).await?;
        let mut removed = manager.receive_job_removed().await?;
        let deadline = tokio::time::Instant::now() + self.job_timeout;
        loop {
            match manager
                .start_transient_unit(
                    SYSEXT_REFRESH_UNIT.to_owned(),
                    "fail".to_owned(),
                    sysext_refresh_properties()?,
                    Vec::new(),
                )
                .await
            {
                Ok(job) => {
                    return self
                        .wait_for_job(&mut removed, &job, SYSEXT_REFRESH_UNIT)
                        .await;
                }
                // A refresh started by an agent that was killed is still running: it
                // is collected when it ends, then the name is free again.
                Err(e) if e.to_string().contains("UnitExists") => {
                    if tokio::time::Instant::now() > deadline {
                        return Err(SystemdError::Timeout {
                            unit: SYSEXT_REFRESH_UNIT.into(),
                            timeout: self.job_timeout,
                        });
                    }
                    let ended = async {
                        while let Some(signal) = removed.next().await {
                            if signal.args().is_ok_and(|a| a.unit() == SYSEXT_REFRESH_UNIT) {
                                return;
                            }
                        }
                    };
                    let _ = tokio::time::timeout(Duration::from_millis(500), ended).await;
                }
                Err(e) => return Err(e.into()),
            }
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
            invocation_id: hex::encode(unit_proxy.invocation_id().await?),
        })
    }
}

impl DbusSystemd {
    /// Waits for `job`'s `JobRemoved` on `removed` (subscribed before the job was queued)
    /// and requires the result `done`.
    async fn wait_for_job(
        &self,
        removed: &mut zbus_systemd::systemd1::JobRemovedStream,
        job: &zbus::OwnedObjectPath,
        unit: &str,
    ) -> Result<(), SystemdError> {
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
}

/// The transient oneshot that runs `systemd-sysext refresh`; collected when it ends,
/// failed or not (its output stays in the journal under the unit's name).
fn sysext_refresh_properties() -> Result<Vec<(String, zbus::OwnedVariant)>, SystemdError> {
    let exec_start = vec![(
        SYSTEMD_SYSEXT.to_owned(),
        vec!["systemd-sysext".to_owned(), "refresh".to_owned()],
        false,
    )];
    let variant = |v: zbus::Variant<'_>| {
        zbus::OwnedVariant::try_from(v).map_err(|e| SystemdError::Bus(e.to_string()))
    };
    Ok(vec![
        (
            "Description".to_owned(),
            variant("inplace-agent: systemd-sysext refresh".into())?,
        ),
        ("Type".to_owned(), variant("oneshot".into())?),
        (
            "CollectMode".to_owned(),
            variant("inactive-or-failed".into())?,
        ),
        ("ExecStart".to_owned(), variant(exec_start.into())?),
    ])
}
