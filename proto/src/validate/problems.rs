//! How problems are reported: one [`FieldError`] per field, all of an object's in
//! [`Problems`], gathered by a [`Collector`] while the checks walk the object.

use std::fmt;

use crate::reason::Reason;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field, as a path from the object root (`spec.artifacts[1].sha256`).
    pub path: String,
    /// `InvalidPlan` or `PolicyDenied` (for plans; releases map both to `InvalidRelease`).
    pub reason: Reason,
    /// What is wrong, in words.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// All problems found in one object. Never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Problems(pub Vec<FieldError>);

impl Problems {
    /// The reason for a condition that reports these problems: `InvalidPlan` wins over
    /// `PolicyDenied`, because a malformed plan should be fixed before anything else.
    pub fn reason(&self) -> Reason {
        if self.0.iter().any(|p| p.reason == Reason::InvalidPlan) {
            Reason::InvalidPlan
        } else {
            self.0.first().map_or(Reason::InvalidPlan, |p| p.reason)
        }
    }

    /// Whether some problem concerns this exact field path.
    pub fn has(&self, path: &str) -> bool {
        self.0.iter().any(|p| p.path == path)
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Collects problems while walking an object.
#[derive(Default)]
pub(crate) struct Collector(Vec<FieldError>);

impl Collector {
    pub(crate) fn invalid(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(path, Reason::InvalidPlan, message);
    }

    pub(crate) fn denied(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(path, Reason::PolicyDenied, message);
    }

    fn push(&mut self, path: impl Into<String>, reason: Reason, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            reason,
            message: message.into(),
        });
    }

    pub(crate) fn finish(self) -> Result<(), Problems> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(Problems(self.0))
        }
    }
}
