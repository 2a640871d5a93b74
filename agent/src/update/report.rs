//! What the agent says: the texts of every report (`texts.rs`), the plan's status built
//! from them (`status.rs`, a pure function of the journal, the plan and what was observed),
//! what the status showed, kept between reports (`shown.rs`), and the telling of a report
//! (`publish.rs`): the [`Agent`](super::Agent) only adds the clock, logs, metrics,
//! sd_notify and publishing.

mod publish;
mod shown;
mod status;
mod texts;

pub(super) use shown::Shown;
use status::{Observation, status};
pub(super) use texts::Report;

#[cfg(test)]
mod tests;
