//! An artifact's builds for several architectures (`architecture`, `otherArchitectures`):
//! one build per architecture, each checked as the artifact's own file is.

use std::collections::HashSet;

use super::Collector;
use super::artifact::check_source;
use crate::content::Artifact;

/// Checks `artifact`'s builds for other architectures; `path` is the artifact's.
pub(super) fn check_builds(artifact: &Artifact, path: &str, out: &mut Collector) {
    if artifact.other_architectures.is_empty() {
        return;
    }
    if artifact.architecture.is_none() {
        out.invalid(
            format!("{path}.architecture"),
            "otherArchitectures needs architecture: the architecture url is built for",
        );
    }
    if artifact.other_architectures.len() > 8 {
        out.invalid(
            format!("{path}.otherArchitectures"),
            "at most 8 other architectures are allowed",
        );
    }
    let mut seen: HashSet<_> = artifact.architecture.into_iter().collect();
    for (j, build) in artifact.other_architectures.iter().enumerate() {
        let at = format!("{path}.otherArchitectures[{j}]");
        if !seen.insert(build.architecture) {
            out.invalid(
                format!("{at}.architecture"),
                format!(
                    "artifact {} has more than one build for {}",
                    artifact.name, build.architecture
                ),
            );
        }
        if let Some(narrowed) = artifact.for_architecture(build.architecture) {
            check_source(&narrowed, &at, out);
        }
    }
}
