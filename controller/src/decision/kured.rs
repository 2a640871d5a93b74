//! kured's reboot lock, read and written exactly as kured does (kured 1.23.0,
//! `pkg/daemonsetlock/daemonsetlock.go`, its single-holder `DaemonSetSingleLock`, the lock
//! of kured's default `--concurrency=1`).
//!
//! kured keeps its lock in one annotation (`--lock-annotation`, default
//! `weave.works/kured-node-lock`) on its own DaemonSet (`--ds-namespace`/`--ds-name`,
//! default `kube-system/kured`). The value is the JSON of Go's
//! `LockAnnotationValue`: `{"nodeID": …, "metadata": {"unschedulable": …}, "created":
//! <RFC 3339 time>, "TTL": <Go duration, in nanoseconds>}`. A lock whose `TTL` is above
//! zero and that was created at least `TTL` ago has expired and may be taken over; a `TTL`
//! of 0 never expires. Taking it is a read of the DaemonSet and an update of it with the
//! resourceVersion read (a conflict means someone else wrote in between: read again);
//! releasing it deletes the annotation, only by its holder.
//!
//! inplace shares one budget with kured: while a rollout holds a slot it holds kured's lock
//! under its own holder name ([`holder_id`], never a node's name: kured's daemon on a node
//! releases, and uncordons, a lock it finds in its node's name when it starts), so no kured
//! daemon reboots a node meanwhile; while a kured daemon holds it, the rollout grants no
//! activation (reason `RebootLockHeld`). This module decides; `rollout/kured_lock.rs` reads and
//! writes the DaemonSet.

use inplace_proto::reason::Reason;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

/// kured's default lock annotation.
pub const KURED_LOCK_ANNOTATION: &str = "weave.works/kured-node-lock";

/// kured's `NodeMeta`: whether the node was unschedulable before kured cordoned it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KuredNodeMeta {
    /// Go's `Unschedulable`.
    #[serde(default)]
    pub unschedulable: bool,
}

/// kured's `LockAnnotationValue`, field for field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KuredLockValue {
    /// The holder: a kured daemon's node name, or an inplace rollout's [`holder_id`].
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// Go's `Metadata`.
    #[serde(default)]
    pub metadata: KuredNodeMeta,
    /// When the lock was taken (RFC 3339, as Go's `time.Time` writes it).
    pub created: String,
    /// Go's `time.Duration` in nanoseconds; 0: never expires.
    #[serde(rename = "TTL", default)]
    pub ttl: i64,
}

impl KuredLockValue {
    /// kured's `ttlExpired(created, TTL)`: a TTL above zero that has passed since `created`.
    /// A `created` that cannot be read never expires (fail closed: the lock stays held).
    fn expired(&self, now: Timestamp) -> bool {
        if self.ttl <= 0 {
            return false;
        }
        let Ok(created) = self.created.parse::<Timestamp>() else {
            return false;
        };
        now.duration_since(created) >= SignedDuration::from_nanos(self.ttl)
    }
}

/// The lock as one round read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KuredLock {
    /// No annotation, or an expired one: anyone may take it.
    Free,
    /// Held, not expired, by this holder.
    Held(KuredLockValue),
    /// The annotation is not kured's JSON: nobody knows who holds it (fail closed).
    Unreadable(String),
}

/// Reads the annotation's value (`None`: absent) as kured does at `now`.
pub fn read_lock(value: Option<&str>, now: Timestamp) -> KuredLock {
    let Some(value) = value else {
        return KuredLock::Free;
    };
    match serde_json::from_str::<KuredLockValue>(value) {
        Err(e) => KuredLock::Unreadable(format!("{value:?} is not kured's lock JSON: {e}")),
        Ok(lock) if lock.expired(now) => KuredLock::Free,
        Ok(lock) => KuredLock::Held(lock),
    }
}

/// The holder name a rollout takes kured's lock under: `inplace/<rollout>`.
pub fn holder_id(rollout: &str) -> String {
    format!("inplace/{rollout}")
}

/// What the decision knows of kured's lock (`RolloutInput::kured`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KuredView {
    /// The lock as read this round.
    pub lock: KuredLock,
    /// This rollout's [`holder_id`].
    pub ours: String,
}

impl KuredView {
    /// Whether this rollout holds the lock or may take it.
    pub fn available(&self) -> bool {
        match &self.lock {
            KuredLock::Free => true,
            KuredLock::Held(value) => value.node_id == self.ours,
            KuredLock::Unreadable(_) => false,
        }
    }

    /// The node kured holds the lock for, if another holder has it.
    pub fn held_by_others(&self) -> Option<&str> {
        match &self.lock {
            KuredLock::Held(value) if value.node_id != self.ours => Some(&value.node_id),
            _ => None,
        }
    }

    /// Why no activation may start, if the lock keeps it from starting.
    pub(crate) fn blocker(&self) -> Option<(Reason, String)> {
        let why = match &self.lock {
            KuredLock::Free => return None,
            KuredLock::Held(value) if value.node_id == self.ours => return None,
            KuredLock::Held(value) => {
                format!(
                    "kured's reboot lock is held by {:?} since {}",
                    value.node_id, value.created
                )
            }
            KuredLock::Unreadable(why) => format!("kured's reboot lock cannot be read: {why}"),
        };
        Some((Reason::RebootLockHeld, why))
    }
}

/// The write one round makes to the lock, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KuredWrite {
    /// Set the annotation to this value (take the lock).
    Take(String),
    /// Delete the annotation (release the lock).
    Release,
}

/// What to write so that the rollout holds the lock exactly while `needed` (it holds a
/// slot): kured's `Acquire` (take a free or expired lock, with `ttl`) and `Release` (delete
/// the annotation, only by its holder). `None`: nothing to write (already as wanted, or
/// held by someone else, which the decision already respected).
pub fn lock_write(
    view: &KuredView,
    needed: bool,
    ttl: SignedDuration,
    now: Timestamp,
) -> Option<KuredWrite> {
    let ours = matches!(&view.lock, KuredLock::Held(v) if v.node_id == view.ours);
    match (needed, &view.lock) {
        (true, KuredLock::Free) => {
            let value = KuredLockValue {
                node_id: view.ours.clone(),
                metadata: KuredNodeMeta::default(),
                created: now.to_string(),
                ttl: i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX),
            };
            serde_json::to_string(&value).ok().map(KuredWrite::Take)
        }
        (false, _) if ours => Some(KuredWrite::Release),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn view(value: Option<&str>, now: Timestamp) -> KuredView {
        KuredView {
            lock: read_lock(value, now),
            ours: holder_id("ro"),
        }
    }

    /// The value kured 1.23.0 writes (Go's json.Marshal of LockAnnotationValue).
    const KURED_WROTE: &str = r#"{"nodeID":"worker-2","metadata":{"unschedulable":false},"created":"2026-11-28T08:00:00.123456789Z","TTL":0}"#;

    #[test]
    fn a_lock_kured_wrote_is_held_by_its_node_and_blocks_grants() {
        let v = view(Some(KURED_WROTE), at("2026-11-29T00:00:00Z"));
        assert!(!v.available());
        assert_eq!(v.held_by_others(), Some("worker-2"));
        let (reason, why) = v.blocker().unwrap();
        assert_eq!(reason, Reason::RebootLockHeld);
        assert_eq!(
            why,
            "kured's reboot lock is held by \"worker-2\" since 2026-11-28T08:00:00.123456789Z"
        );
        // Held by someone else: nothing to write, needed or not.
        let ttl = SignedDuration::from_mins(30);
        assert_eq!(lock_write(&v, true, ttl, at("2026-11-29T00:00:00Z")), None);
        assert_eq!(lock_write(&v, false, ttl, at("2026-11-29T00:00:00Z")), None);
    }

    #[test]
    fn a_lock_past_its_ttl_is_free_and_one_without_ttl_never_expires() {
        let with_ttl = r#"{"nodeID":"worker-2","metadata":{"unschedulable":true},"created":"2026-11-28T08:00:00Z","TTL":60000000000}"#;
        assert!(!view(Some(with_ttl), at("2026-11-28T08:00:59Z")).available());
        assert!(view(Some(with_ttl), at("2026-11-28T08:01:00Z")).available());
        assert!(!view(Some(KURED_WROTE), at("2036-01-01T00:00:00Z")).available());
    }

    #[test]
    fn taking_writes_kureds_json_and_releasing_deletes_only_our_lock() {
        let now = at("2026-11-28T08:00:00.5Z");
        let free = view(None, now);
        let Some(KuredWrite::Take(value)) =
            lock_write(&free, true, SignedDuration::from_mins(30), now)
        else {
            panic!("a free lock is taken");
        };
        let json: serde_json::Value = serde_json::from_str(&value).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"nodeID": "inplace/ro", "metadata": {"unschedulable": false},
                "created": "2026-11-28T08:00:00.5Z", "TTL": 1_800_000_000_000_i64})
        );
        let held = view(Some(&value), now);
        assert!(held.available());
        assert_eq!(held.blocker(), None);
        assert_eq!(lock_write(&held, true, SignedDuration::ZERO, now), None);
        assert_eq!(
            lock_write(&held, false, SignedDuration::ZERO, now),
            Some(KuredWrite::Release)
        );
        assert_eq!(lock_write(&free, false, SignedDuration::ZERO, now), None);
    }

    #[test]
    fn an_unreadable_lock_fails_closed() {
        let v = view(Some("yes"), at("2026-11-28T08:00:00Z"));
        assert!(!v.available());
        let (reason, why) = v.blocker().unwrap();
        assert_eq!(reason, Reason::RebootLockHeld);
        assert!(
            why.starts_with("kured's reboot lock cannot be read: \"yes\" is not kured's lock JSON"),
            "{why}"
        );
    }
}
