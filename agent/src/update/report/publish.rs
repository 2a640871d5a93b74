//! Telling a report: logs, metrics, sd_notify, and the plan's status written.

use std::time::{Instant, SystemTime};

use inplace_proto::{NodeUpdatePlanStatus, Phase};
use k8s_openapi::jiff::Timestamp;

use super::{Observation, Report, status};
use crate::machine::PlanView;
use crate::metrics::Reported;
use crate::notify;
use crate::update::Agent;

impl Agent {
    /// Logs, meters and publishes `report`. Without a plan there is no status to write
    /// to: only sd_notify hears it.
    pub(in crate::update) fn report(&self, view: Option<&PlanView>, report: Report) {
        tracing::info!(phase = ?report.phase, reason = %report.reason, message = %report.message, "status");
        self.metrics.reported(
            Reported {
                revision: view.map(|v| v.revision.as_str()),
                phase: report.phase,
                reason: report.reason,
            },
            Instant::now(),
            SystemTime::now(),
        );
        self.record_running();
        if let Some(status) = self.render(view, &report) {
            self.host.status.publish(status);
        }
    }

    /// The plan's status for `report` (remembered as shown, and told to sd_notify); `None`
    /// without a plan, when only sd_notify hears it.
    pub(in crate::update) fn render(
        &self,
        view: Option<&PlanView>,
        report: &Report,
    ) -> Option<NodeUpdatePlanStatus> {
        let Some(view) = view else {
            (self.host.notify)(&notify::status_line(report.phase, &report.message, None));
            return None;
        };
        let mut shown = self.shown.lock().ok()?;
        let seen = Observation {
            report,
            shown: &shown,
            now: Timestamp::now(),
            boot_id: self.boot_id.as_deref(),
        };
        let status = status(&self.journal, view, &seen);
        shown.remember(&status);
        let download = (report.phase == Phase::Downloading).then(|| shown.download_totals());
        (self.host.notify)(&notify::status_line(
            report.phase,
            &report.message,
            download,
        ));
        Some(status)
    }

    /// Shows the committed revision (what the node runs) in the metrics.
    pub(in crate::update) fn record_running(&self) {
        let committed = self.journal.committed();
        self.metrics.running(
            committed.map(|c| c.revision()),
            committed.and_then(|c| c.content().kubernetes_version.as_deref()),
        );
    }
}
