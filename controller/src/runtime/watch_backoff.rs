//! How long the controller's watches wait before retrying after an error.
//!
//! kube-runtime's default is client-go's: 0.8 s doubling up to 30 s, with jitter, so a retry
//! can be up to a minute away. That suits the thousands of agents watching one API server.
//! The controller is one process (two with a standby), and after an API server restart
//! every one of its watches fails for as long as the server is down. With the default, the
//! first retry after the server is back could come up to a minute later, and the
//! controller's merged trigger stream backs off again on the same errors: a rollout stood
//! still for about a minute after the server was already serving. A shorter cap keeps that
//! gap to a few seconds; it is still exponential, so a struggling server sees one
//! controller's relist at most every `LONGEST` (plus jitter).

use std::time::Duration;

use backon::ExponentialBuilder;
use kube::runtime::watcher::ExponentialBackoff;

/// The wait after the first error.
pub const FIRST: Duration = Duration::from_millis(500);
/// The longest wait before jitter; jitter adds up to as much again.
pub const LONGEST: Duration = Duration::from_secs(4);

/// The backoff for each of the controller's watches and for its controllers' trigger
/// streams. Any successful event resets it (kube-runtime's `StreamBackoff`).
pub fn watch_backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(FIRST)
        .with_max_delay(LONGEST)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An outage of any length never leaves a watch waiting longer than twice `LONGEST`
    /// after the server is back, and the watch never gives up.
    #[test]
    fn a_long_outage_is_retried_every_few_seconds_forever() {
        let waits: Vec<Duration> = watch_backoff().take(1_000).collect();
        assert_eq!(waits.len(), 1_000, "the watch never gives up");
        assert!(waits[0] >= FIRST && waits[0] < 2 * FIRST, "{:?}", waits[0]);
        let longest = waits.iter().max().unwrap();
        assert!(*longest < 2 * LONGEST, "a wait of {longest:?}");
        assert!(*longest >= LONGEST, "the waits grow up to the cap");
    }
}
