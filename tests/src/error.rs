//! The test beds' error type.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while preparing or driving a test bed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The host lacks something a real test bed needs; the message says what to install.
    #[error("test bed prerequisite missing: {what}; {hint}")]
    MissingPrerequisite {
        /// What is missing.
        what: String,
        /// How to get it.
        hint: String,
    },
    /// A file-system or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path or command.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A command ran but exited unsuccessfully.
    #[error("command `{command}` failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status, as text.
        status: String,
        /// Its standard error (and output, when useful), trimmed.
        stderr: String,
    },
    /// Something did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        after: Duration,
    },
    /// A node failed to boot or vanished.
    #[error("node {node}: {message}")]
    Node {
        /// The node's name.
        node: String,
        /// What went wrong, with the tail of its console log when available.
        message: String,
    },
    /// Bad input to a test-bed helper.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A path that should exist does not.
    #[error("not found: {0}")]
    NotFound(PathBuf),
}

/// Result with the test beds' [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds context to I/O errors.
pub(crate) trait IoContext<T> {
    /// Wraps an `std::io::Error` with a description of what was being done.
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Io {
            context: context(),
            source,
        })
    }
}
