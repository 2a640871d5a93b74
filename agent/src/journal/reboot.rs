//! The journal's part of a revision activated by a reboot (`activation.mode: Reboot`): the
//! `Rebooting` and `RebootingBack` steps, each journaled with the boot it was asked from
//! *before* logind is asked, so that an agent started in any later boot knows whether the
//! reboot happened and what runs (docs/usage/reboot-updates.md).

use super::{Failure, Journal, Reboot, Step, TransitionError};

impl Journal {
    /// `Activating` → `Rebooting`: the revision's links are swapped (nothing refreshed or
    /// restarted); the reboot from `boot` is asked for next.
    pub fn rebooting(&mut self, boot: &str) -> Result<(), TransitionError> {
        let flight = self.flight_at("rebooting", &[Step::Activating])?;
        flight.reboot = Some(Reboot {
            from_boot: boot.to_owned(),
        });
        flight.step = Step::Rebooting;
        Ok(())
    }

    /// `Rebooting` → `Verifying`: the node booted into the revision (its boot ID changed);
    /// the reboot stays recorded, so that a rollback knows it must reboot too.
    pub fn rebooted(&mut self) -> Result<(), TransitionError> {
        self.flight_at("rebooted", &[Step::Rebooting])?.step = Step::Verifying;
        Ok(())
    }

    /// `Rebooting` → `RollingBack`, because of `failure`: logind refused the reboot and no
    /// inhibitor explains it. The node never booted the revision, so the reboot is
    /// forgotten: restoring the links is the whole rollback.
    pub fn reboot_refused(&mut self, failure: Failure) -> Result<(), TransitionError> {
        let flight = self.flight_at("reboot_refused", &[Step::Rebooting])?;
        flight.reboot = None;
        flight.failure = Some(failure);
        flight.step = Step::RollingBack;
        Ok(())
    }

    /// `RollingBack` → `RebootingBack`: the prior links of a revision the node booted into
    /// are restored; the reboot into them from `boot` is asked for next.
    pub fn rebooting_back(&mut self, boot: &str) -> Result<(), TransitionError> {
        let flight = self.flight_at("rebooting_back", &[Step::RollingBack])?;
        flight.reboot = Some(Reboot {
            from_boot: boot.to_owned(),
        });
        flight.step = Step::RebootingBack;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
