//! Garbage collection: the stored files no kept revision (committed, previous, in flight)
//! references any more, partial downloads, and a staging nobody wants.

use std::collections::HashSet;
use std::path::PathBuf;

use super::{Agent, AgentError};
use crate::journal::{InFlight, Journal};
use crate::store;

impl Agent {
    /// Drops a staging that is no longer wanted: temporary files and files no kept
    /// revision references.
    pub(super) async fn abandon_staging(&mut self) -> Result<(), AgentError> {
        if self.journal.in_flight().is_none() {
            return Ok(());
        }
        let flight = self.journal.abandon_staging()?;
        tracing::info!(revision = %flight.revision(), "abandoning staging");
        self.save().await?;
        self.collect(flight_targets(&flight)).await;
        Ok(())
    }

    /// Removes those of `candidates` that no kept revision references, and leftovers.
    pub(super) async fn collect(&self, candidates: Vec<PathBuf>) {
        self.collect_keeping(candidates, HashSet::new()).await;
    }

    /// [`Self::collect`], leaving the partial downloads named in `partials` (a staging is
    /// about to resume them).
    pub(super) async fn collect_keeping(
        &self,
        candidates: Vec<PathBuf>,
        partials: HashSet<String>,
    ) {
        let keep = referenced(&self.journal);
        // Our partial downloads: the state's temp dir and every sysext image directory.
        let mut partial_dirs = vec![store::tmp_dir(&self.settings)];
        if let Ok(mut entries) = tokio::fs::read_dir(&self.settings.paths.images_dir).await {
            while let Ok(Some(entry)) = entries.next_entry().await {
                partial_dirs.push(entry.path());
            }
        }
        let _ = tokio::task::spawn_blocking(move || {
            store::remove_unreferenced(&candidates, &keep);
            store::remove_partials(&partial_dirs, &partials);
        })
        .await;
    }
}

/// Every stored file a kept revision points at.
fn referenced(journal: &Journal) -> HashSet<PathBuf> {
    let committed = journal.committed().into_iter().flat_map(|c| c.links());
    let previous = journal.previous().into_iter().flat_map(|c| c.links());
    let flight = journal.in_flight().into_iter().flat_map(|c| c.links());
    // The agent image a confirmed switch installed is no revision's link, and runs.
    let agent = journal.agent().map(|a| a.image().to_path_buf());
    committed
        .chain(previous)
        .chain(flight)
        .map(|l| l.target.clone())
        .chain(agent)
        .collect()
}

/// The stored files `flight` points at.
pub(super) fn flight_targets(flight: &InFlight) -> Vec<PathBuf> {
    flight.links().iter().map(|l| l.target.clone()).collect()
}
