//! The API server's version (`/version`), as the skew guard (`decision/version_skew.rs`)
//! compares a release's kubelet with it. Asked only by a round that decides about a release
//! that brings a Kubernetes version, and at most once per [`ASK_AT_MOST_EVERY`]: a busy
//! rollout decides many times a second, and a control plane is upgraded rarely.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Client;

use crate::error::{Error, Result};

/// How long one answer of `/version` stands: shorter than the guard's recheck
/// (`SERVER_VERSION_RECHECK`), so a rollout refused because the server was older sees an
/// upgraded server at its next look.
pub const ASK_AT_MOST_EVERY: Duration = Duration::from_secs(30);

/// The last answer of `/version`, shared by every reconcile.
#[derive(Debug, Default)]
pub struct ApiServerVersion {
    last: Mutex<Option<(Instant, String)>>,
}

impl ApiServerVersion {
    /// The server's `gitVersion` (`v1.36.3`), asked again when the last answer is older
    /// than [`ASK_AT_MOST_EVERY`]. An unanswered `/version` fails the round: the guard
    /// cannot judge without it, and the round is retried.
    pub async fn get(&self, client: &Client) -> Result<String> {
        if let Some(version) = self.fresh(Instant::now()) {
            return Ok(version);
        }
        let info = client
            .apiserver_version()
            .await
            .map_err(Error::kube("reading the API server's /version"))?;
        *self.lock() = Some((Instant::now(), info.git_version.clone()));
        Ok(info.git_version)
    }

    fn fresh(&self, now: Instant) -> Option<String> {
        self.lock()
            .as_ref()
            .filter(|(at, _)| now.duration_since(*at) < ASK_AT_MOST_EVERY)
            .map(|(_, version)| version.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
