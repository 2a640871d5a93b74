//! Rebooting the node for a revision activated by a reboot (`activation.mode: Reboot`):
//! logind's D-Bus API (`org.freedesktop.login1.Manager`), whose shutdown inhibitors the
//! agent respects, and this boot's ID, by which the agent tells after a restart whether the
//! reboot it journaled has happened.
//!
//! Root may override a blocking inhibitor, so the agent lists them first and does not ask
//! while one blocks; it then calls `RebootWithFlags` with `SD_LOGIND_ROOT_CHECK_INHIBITORS`,
//! so an inhibitor taken between the two makes logind refuse rather than reboot.

use async_trait::async_trait;
use zbus_systemd::login1::ManagerProxy;
use zbus_systemd::zbus;

/// `RebootWithFlags`' flag asking logind to honour inhibitors for root too.
const ROOT_CHECK_INHIBITORS: u64 = 1;

/// One inhibitor lock, as `ListInhibitors` reports it (`systemd-inhibit --list`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inhibitor {
    /// What it inhibits, colon-separated (`shutdown:sleep`).
    pub what: String,
    /// Who holds it.
    pub who: String,
    /// Why.
    pub why: String,
    /// `block` or `delay`.
    pub mode: String,
    /// The holder's UID.
    pub uid: u32,
    /// The holder's PID.
    pub pid: u32,
}

impl Inhibitor {
    /// Whether it blocks a reboot (a `delay` lock only postpones it, logind handles that).
    pub fn blocks_reboot(&self) -> bool {
        self.mode == "block" && self.what.split(':').any(|w| w == "shutdown")
    }
}

/// The inhibitors among `all` that block a reboot, described for the status ("" if none).
pub fn blocking_reboot(all: &[Inhibitor]) -> Option<String> {
    let blocking: Vec<String> = all
        .iter()
        .filter(|i| i.blocks_reboot())
        .map(|i| format!("{} (pid {}): {}", i.who, i.pid, i.why))
        .collect();
    (!blocking.is_empty()).then(|| blocking.join("; "))
}

/// Why a power operation failed.
#[derive(Debug, thiserror::Error)]
#[error("logind D-Bus: {0}")]
pub struct PowerError(pub String);

impl From<zbus::Error> for PowerError {
    fn from(e: zbus::Error) -> Self {
        PowerError(e.to_string())
    }
}

/// What the agent needs to reboot the node.
#[async_trait]
pub trait Power: Send + Sync {
    /// This boot's ID (`/proc/sys/kernel/random/boot_id`), read once at start.
    fn boot_id(&self) -> Option<String>;
    /// The inhibitor locks held now.
    async fn inhibitors(&self) -> Result<Vec<Inhibitor>, PowerError>;
    /// Asks logind to reboot (inhibitors honoured); returns once the request is accepted.
    async fn reboot(&self) -> Result<(), PowerError>;
}

/// logind over the system bus.
pub struct Logind {
    connection: zbus::Connection,
    boot_id: Option<String>,
}

impl Logind {
    /// Connects to the system bus (logind itself is reached only when needed).
    pub async fn connect() -> Result<Self, PowerError> {
        Ok(Logind {
            connection: zbus::Connection::system().await?,
            boot_id: crate::self_update::deadline::read_boot_id(),
        })
    }
}

#[async_trait]
impl Power for Logind {
    fn boot_id(&self) -> Option<String> {
        self.boot_id.clone()
    }

    async fn inhibitors(&self) -> Result<Vec<Inhibitor>, PowerError> {
        let manager = ManagerProxy::new(&self.connection).await?;
        Ok(manager
            .list_inhibitors()
            .await?
            .into_iter()
            .map(|(what, who, why, mode, uid, pid)| Inhibitor {
                what,
                who,
                why,
                mode,
                uid,
                pid,
            })
            .collect())
    }

    async fn reboot(&self) -> Result<(), PowerError> {
        let manager = ManagerProxy::new(&self.connection).await?;
        Ok(manager.reboot_with_flags(ROOT_CHECK_INHIBITORS).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(what: &str, mode: &str) -> Inhibitor {
        Inhibitor {
            what: what.into(),
            who: "backup".into(),
            why: "copying".into(),
            mode: mode.into(),
            uid: 0,
            pid: 42,
        }
    }

    #[test]
    fn only_a_blocking_shutdown_lock_blocks_a_reboot() {
        assert!(lock("shutdown", "block").blocks_reboot());
        assert!(lock("sleep:shutdown:idle", "block").blocks_reboot());
        assert!(!lock("shutdown", "delay").blocks_reboot());
        assert!(!lock("sleep:idle", "block").blocks_reboot());
        assert!(!lock("handle-power-key", "block").blocks_reboot());
    }

    #[test]
    fn the_blocking_locks_are_named() {
        assert_eq!(blocking_reboot(&[lock("shutdown", "delay")]), None);
        assert_eq!(
            blocking_reboot(&[lock("sleep", "block"), lock("shutdown", "block")]).as_deref(),
            Some("backup (pid 42): copying")
        );
    }
}
