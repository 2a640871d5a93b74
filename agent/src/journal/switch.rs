//! The journal's part of an agent switch (docs/design/agent-self-update.md): the in-flight
//! `SwitchingAgent` step and the record of the agent build a confirmed switch installed,
//! kept apart from `committed` so that the node's content chain (what the next release is
//! diffed against and rolls back to) never holds an agent-only revision.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Failure, InFlight, Journal, Step, TransitionError};
use crate::self_update::resume::Switch;

/// The agent build a confirmed switch installed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AgentInstalled {
    /// The revision of the plan that asked for it.
    revision: String,
    /// The version the new agent confirmed it is.
    version: String,
    /// The image the agent's extension link names.
    image: PathBuf,
    /// When the new agent confirmed itself.
    committed_at: DateTime<Utc>,
}

impl AgentInstalled {
    /// The revision of the plan that asked for it.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The version the new agent confirmed it is.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The image the agent's extension link names.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// When the new agent confirmed itself.
    pub fn committed_at(&self) -> DateTime<Utc> {
        self.committed_at
    }
}

impl Journal {
    /// `Staged` → `SwitchingAgent`: the agent image is stored and verified; the switch is
    /// journaled before the guard is armed (step 2).
    pub fn begin_switch(&mut self, switch: Switch) -> Result<(), TransitionError> {
        let flight = self.flight_at("begin_switch", &[Step::Staged])?;
        flight.switch = Some(switch);
        flight.step = Step::SwitchingAgent;
        Ok(())
    }

    /// `SwitchingAgent` → `SwitchingAgent`: the switch stopped before its swap (or lost its
    /// guard) and starts again at step 3 as `attempt`.
    pub fn restart_switch(&mut self, attempt: u32) -> Result<(), TransitionError> {
        let flight = self.flight_at("restart_switch", &[Step::SwitchingAgent])?;
        if let Some(switch) = flight.switch.as_mut() {
            switch.attempt = attempt;
        }
        Ok(())
    }

    /// `SwitchingAgent` → nothing in flight: the new agent confirmed itself (step 7, after
    /// it disarmed the guard). `committed` and `previous` stay the node's content.
    pub fn confirm_switch(
        &mut self,
        at: DateTime<Utc>,
    ) -> Result<&AgentInstalled, TransitionError> {
        let flight = self.take_flight("confirm_switch", &[Step::SwitchingAgent])?;
        // A SwitchingAgent step is only ever entered with its switch (begin_switch); a
        // journal without one is refused and left as it was.
        let Some(switch) = flight.switch.clone() else {
            self.in_flight = Some(flight);
            return Err(TransitionError {
                transition: "confirm_switch",
                from: Some(Step::SwitchingAgent),
            });
        };
        Ok(self.agent.insert(AgentInstalled {
            revision: flight.revision,
            version: switch.expected_version,
            image: switch.next_image,
            committed_at: at,
        }))
    }

    /// `SwitchingAgent` → nothing in flight, the revision denied as rolled back: the guard
    /// restored the previous agent, or the switch was given up. Returns it.
    pub fn switch_failed(
        &mut self,
        failure: Failure,
        at: DateTime<Utc>,
    ) -> Result<InFlight, TransitionError> {
        let flight = self.take_flight("switch_failed", &[Step::SwitchingAgent])?;
        self.remember_failed(&flight.revision, failure, at, true);
        Ok(flight)
    }
}

#[cfg(test)]
mod tests;
