//! systemd, through PID 1's D-Bus API: restart units and wait for the job's result,
//! refresh system extensions, daemon-reload, read unit state for health checks.
//!
//! A job (restart, refresh) subscribes to `JobRemoved` *before* the call that queues it,
//! so the signal cannot be missed, then waits for the signal whose job path matches; any
//! result other than `done` (`failed`, `timeout`, `dependency`, `canceled`, `skipped`)
//! fails the step.
//!
//! Extensions are refreshed by `systemd-sysext refresh` (configuration extensions by
//! `systemd-confext refresh`) run by PID 1 as a transient oneshot unit, not by restarting
//! `systemd-sysext.service`: on systemd 252 that unit's start runs `merge`, which fails
//! ("Hierarchy '/usr' is already merged") whenever the unit is inactive while `/usr` is
//! merged — after `systemd-sysext refresh` by hand, as a running node is set up. `refresh` is
//! right from every state (merged or not, unit active or not) and leaves
//! `systemd-sysext.service` alone, and running it in PID 1's mount namespace (not the agent's
//! private one) is what makes the merge the host's.
//!
//! The transient unit merges in the node's mutable mode (systemd >= 256): the `--mutable=`
//! of the class's own unit (`systemd-sysext.service`, `systemd-confext.service`), from its
//! command line or its `SYSTEMD_SYSEXT_MUTABLE_MODE` / `SYSTEMD_CONFEXT_MUTABLE_MODE`
//! environment. Without it, `refresh` merges read-only (systemd's default `no`): a node whose
//! boot merges `/usr` writable, with the writes kept in `/var/lib/extensions.mutable`, would
//! lose its writable `/usr` and the files written there at the agent's first refresh, and get
//! them back, over what the agent verified, at its next boot.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use zbus_systemd::systemd1::{ManagerProxy, ServiceProxy, UnitProxy};
use zbus_systemd::zbus;

/// What health checks read about a unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitState {
    /// `active`, `activating`, `failed`, ...
    pub active_state: String,
    /// `running`, `auto-restart`, ...
    pub sub_state: String,
    /// Service restarts counted by systemd (`NRestarts`), when the unit is a service.
    pub n_restarts: Option<u32>,
    /// When the unit last entered the active state (CLOCK_MONOTONIC, µs).
    pub active_enter_monotonic: u64,
    /// The same instant by the wall clock (CLOCK_REALTIME, µs since the epoch; 0 when the
    /// unit never entered it, as for a unit that is not loaded): what a Node's status,
    /// stamped by the node's clock, is compared with.
    pub active_enter_realtime: u64,
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

    /// When the unit last entered the active state, by the wall clock; `None` when it never
    /// did.
    pub fn active_since(&self) -> Option<std::time::SystemTime> {
        (self.active_enter_realtime != 0).then(|| {
            std::time::UNIX_EPOCH + std::time::Duration::from_micros(self.active_enter_realtime)
        })
    }
}

/// The transient unit in which PID 1 runs `systemd-sysext refresh`.
pub const SYSEXT_REFRESH_UNIT: &str = "inplace-sysext-refresh.service";

/// The transient unit in which PID 1 runs `systemd-confext refresh`.
pub const CONFEXT_REFRESH_UNIT: &str = "inplace-confext-refresh.service";

/// The first systemd with `systemd-confext`.
pub const CONFEXT_SINCE: u32 = 254;

/// Which extensions a refresh merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtensionClass {
    /// System extensions: `/usr` and `/opt` (`systemd-sysext`).
    Sysext,
    /// Configuration extensions: `/etc` (`systemd-confext`, systemd >= 254).
    Confext,
}

impl ExtensionClass {
    /// The tool, where systemd installs it (Flatcar, Debian, Fedora).
    pub fn tool(self) -> &'static str {
        match self {
            ExtensionClass::Sysext => "/usr/bin/systemd-sysext",
            ExtensionClass::Confext => "/usr/bin/systemd-confext",
        }
    }

    /// The tool's name, as in messages.
    pub fn name(self) -> &'static str {
        match self {
            ExtensionClass::Sysext => "systemd-sysext",
            ExtensionClass::Confext => "systemd-confext",
        }
    }

    /// The node's own unit that merges this class at boot: its mutable mode is the node's.
    pub fn boot_unit(self) -> &'static str {
        match self {
            ExtensionClass::Sysext => "systemd-sysext.service",
            ExtensionClass::Confext => "systemd-confext.service",
        }
    }

    /// The transient unit the agent's refresh runs in.
    pub fn refresh_unit(self) -> &'static str {
        match self {
            ExtensionClass::Sysext => SYSEXT_REFRESH_UNIT,
            ExtensionClass::Confext => CONFEXT_REFRESH_UNIT,
        }
    }

    /// The environment variable that sets the tool's mutable mode (systemd >= 256).
    fn mutable_mode_env(self) -> &'static str {
        match self {
            ExtensionClass::Sysext => "SYSTEMD_SYSEXT_MUTABLE_MODE",
            ExtensionClass::Confext => "SYSTEMD_CONFEXT_MUTABLE_MODE",
        }
    }
}

/// The mutable mode a unit runs the extension tool with: the last `--mutable=` of its
/// `ExecStart=` command lines, else its environment's variable for `class`; `None` when
/// neither says (systemd's default, `no`).
pub fn mutable_mode(
    class: ExtensionClass,
    exec_start: &[Vec<String>],
    environment: &[String],
) -> Option<String> {
    let from_command = exec_start
        .iter()
        .flatten()
        .filter_map(|arg| arg.strip_prefix("--mutable="))
        .next_back();
    let prefix = format!("{}=", class.mutable_mode_env());
    let from_environment = environment
        .iter()
        .filter_map(|entry| entry.strip_prefix(prefix.as_str()))
        .next_back();
    from_command
        .or(from_environment)
        .filter(|mode| !mode.is_empty())
        .map(str::to_owned)
}

/// The major version in PID 1's `Version` property (`252.39-1~deb12u1`, `257.9-1~deb13u1`,
/// `v257`).
pub fn major_version(version: &str) -> Option<u32> {
    let digits: String = version
        .trim_start_matches('v')
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
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
    /// Runs `systemd-sysext refresh` (or `systemd-confext refresh`) in PID 1's namespace
    /// (the transient unit [`ExtensionClass::refresh_unit`]), in the mutable mode of the
    /// class's own unit, and waits for it to exit 0: the linked images become the merged
    /// ones, whatever was merged before and however.
    async fn refresh_extensions(&self, class: ExtensionClass) -> Result<(), SystemdError>;
    /// Runs `systemd-confext unmerge` (or `systemd-sysext unmerge`) the same way and waits
    /// for it to exit 0.
    async fn unmerge_extensions(&self, class: ExtensionClass) -> Result<(), SystemdError>;
    /// PID 1's major version (`252`).
    async fn version(&self) -> Result<u32, SystemdError>;
    /// Reloads unit files (daemon-reload); returns when the reload is done.
    async fn daemon_reload(&self) -> Result<(), SystemdError>;
    /// Reads a unit's state.
    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError>;
    /// Gives `paths` to `uid`:`gid` (`chown --no-dereference`) in PID 1's namespace (the
    /// transient unit [`CHOWN_UNIT`]) and waits for it to exit 0: the agent itself holds no
    /// capability and sees every user but root as nobody.
    async fn chown(&self, paths: &[PathBuf], uid: u32, gid: u32) -> Result<(), SystemdError>;
}

/// The transient unit that gives a stored Config file its owner.
pub const CHOWN_UNIT: &str = "inplace-agent-chown.service";

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

    async fn refresh_extensions(&self, class: ExtensionClass) -> Result<(), SystemdError> {
        self.run_tool(class, "refresh").await
    }

    async fn unmerge_extensions(&self, class: ExtensionClass) -> Result<(), SystemdError> {
        self.run_tool(class, "unmerge").await
    }

    async fn chown(&self, paths: &[PathBuf], uid: u32, gid: u32) -> Result<(), SystemdError> {
        let mut argv = vec![
            "chown".to_owned(),
            "--no-dereference".to_owned(),
            format!("{uid}:{gid}"),
            "--".to_owned(),
        ];
        argv.extend(paths.iter().map(|p| p.display().to_string()));
        let first = paths.first().map(|p| p.display().to_string());
        let description = format!(
            "inplace-agent: chown {uid}:{gid} {} ({} files)",
            first.unwrap_or_default(),
            paths.len()
        );
        self.run_oneshot(CHOWN_UNIT, &description, "/bin/chown", &argv)
            .await
    }

    async fn version(&self) -> Result<u32, SystemdError> {
        let version = ManagerProxy::new(&self.connection).await?.version().await?;
        major_version(&version).ok_or_else(|| {
            SystemdError::Bus(format!("PID 1's Version {version:?} has no major number"))
        })
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
            active_enter_realtime: unit_proxy.active_enter_timestamp().await?,
            invocation_id: hex::encode(unit_proxy.invocation_id().await?),
        })
    }
}

impl DbusSystemd {
    /// Runs `class`'s tool with `verb` in PID 1's namespace as the transient unit
    /// [`ExtensionClass::refresh_unit`], in the mutable mode of the class's boot unit.
    async fn run_tool(&self, class: ExtensionClass, verb: &str) -> Result<(), SystemdError> {
        let manager = ManagerProxy::new(&self.connection).await?;
        let mode = self.boot_mutable_mode(&manager, class).await?;
        let description = format!("inplace-agent: {} {verb}", class.name());
        let argv = tool_command(class, verb, mode.as_deref());
        self.run_oneshot(class.refresh_unit(), &description, class.tool(), &argv)
            .await
    }

    /// Runs `program` with `argv` as the transient oneshot `unit` ([`oneshot_properties`])
    /// and waits for it to end `done` (a unit of that name still running, left by a killed
    /// agent, is waited for first).
    async fn run_oneshot(
        &self,
        unit: &str,
        description: &str,
        program: &str,
        argv: &[String],
    ) -> Result<(), SystemdError> {
        let manager = ManagerProxy::new(&self.connection).await?;
        let mut removed = manager.receive_job_removed().await?;
        let deadline = tokio::time::Instant::now() + self.job_timeout;
        loop {
            match manager
                .start_transient_unit(
                    unit.to_owned(),
                    "fail".to_owned(),
                    oneshot_properties(description, program, argv.to_vec())?,
                    Vec::new(),
                )
                .await
            {
                Ok(job) => {
                    return self.wait_for_job(&mut removed, &job, unit).await;
                }
                // A unit started by an agent that was killed is still running: it is
                // collected when it ends, then the name is free again.
                Err(e) if e.to_string().contains("UnitExists") => {
                    if tokio::time::Instant::now() > deadline {
                        return Err(SystemdError::Timeout {
                            unit: unit.into(),
                            timeout: self.job_timeout,
                        });
                    }
                    let ended = async {
                        while let Some(signal) = removed.next().await {
                            if signal.args().is_ok_and(|a| a.unit() == unit) {
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

    /// The mutable mode `class`'s boot unit merges with ([`mutable_mode`]); `None` when the
    /// unit says none or is not there (systemd 252 has no `systemd-confext.service`).
    async fn boot_mutable_mode(
        &self,
        manager: &ManagerProxy<'_>,
        class: ExtensionClass,
    ) -> Result<Option<String>, SystemdError> {
        let path = match manager.load_unit(class.boot_unit().to_owned()).await {
            Ok(path) => path,
            Err(_) => return Ok(None),
        };
        let service = ServiceProxy::builder(&self.connection)
            .path(path)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?;
        let exec_start: Vec<Vec<String>> = service
            .exec_start()
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|command| command.1)
            .collect();
        let environment = service.environment().await.unwrap_or_default();
        Ok(mutable_mode(class, &exec_start, &environment))
    }

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

/// The tool's command line for `verb` (`refresh`, `unmerge`) in mutable mode `mode` (none:
/// the tool's default).
pub fn tool_command(class: ExtensionClass, verb: &str, mode: Option<&str>) -> Vec<String> {
    let mut argv = vec![class.name().to_owned(), verb.to_owned()];
    if let Some(mode) = mode {
        argv.push(format!("--mutable={mode}"));
    }
    argv
}

/// A transient oneshot that runs `program` with `argv` (`systemd-sysext refresh`, `chown`);
/// collected when it ends, failed or not (its output stays in the journal under the unit's
/// name).
fn oneshot_properties(
    description: &str,
    program: &str,
    argv: Vec<String>,
) -> Result<Vec<(String, zbus::OwnedVariant)>, SystemdError> {
    let exec_start = vec![(program.to_owned(), argv, false)];
    let variant = |v: zbus::Variant<'_>| {
        zbus::OwnedVariant::try_from(v).map_err(|e| SystemdError::Bus(e.to_string()))
    };
    Ok(vec![
        ("Description".to_owned(), variant(description.into())?),
        ("Type".to_owned(), variant("oneshot".into())?),
        (
            "CollectMode".to_owned(),
            variant("inactive-or-failed".into())?,
        ),
        ("ExecStart".to_owned(), variant(exec_start.into())?),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_mutable_mode_is_the_boot_units_command_line_then_its_environment() {
        let plain = vec![strings(&["systemd-sysext", "refresh"])];
        assert_eq!(mutable_mode(ExtensionClass::Sysext, &plain, &[]), None);
        let env = strings(&["SYSTEMD_SYSEXT_MUTABLE_MODE=yes", "OTHER=1"]);
        assert_eq!(
            mutable_mode(ExtensionClass::Sysext, &plain, &env).as_deref(),
            Some("yes")
        );
        // The other class's variable is not this class's mode.
        assert_eq!(mutable_mode(ExtensionClass::Confext, &plain, &env), None);
        let flagged = vec![strings(&[
            "systemd-sysext",
            "refresh",
            "--mutable=ephemeral",
        ])];
        assert_eq!(
            mutable_mode(ExtensionClass::Sysext, &flagged, &env).as_deref(),
            Some("ephemeral")
        );
        let emptied = strings(&["SYSTEMD_CONFEXT_MUTABLE_MODE="]);
        assert_eq!(
            mutable_mode(ExtensionClass::Confext, &plain, &emptied),
            None
        );
    }

    #[test]
    fn a_refresh_passes_the_mode_on() {
        assert_eq!(
            tool_command(ExtensionClass::Sysext, "refresh", None),
            strings(&["systemd-sysext", "refresh"])
        );
        assert_eq!(
            tool_command(ExtensionClass::Confext, "unmerge", Some("auto")),
            strings(&["systemd-confext", "unmerge", "--mutable=auto"])
        );
    }

    #[test]
    fn major_versions_of_what_pid_1_reports() {
        assert_eq!(major_version("252.39-1~deb12u1"), Some(252));
        assert_eq!(major_version("257.9-1~deb13u1"), Some(257));
        assert_eq!(major_version("v256"), Some(256));
        assert_eq!(major_version("unknown"), None);
    }
}
