//! What a power-cut case does around [`Node::power_cut_and_boot`]: keep a unit from being
//! restarted once its process was killed at a failpoint (the power goes before systemd
//! would restart it), and wait until that point fired.

use std::time::{Duration, Instant};

use super::Node;
use crate::{Error, Result};

impl Node {
    /// `hold`: `unit` is not restarted after its process dies (a drop-in `Restart=no`,
    /// kept across boots until released); released again before the power cut, so that the
    /// next boot restarts it as shipped.
    pub async fn hold_restarts(&self, unit: &str, hold: bool) -> Result<()> {
        let file = format!("/etc/systemd/system/{unit}.d/60-hold.conf");
        if hold {
            self.write_file(&file, b"[Service]\nRestart=no\n", 0o644)
                .await?;
            self.sh_ok("systemctl daemon-reload").await?;
        } else {
            self.sh_ok(&format!("rm -f {file}")).await?;
        }
        Ok(())
    }

    /// Waits up to `patience` until the failpoint armed in the file `failpoints` fired
    /// (the file is gone: a process passing the point removes it) and `unit`'s process
    /// that passed it is dead.
    pub async fn wait_fired(&self, failpoints: &str, unit: &str, patience: Duration) -> Result<()> {
        let deadline = Instant::now() + patience;
        loop {
            let fired = !self.exists(failpoints).await?;
            let state = self
                .systemctl(&["show", "-p", "ActiveState", "--value", unit])
                .await?;
            if fired && matches!(state.trim(), "failed" | "inactive") {
                return Ok(());
            }
            if Instant::now() > deadline {
                let journal = self.journal(unit, 60).await.unwrap_or_default();
                return Err(Error::Timeout {
                    what: format!(
                        "the point in {failpoints} to fire ({unit} {})\n{journal}",
                        state.trim()
                    ),
                    after: patience,
                });
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}
