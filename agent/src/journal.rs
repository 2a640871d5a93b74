//! The local journal: what this node has committed, what it was before, and which step of
//! which revision is in flight. The only state the agent trusts after a crash, together
//! with what it reads back from the host. Written atomically (see `links.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use inplace_proto::{Reason, UpdateContent};
use serde::{Deserialize, Serialize};

use crate::links::{self, Prior};

/// Failed revisions remembered (the oldest are forgotten first).
const MAX_FAILED: usize = 16;

/// One managed path and what it points at for a revision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    /// The path on the node (`/etc/extensions/kubernetes.raw`, `/opt/bin/kubectl`).
    pub path: PathBuf,
    /// The stored, verified file it points at.
    pub target: PathBuf,
    /// The sha256 of that file, re-checked before activation.
    pub sha256: String,
}

/// A revision installed on this node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Installed {
    /// The revision hash.
    pub revision: String,
    /// Its content (what to restart and check when going back to it).
    pub content: UpdateContent,
    /// Its links.
    pub links: Vec<Link>,
    /// When it was committed.
    pub committed_at: DateTime<Utc>,
}

/// The step of the in-flight revision. Persisted *before* the step's first side effect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Downloading and staging; nothing that runs is touched.
    Staging,
    /// Every artifact verified and stored; nothing that runs is touched.
    Staged,
    /// Links are being swapped and units restarted; `before` holds what to restore.
    Activating,
    /// The new links are in place; health checks are running.
    Verifying,
    /// Going back: `before` is being restored.
    RollingBack,
}

/// Why a revision failed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// The condition reason.
    pub reason: Reason,
    /// The message, naming the artifact, unit or check.
    pub message: String,
}

/// A managed path and what it held before activation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Before {
    /// The path.
    pub path: PathBuf,
    /// What it held.
    pub prior: Prior,
}

/// What activation removes: the links of the committed revision that `next` no longer has
/// and that still point where the agent put them (`ours` reads that from the host). A path
/// someone changed since is left alone. Each comes with its prior, to be recorded in
/// [`InFlight::before`] with the rest, so a rollback puts it back like any replaced link.
pub fn retired(committed: &[Link], next: &[Link], ours: impl Fn(&Link) -> bool) -> Vec<Before> {
    committed
        .iter()
        .filter(|link| next.iter().all(|n| n.path != link.path) && ours(link))
        .map(|link| Before {
            path: link.path.clone(),
            prior: Prior::Symlink {
                target: link.target.clone(),
            },
        })
        .collect()
}

/// The revision being worked on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    /// The revision hash.
    pub revision: String,
    /// The plan generation that asked for it.
    pub generation: Option<i64>,
    /// Its content.
    pub content: UpdateContent,
    /// Where it stands.
    pub step: Step,
    /// Its links, known once staged.
    #[serde(default)]
    pub links: Vec<Link>,
    /// What each managed path held before activation (recorded before the first swap):
    /// the revision's own paths, and the committed revision's links it drops (see
    /// [`retired`]), which activation removes and a rollback puts back.
    #[serde(default)]
    pub before: Vec<Before>,
    /// Why it is being rolled back (set with `Step::RollingBack`).
    #[serde(default)]
    pub failure: Option<Failure>,
    /// When work on it started.
    pub started_at: DateTime<Utc>,
}

impl InFlight {
    /// The paths activation removes: recorded in `before` but not linked by this revision
    /// (see [`retired`]). Derived from the journal, so a resumed activation removes the same.
    pub fn removals(&self) -> Vec<PathBuf> {
        self.before
            .iter()
            .filter(|b| self.links.iter().all(|l| l.path != b.path))
            .map(|b| b.path.clone())
            .collect()
    }
}

/// A revision that failed here and is not retried automatically.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FailedRevision {
    /// The revision hash.
    pub revision: String,
    /// Why.
    pub failure: Failure,
    /// When.
    pub at: DateTime<Utc>,
    /// Whether it had been activated and was rolled back (then the status keeps saying
    /// `RolledBack` for it, also after a restart); false for a staging failure.
    #[serde(default)]
    pub rolled_back: bool,
}

/// Everything the agent remembers across restarts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    /// The committed revision: what the node runs.
    pub committed: Option<Installed>,
    /// The one before it, kept on disk as the rollback target.
    pub previous: Option<Installed>,
    /// The revision being staged, activated or rolled back.
    pub in_flight: Option<InFlight>,
    /// Activation attempts per revision (restarts in the middle count).
    #[serde(default)]
    pub attempts: BTreeMap<String, u32>,
    /// Revisions that failed and are denied until the node commits another one.
    #[serde(default)]
    pub failed: Vec<FailedRevision>,
    /// Set when a rollback failed: the node needs a person; nothing more is done.
    #[serde(default)]
    pub degraded: Option<Failure>,
}

impl Journal {
    /// Whether `revision` failed here before.
    pub fn failure_of(&self, revision: &str) -> Option<&FailedRevision> {
        self.failed.iter().find(|f| f.revision == revision)
    }

    /// Remembers a failed revision.
    pub fn deny(&mut self, revision: &str, failure: Failure, at: DateTime<Utc>) {
        self.failed.retain(|f| f.revision != revision);
        self.failed.push(FailedRevision {
            revision: revision.to_owned(),
            failure,
            at,
            rolled_back: false,
        });
        if self.failed.len() > MAX_FAILED {
            let excess = self.failed.len() - MAX_FAILED;
            self.failed.drain(..excess);
        }
    }

    /// Makes the in-flight revision the committed one; the committed one becomes the
    /// previous. Returns the revision that fell off (its files may be collected).
    pub fn commit(&mut self, at: DateTime<Utc>) -> Option<Installed> {
        let flight = self.in_flight.take()?;
        let installed = Installed {
            revision: flight.revision.clone(),
            content: flight.content,
            links: flight.links,
            committed_at: at,
        };
        // Keep the committed revision's count (the status shows it); forget the rest.
        self.attempts
            .retain(|revision, _| *revision == installed.revision);
        self.failed.clear();
        let dropped = self.previous.take();
        self.previous = self.committed.replace(installed);
        dropped
    }

    /// The revision the node runs, if any.
    pub fn current_revision(&self) -> Option<&str> {
        self.committed.as_ref().map(|c| c.revision.as_str())
    }
}

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
#[derive(Debug, Clone)]
pub struct JournalFile {
    path: PathBuf,
}

impl JournalFile {
    /// The journal at `<state_dir>/journal.json`.
    pub fn new(state_dir: &Path) -> Self {
        JournalFile {
            path: state_dir.join("journal.json"),
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
        run_blocking(move || {
            links::write_atomically(&path, &bytes).map_err(|source| JournalError::Io {
                path: path.clone(),
                source,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn content() -> UpdateContent {
        serde_json::from_value(serde_json::json!({
            "artifacts": [{"name": "k", "type": "Sysext", "url": "https://x/k.raw",
                           "sha256": "0".repeat(64)}]
        }))
        .unwrap()
    }

    fn flight(rev: &str) -> InFlight {
        InFlight {
            revision: rev.into(),
            generation: Some(1),
            content: content(),
            step: Step::Verifying,
            links: vec![Link {
                path: "/etc/extensions/k.raw".into(),
                target: format!("/opt/extensions/k/{rev}.raw").into(),
                sha256: "0".repeat(64),
            }],
            before: vec![],
            failure: None,
            started_at: Utc::now(),
        }
    }

    #[tokio::test]
    async fn round_trip_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = JournalFile::new(dir.path());
        assert_eq!(file.load().await.unwrap(), Journal::default());
        let mut j = Journal {
            in_flight: Some(flight("a")),
            ..Default::default()
        };
        j.attempts.insert("a".into(), 2);
        file.save(&j).await.unwrap();
        assert_eq!(file.load().await.unwrap(), j);
        // Only the journal itself is left: the temporary name was renamed away.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["journal.json"]);
    }

    #[tokio::test]
    async fn crash_before_rename_keeps_the_old_journal() {
        let dir = tempfile::tempdir().unwrap();
        let file = JournalFile::new(dir.path());
        let old = Journal {
            in_flight: Some(flight("old")),
            ..Default::default()
        };
        file.save(&old).await.unwrap();
        // A crash after writing the temporary file, before the rename.
        std::fs::write(dir.path().join(".journal.json.inplace-new"), b"{\"trunc").unwrap();
        assert_eq!(file.load().await.unwrap(), old);
        // The next save goes through despite the leftover.
        file.save(&Journal::default()).await.unwrap();
        assert_eq!(file.load().await.unwrap(), Journal::default());
    }

    #[tokio::test]
    async fn corrupt_journal_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let file = JournalFile::new(dir.path());
        std::fs::write(dir.path().join("journal.json"), b"not json").unwrap();
        let err = file.load().await.unwrap_err();
        assert!(matches!(err, JournalError::Corrupt { .. }), "{err}");
        assert_eq!(file.load().await.unwrap(), Journal::default());
    }

    #[test]
    fn commit_shifts_revisions_and_clears_failures() {
        let mut j = Journal::default();
        let failure = Failure {
            reason: Reason::UnitFailed,
            message: "x".into(),
        };
        j.deny("bad", failure, Utc::now());
        j.in_flight = Some(flight("a"));
        assert!(j.commit(Utc::now()).is_none());
        j.in_flight = Some(flight("b"));
        assert!(j.commit(Utc::now()).is_none());
        j.in_flight = Some(flight("c"));
        let dropped = j.commit(Utc::now()).unwrap();
        assert_eq!(dropped.revision, "a");
        assert_eq!(j.current_revision(), Some("c"));
        assert_eq!(j.previous.as_ref().unwrap().revision, "b");
        assert!(j.failed.is_empty());
        assert!(j.in_flight.is_none());
    }

    fn link(path: &str, target: &str) -> Link {
        Link {
            path: path.into(),
            target: target.into(),
            sha256: "0".repeat(64),
        }
    }

    #[test]
    fn retired_are_the_committed_links_the_next_revision_drops_and_still_ours() {
        let committed = [
            link("/etc/extensions/k.raw", "/opt/extensions/k/1.raw"),
            link("/etc/extensions/tools.raw", "/opt/extensions/tools/1.raw"),
            link("/opt/bin/crictl", "/store/c1"),
            link("/opt/bin/ctr", "/store/ctr1"),
        ];
        let next = [link("/etc/extensions/k.raw", "/opt/extensions/k/2.raw")];
        // Someone replaced /opt/bin/ctr since: it is not the agent's any more.
        let retired = retired(&committed, &next, |l| l.path != Path::new("/opt/bin/ctr"));
        let expected: Vec<Before> = committed[1..3]
            .iter()
            .map(|l| Before {
                path: l.path.clone(),
                prior: Prior::Symlink {
                    target: l.target.clone(),
                },
            })
            .collect();
        assert_eq!(retired, expected);
        // A revision that keeps every path retires nothing; a first install has nothing.
        assert!(super::retired(&committed, &committed, |_| true).is_empty());
        assert!(super::retired(&[], &next, |_| true).is_empty());
    }

    #[test]
    fn removals_are_the_recorded_paths_the_flight_does_not_link() {
        let mut f = flight("b");
        assert!(f.removals().is_empty());
        f.before = vec![
            Before {
                path: "/etc/extensions/k.raw".into(),
                prior: Prior::Absent,
            },
            Before {
                path: "/opt/bin/crictl".into(),
                prior: Prior::Symlink {
                    target: "/store/c1".into(),
                },
            },
        ];
        assert_eq!(f.removals(), vec![PathBuf::from("/opt/bin/crictl")]);
    }

    #[test]
    fn denylist_is_bounded() {
        let mut j = Journal::default();
        for i in 0..40 {
            let failure = Failure {
                reason: Reason::UnitFailed,
                message: String::new(),
            };
            j.deny(&format!("r{i}"), failure, Utc::now());
        }
        assert_eq!(j.failed.len(), MAX_FAILED);
        assert!(j.failure_of("r39").is_some());
        assert!(j.failure_of("r0").is_none());
    }
}
