//! How soon one rollout may decide again. A decided round walks every selected node: at
//! tens of thousands of nodes it costs tens of milliseconds, and kube-runtime starts the
//! next one as soon as any node's Node or plan event arrives, so the number of rounds
//! followed the event rate (and the machine's load), and the controller's CPU with it
//! (docs/design/scale-history.md § What the runs found). Spacing a rollout's decided rounds by a
//! multiple of the last one's cost bounds the share of a core its decisions take, whatever
//! the event rate; the events that arrive meanwhile are decided together in the next round.
//! A small fleet's sub-millisecond rounds are held back by as little.

use std::time::{Duration, Instant};

/// A decided round and the wait before the next: at most one tenth of a core per rollout.
pub const ROUNDS_SHARE_OF_A_CORE: u32 = 10;
/// The longest wait, however slow a round: a node's change is acted on within this.
pub const MAX_SPACING: Duration = Duration::from_secs(1);

/// When the rollout may decide again, after a round that started at `started` and spent
/// `cost` deciding.
pub fn next_round_at(started: Instant, cost: Duration) -> Instant {
    started + cost.saturating_mul(ROUNDS_SHARE_OF_A_CORE).min(MAX_SPACING)
}

/// How long a reconcile at `now` waits before deciding, if the last round was too recent.
pub fn wait_before_deciding(next_round_at: Option<Instant>, now: Instant) -> Option<Duration> {
    next_round_at
        .filter(|at| now < *at)
        .map(|at| at.duration_since(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_are_spaced_by_ten_times_their_cost_and_at_most_a_second() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(next_round_at(start, ms(30)), start + ms(300));
        assert_eq!(
            next_round_at(start, Duration::from_micros(50)),
            start + Duration::from_micros(500)
        );
        assert_eq!(next_round_at(start, ms(400)), start + MAX_SPACING);
    }

    #[test]
    fn a_reconcile_before_the_next_round_waits_for_the_rest_and_none_after_it() {
        let start = Instant::now();
        let ms = Duration::from_millis;
        let next = Some(start + ms(300));
        assert_eq!(wait_before_deciding(next, start + ms(100)), Some(ms(200)));
        assert_eq!(wait_before_deciding(next, start + ms(300)), None);
        assert_eq!(wait_before_deciding(next, start + ms(301)), None);
        assert_eq!(wait_before_deciding(None, start), None);
    }
}
