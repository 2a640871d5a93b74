//! Why a download failed, and the condition reason each kind is reported with.

use std::path::PathBuf;
use std::time::Duration;

use inplace_proto::Reason;

/// Why a download failed. Each kind maps to a condition reason.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The server answered with a status that will not change on retry (404, 401, 403,
    /// other 4xx), or retryable statuses until the attempts ran out.
    #[error("artifact {artifact}: {url} answered HTTP {status}")]
    Http {
        /// The artifact.
        artifact: String,
        /// The URL.
        url: String,
        /// The last status code.
        status: u16,
    },
    /// Connection, TLS or timeout problems until the attempts ran out.
    #[error("artifact {artifact}: {detail}")]
    Transport {
        /// The artifact.
        artifact: String,
        /// What happened on the last attempt.
        detail: String,
    },
    /// A registry's answer cannot be used: a manifest that does not match the reference's
    /// digest or names no single file, a token service that gives no token.
    #[error("artifact {artifact}: {detail}")]
    Registry {
        /// The artifact.
        artifact: String,
        /// Which registry and what is wrong.
        detail: String,
    },
    /// A redirect went somewhere the node policy forbids.
    #[error("artifact {artifact}: redirect refused: {detail}")]
    RedirectRefused {
        /// The artifact.
        artifact: String,
        /// Where to and why.
        detail: String,
    },
    /// A mirror the node policy does not admit: never reached.
    #[error("artifact {artifact}: {detail}")]
    PolicyRefused {
        /// The artifact.
        artifact: String,
        /// Which mirror and why.
        detail: String,
    },
    /// The origin failed with `last` after every mirror was passed over.
    #[error("{last} (mirrors tried first: {})", skipped.join("; "))]
    Sources {
        /// Each mirror and why it was passed over, in the order tried.
        skipped: Vec<String>,
        /// The origin's failure, which gives the reason.
        last: Box<FetchError>,
    },
    /// The bytes do not hash to the plan's sha256 (on every attempt).
    #[error("artifact {artifact}: sha256 is {actual}, the plan says {expected}")]
    HashMismatch {
        /// The artifact.
        artifact: String,
        /// From the plan.
        expected: String,
        /// What arrived.
        actual: String,
    },
    /// More or fewer bytes than declared or allowed.
    #[error("artifact {artifact}: {detail}")]
    SizeMismatch {
        /// The artifact.
        artifact: String,
        /// What the server sent versus the limit.
        detail: String,
    },
    /// Not downloaded within `[download] artifact_deadline` of the first request.
    #[error(
        "artifact {artifact}: not downloaded within the [download] artifact_deadline of {deadline:?} ({done} bytes in)"
    )]
    DeadlineExceeded {
        /// The artifact.
        artifact: String,
        /// The configured deadline.
        deadline: Duration,
        /// Bytes received when it passed.
        done: u64,
    },
    /// No space left on the target file system; the temporary file was removed.
    #[error("artifact {artifact}: no space left in {dir}")]
    DiskFull {
        /// The artifact.
        artifact: String,
        /// The directory.
        dir: PathBuf,
    },
    /// Another local I/O error.
    #[error("artifact {artifact}: {detail}")]
    Io {
        /// The artifact.
        artifact: String,
        /// The cause.
        detail: String,
    },
}

impl FetchError {
    /// The condition reason for this error.
    pub fn reason(&self) -> Reason {
        match self {
            FetchError::Http { .. }
            | FetchError::Transport { .. }
            | FetchError::DeadlineExceeded { .. }
            | FetchError::Registry { .. }
            | FetchError::Io { .. } => Reason::DownloadFailed,
            FetchError::RedirectRefused { .. } | FetchError::PolicyRefused { .. } => {
                Reason::PolicyDenied
            }
            FetchError::Sources { last, .. } => last.reason(),
            FetchError::HashMismatch { .. } => Reason::HashMismatch,
            FetchError::SizeMismatch { .. } => Reason::SizeMismatch,
            FetchError::DiskFull { .. } => Reason::DiskFull,
        }
    }
}
