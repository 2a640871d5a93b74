//! kured's reboot lock, read and written exactly as kured does (kured 1.23.0,
//! `pkg/daemonsetlock/daemonsetlock.go`): the single-holder `DaemonSetSingleLock` of kured's
//! default `--concurrency=1`, and the multi-holder `DaemonSetMultiLock` of `--concurrency`
//! above 1.
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
//! With `--concurrency=N` above 1 the annotation is Go's `multiLockAnnotationValue`:
//! `{"maxOwners": N, "locks": [<LockAnnotationValue>, …]}` (`locks` may be `null`). A holder
//! may join while fewer than `maxOwners` locks are stored (all of them kept, expired or not),
//! or, with `maxOwners` or more stored, when one of them has expired (the expired ones are
//! dropped); releasing removes the holder's own entry and writes the rest back
//! (`canAcquireMultiple`, `Release`).
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

/// kured's `multiLockAnnotationValue`, field for field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KuredMultiLockValue {
    /// Go's `MaxOwners`: kured's `--concurrency`.
    #[serde(rename = "maxOwners")]
    pub max_owners: i64,
    /// Go's `LockAnnotations` (`null` when Go's slice is nil).
    #[serde(rename = "locks", default)]
    pub locks: Option<Vec<KuredLockValue>>,
}

impl KuredMultiLockValue {
    fn stored(&self) -> &[KuredLockValue] {
        self.locks.as_deref().unwrap_or_default()
    }

    /// kured's `canAcquireMultiple` for `holder` at `now`: the value to write when there is
    /// room (fewer than `maxOwners` stored, all kept; or an expired one, dropped).
    fn joined(&self, holder: KuredLockValue, now: Timestamp) -> Option<KuredMultiLockValue> {
        let max = usize::try_from(self.max_owners).unwrap_or(0);
        let stored = self.stored();
        let mut locks: Vec<KuredLockValue> = if stored.len() < max {
            stored.to_vec()
        } else {
            let kept: Vec<KuredLockValue> =
                stored.iter().filter(|l| !l.expired(now)).cloned().collect();
            if kept.len() == stored.len() {
                return None;
            }
            kept
        };
        locks.push(holder);
        Some(KuredMultiLockValue {
            max_owners: self.max_owners,
            locks: Some(locks),
        })
    }

    /// kured's `Release` for `holder`: its first entry removed, the rest written back.
    fn left(&self, holder: &str) -> KuredMultiLockValue {
        let mut locks = self.stored().to_vec();
        if let Some(i) = locks.iter().position(|l| l.node_id == holder) {
            locks.remove(i);
        }
        KuredMultiLockValue {
            max_owners: self.max_owners,
            locks: Some(locks),
        }
    }
}

/// The lock as one round read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KuredLock {
    /// No annotation, or an expired one: anyone may take it.
    Free,
    /// Held, not expired, by this holder.
    Held(KuredLockValue),
    /// kured's multi-holder lock as stored, with its holders that have not expired and
    /// whether a new holder may join now.
    Shared {
        /// The annotation as stored.
        value: KuredMultiLockValue,
        /// Its locks that have not expired.
        holders: Vec<KuredLockValue>,
        /// Whether a new holder may join ([`KuredMultiLockValue`]'s rule).
        room: bool,
    },
    /// The annotation is not kured's JSON: nobody knows who holds it (fail closed).
    Unreadable(String),
}

/// Reads the annotation's value (`None`: absent) as kured does at `now`.
pub fn read_lock(value: Option<&str>, now: Timestamp) -> KuredLock {
    let Some(value) = value else {
        return KuredLock::Free;
    };
    if let Ok(multi) = serde_json::from_str::<KuredMultiLockValue>(value) {
        let holders = multi
            .stored()
            .iter()
            .filter(|l| !l.expired(now))
            .cloned()
            .collect();
        let probe = KuredLockValue {
            node_id: String::new(),
            metadata: KuredNodeMeta::default(),
            created: now.to_string(),
            ttl: 0,
        };
        let room = multi.joined(probe, now).is_some();
        return KuredLock::Shared {
            value: multi,
            holders,
            room,
        };
    }
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
    /// Whether this rollout holds the lock (or a place in it) or may take it.
    pub fn available(&self) -> bool {
        match &self.lock {
            KuredLock::Free => true,
            KuredLock::Held(value) => value.node_id == self.ours,
            KuredLock::Shared { room, .. } => *room || self.holds(),
            KuredLock::Unreadable(_) => false,
        }
    }

    /// Whether this rollout holds the lock, or a place in kured's multi-holder lock.
    fn holds(&self) -> bool {
        match &self.lock {
            KuredLock::Held(value) => value.node_id == self.ours,
            KuredLock::Shared { holders, .. } => holders.iter().any(|h| h.node_id == self.ours),
            KuredLock::Free | KuredLock::Unreadable(_) => false,
        }
    }

    /// The nodes kured holds the lock for, other holders than this rollout.
    pub fn held_by_others(&self) -> Vec<&str> {
        match &self.lock {
            KuredLock::Held(value) if value.node_id != self.ours => vec![value.node_id.as_str()],
            KuredLock::Shared { holders, .. } => holders
                .iter()
                .map(|h| h.node_id.as_str())
                .filter(|h| *h != self.ours)
                .collect(),
            _ => Vec::new(),
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
            KuredLock::Shared { .. } if self.available() => return None,
            KuredLock::Shared { value, holders, .. } => format!(
                "kured's reboot lock has all its {} holders: {}",
                value.max_owners,
                holders
                    .iter()
                    .map(|h| format!("{:?}", h.node_id))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            KuredLock::Unreadable(why) => format!("kured's reboot lock cannot be read: {why}"),
        };
        Some((Reason::RebootLockHeld, why))
    }
}

/// The write one round makes to the lock, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KuredWrite {
    /// Set the annotation to this value (take the lock, or join the multi-holder lock).
    Take(String),
    /// Release the lock: delete the annotation (`None`), or write the multi-holder lock back
    /// without this rollout's entry.
    Release(Option<String>),
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
    let ours = view.holds();
    let value = KuredLockValue {
        node_id: view.ours.clone(),
        metadata: KuredNodeMeta::default(),
        created: now.to_string(),
        ttl: i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX),
    };
    match (needed, &view.lock) {
        (true, KuredLock::Free) => serde_json::to_string(&value).ok().map(KuredWrite::Take),
        (true, KuredLock::Shared { value: stored, .. }) if !ours => {
            let joined = stored.joined(value, now)?;
            serde_json::to_string(&joined).ok().map(KuredWrite::Take)
        }
        (false, KuredLock::Shared { value: stored, .. }) if ours => {
            let left = stored.left(&view.ours);
            serde_json::to_string(&left)
                .ok()
                .map(|v| KuredWrite::Release(Some(v)))
        }
        (false, _) if ours => Some(KuredWrite::Release(None)),
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
        assert_eq!(v.held_by_others(), ["worker-2"]);
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
            Some(KuredWrite::Release(None))
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

    /// What kured 1.23.0 writes with `--concurrency=2` (Go's json.Marshal of
    /// multiLockAnnotationValue), one daemon holding it.
    const KURED_MULTI: &str = r#"{"maxOwners":2,"locks":[{"nodeID":"worker-2","metadata":{"unschedulable":false},"created":"2026-11-28T08:00:00Z","TTL":0}]}"#;

    #[test]
    fn kureds_multi_holder_lock_is_joined_while_it_has_room_and_left_by_our_entry_only() {
        let now = at("2026-11-28T09:00:00Z");
        let v = view(Some(KURED_MULTI), now);
        assert!(v.available());
        assert_eq!(v.blocker(), None);
        assert_eq!(v.held_by_others(), ["worker-2"]);
        let Some(KuredWrite::Take(joined)) = lock_write(&v, true, SignedDuration::ZERO, now) else {
            panic!("a multi-holder lock with room is joined");
        };
        let json: serde_json::Value = serde_json::from_str(&joined).unwrap();
        assert_eq!(json["maxOwners"], 2);
        assert_eq!(json["locks"][0]["nodeID"], "worker-2");
        assert_eq!(json["locks"][1]["nodeID"], "inplace/ro");
        // Full with us in it: still ours; kured's other daemons see no room.
        let ours = view(Some(&joined), now);
        assert!(ours.available());
        assert_eq!(ours.held_by_others(), ["worker-2"]);
        assert_eq!(lock_write(&ours, true, SignedDuration::ZERO, now), None);
        let Some(KuredWrite::Release(Some(left))) =
            lock_write(&ours, false, SignedDuration::ZERO, now)
        else {
            panic!("our entry is removed and the rest written back");
        };
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&left).unwrap(),
            serde_json::from_str::<serde_json::Value>(KURED_MULTI).unwrap()
        );
    }

    #[test]
    fn a_full_multi_holder_lock_blocks_grants_until_an_entry_expires() {
        let full = r#"{"maxOwners":2,"locks":[
            {"nodeID":"worker-1","metadata":{"unschedulable":false},"created":"2026-11-28T08:00:00Z","TTL":0},
            {"nodeID":"worker-2","metadata":{"unschedulable":false},"created":"2026-11-28T08:00:00Z","TTL":60000000000}]}"#;
        let v = view(Some(full), at("2026-11-28T08:00:30Z"));
        assert!(!v.available());
        assert_eq!(v.held_by_others(), ["worker-1", "worker-2"]);
        let (reason, why) = v.blocker().unwrap();
        assert_eq!(reason, Reason::RebootLockHeld);
        assert_eq!(
            why,
            "kured's reboot lock has all its 2 holders: \"worker-1\", \"worker-2\""
        );
        let later = at("2026-11-28T08:01:00Z");
        let expired = view(Some(full), later);
        assert!(expired.available());
        assert_eq!(expired.held_by_others(), ["worker-1"]);
        let Some(KuredWrite::Take(joined)) =
            lock_write(&expired, true, SignedDuration::ZERO, later)
        else {
            panic!("an expired entry makes room");
        };
        let json: serde_json::Value = serde_json::from_str(&joined).unwrap();
        let holders: Vec<&str> = json["locks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["nodeID"].as_str().unwrap())
            .collect();
        assert_eq!(holders, ["worker-1", "inplace/ro"]);
        let empty = view(Some(r#"{"maxOwners":3,"locks":null}"#), later);
        assert!(empty.available() && empty.held_by_others().is_empty());
    }
}
