//! Power cuts around a reboot activation (`activation.mode: Reboot`), on the crash matrix's
//! real Kubernetes node: the agent's unit is held from restarting, the agent stops at a
//! failpoint (or waits on logind, which a `delay` inhibitor holds), then every process of
//! the node is killed and the node boots again from its disk
//! (`inplace_tests::nspawn::Node::power_cut_and_boot`). The boot after the cut is the first
//! the agent sees; it must finish from its journal on one whole revision.

use std::time::Duration;

use inplace_proto::{Phase, Reason};
use inplace_tests::plans::{self, Seen};

use super::Bed;
use crate::real_node::{PATIENCE, by_reboot};

const AGENT: &str = "inplace-agent.service";

/// The file the agent reads its armed points from (next to its lock, in `/run`, which a
/// reboot empties).
const FAILPOINTS: &str = "/run/inplace/failpoints";

/// A point armed for the next boot: moved to [`FAILPOINTS`] as the agent's unit starts
/// (its `ExecStartPre=` of [`ARM_AT_START`]), so it fires in the boot a reboot brings.
const NEXT_BOOT: &str = "/var/lib/inplace-crash/failpoints";

/// The agent unit's drop-in that moves [`NEXT_BOOT`] into place before the agent starts
/// (`+`: outside the unit's sandbox, which keeps `/var/lib` read-only).
const ARM_AT_START: &str = "[Service]\nExecStartPre=+/bin/sh -c 'if [ -e /var/lib/inplace-crash/failpoints ]; then mv /var/lib/inplace-crash/failpoints /run/inplace/failpoints; fi'\n";

/// logind waits this long for a `delay` inhibitor before it reboots (the default, 5 s,
/// would let the node go down before the cut).
const LOGIND_DELAY: &str = "/etc/systemd/logind.conf.d/90-inplace-crash.conf";

/// Where the power is cut.
#[derive(Clone, Copy, Debug)]
pub enum Cut {
    /// At a failpoint of the boot that activates the revision.
    Point(&'static str),
    /// Once the agent reported the reboot asked for, while logind holds the node up for a
    /// `delay` inhibitor.
    RebootAsked,
    /// At a failpoint of the boot the agent's reboot brings.
    NextBoot(&'static str),
}

impl Bed {
    /// Installs what the reboot cases need: the agent unit's drop-in arming points at its
    /// start; the node's Pod is left out of the invariant (a reboot starts its container
    /// again).
    pub async fn prepare_reboots(&mut self) {
        let node = &self.real.node;
        node.write_file(
            "/etc/systemd/system/inplace-agent.service.d/70-arm-at-start.conf",
            ARM_AT_START.as_bytes(),
            0o644,
        )
        .await
        .unwrap();
        node.sh_ok("mkdir -p /var/lib/inplace-crash && systemctl daemon-reload")
            .await
            .unwrap();
        self.pod = None;
    }

    /// One case: from the committed revision to a new one activated by a reboot, the power
    /// cut at `cut`; then the node ends `Succeeded` on the new revision (`healthy`) or
    /// `RolledBack` on the committed one, whole (the crash matrix's invariant).
    pub async fn reboot_case(&mut self, cut: Cut, healthy: bool) {
        self.cases += 1;
        let tag = format!("c{}", self.cases);
        let label = format!("case {tag} (power cut {cut:?}, healthy={healthy})");
        self.publish(&tag, healthy).await;
        self.without_crictl = false;
        let plan = by_reboot(self.plan(&tag, healthy));
        let revision = inplace_proto::revision_of(&plan.spec.content);
        let node = &self.real.node;
        node.hold_restarts(AGENT, true).await.unwrap();
        match cut {
            Cut::Point(point) => node.write_file(FAILPOINTS, point.as_bytes(), 0o644).await,
            Cut::NextBoot(point) => node.write_file(NEXT_BOOT, point.as_bytes(), 0o644).await,
            Cut::RebootAsked => self.hold_reboot().await,
        }
        .unwrap();
        self.real.apply(&plan).await;
        match cut {
            Cut::Point(_) => self.wait_fired(&label).await,
            Cut::RebootAsked => self.wait_reboot_asked(&revision, &label).await,
            Cut::NextBoot(_) => {
                if let Err(e) = self.real.node.wait_own_reboot(PATIENCE).await {
                    panic!("{label}: {e}\n{}", self.real.diagnostics().await);
                }
                self.wait_fired(&label).await;
            }
        }
        let node = &mut self.real.node;
        node.hold_restarts(AGENT, false).await.unwrap();
        node.sh_ok(&format!("rm -f {LOGIND_DELAY}")).await.unwrap();
        node.power_cut_and_boot(Duration::from_secs(1))
            .await
            .expect("boots again");
        self.injected += 1;

        let want = if healthy {
            Phase::Succeeded
        } else {
            Phase::RolledBack
        };
        self.real.wait_final(want, &revision, &label).await;
        let previous = self.committed.clone();
        if healthy {
            self.committed = (tag.clone(), revision.clone());
            self.committed_crictl = true;
        }
        let (ctag, crev) = self.committed.clone();
        self.check_invariant(&ctag, &crev, &previous.0, &label)
            .await;
        let (reason, message) = self.real.ready().await;
        let wanted = if healthy { "Succeeded" } else { "RolledBack" };
        assert_eq!(reason, wanted, "{label}: {message}");
        eprintln!("{label}: ok");
    }

    /// A `delay` shutdown inhibitor, and logind told to wait for it long enough: a reboot
    /// asked for is accepted and then held until the power cut.
    async fn hold_reboot(&self) -> inplace_tests::Result<()> {
        let node = &self.real.node;
        node.write_file(LOGIND_DELAY, b"[Login]\nInhibitDelayMaxSec=600\n", 0o644)
            .await?;
        node.sh_ok(
            "systemctl restart systemd-logind && \
             systemd-run --unit=inplace-crash-delay systemd-inhibit --what=shutdown \
             --mode=delay --who=inplace-crash --why='the power goes first' sleep infinity",
        )
        .await?;
        Ok(())
    }

    /// Until the agent reported the reboot into `revision` asked for (logind accepted it).
    async fn wait_reboot_asked(&self, revision: &str, label: &str) {
        let asked = |status: &inplace_proto::NodeUpdatePlanStatus| {
            let rebooting = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == Reason::Rebooting.as_str());
            if plans::reports(status, Phase::Activating, revision) && rebooting {
                Seen::Done(())
            } else {
                Seen::Wait
            }
        };
        if let Err(e) = plans::wait_status(&self.real.api, self.real.name(), PATIENCE, asked).await
        {
            panic!("{label}: {e}\n{}", self.real.diagnostics().await);
        }
    }

    async fn wait_fired(&self, label: &str) {
        let node = &self.real.node;
        // A point armed for the next boot is in place once the agent's unit started.
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while node.exists(NEXT_BOOT).await.unwrap() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{label}: the agent never started"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        if let Err(e) = node.wait_fired(FAILPOINTS, AGENT, PATIENCE).await {
            panic!("{label}: {e}");
        }
    }
}
