//! The journal's file: `<state_dir>/journal.json`, read back after a crash (a file that does
//! not parse is moved aside, never trusted) and written durably through `links`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use chrono::Utc;

use super::Journal;
use crate::links::{self, DurableOps, StdFs};

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file system failed.
    #[error("journal {path}: {source}")]
    Io {
        /// The journal file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file does not parse (it was moved aside).
    #[error("journal {path} is unreadable ({message}); moved to {moved_to}")]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// The parse error.
        message: String,
        /// Where the bad file now is.
        moved_to: PathBuf,
    },
}

/// The journal file under the state directory.
#[derive(Clone)]
pub struct JournalFile {
    path: PathBuf,
    ops: Arc<dyn DurableOps>,
}

impl std::fmt::Debug for JournalFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl JournalFile {
    /// The journal at `<state_dir>/journal.json`.
    pub fn new(state_dir: &Path) -> Self {
        Self::with_ops(state_dir, Arc::new(StdFs))
    }

    /// The journal at `<state_dir>/journal.json`, written through `ops`.
    pub fn with_ops(state_dir: &Path, ops: Arc<dyn DurableOps>) -> Self {
        JournalFile {
            path: state_dir.join("journal.json"),
            ops,
        }
    }

    /// Reads the journal; a missing file is an empty journal. A file that does not parse
    /// is moved aside and reported, so the caller can refuse automatic action.
    pub async fn load(&self) -> Result<Journal, JournalError> {
        let path = self.path.clone();
        run_blocking(move || {
            let io = |source| JournalError::Io {
                path: path.clone(),
                source,
            };
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(Journal::default());
                }
                Err(e) => return Err(io(e)),
            };
            serde_json::from_slice(&bytes).or_else(|e| {
                let moved_to = path.with_extension(format!(
                    "json.corrupt-{}",
                    Utc::now().format("%Y%m%dT%H%M%S")
                ));
                std::fs::rename(&path, &moved_to).map_err(io)?;
                Err(JournalError::Corrupt {
                    path: path.clone(),
                    message: e.to_string(),
                    moved_to,
                })
            })
        })
        .await
    }

    /// Writes the journal durably: temp + fsync + rename + fsync(dir).
    pub async fn save(&self, journal: &Journal) -> Result<(), JournalError> {
        let path = self.path.clone();
        let bytes = serde_json::to_vec_pretty(journal).map_err(|e| JournalError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        let ops = self.ops.clone();
        run_blocking(move || {
            links::write_atomically_with(ops.as_ref(), &path, &bytes).map_err(|source| {
                JournalError::Io {
                    path: path.clone(),
                    source,
                }
            })
        })
        .await
    }
}

async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, JournalError> + Send + 'static,
) -> Result<T, JournalError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(JournalError::Io {
            path: PathBuf::new(),
            source: std::io::Error::other(e),
        })
    })
}
