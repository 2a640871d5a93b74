//! FleetLock: OS reboots of Fedora CoreOS nodes (zincati) take their slot from inplace's
//! budget. The controller serves the FleetLock protocol (`rollout/fleetlock.rs`); this module
//! is its rules, read from zincati's own docs and source (coreos/zincati 0.0.32 as published
//! on crates.io, `src/fleet_lock/mod.rs`, `src/identity/mod.rs`; its
//! `docs/development/fleetlock/protocol.md` and `docs/usage/agent-identity.md`). zincati's
//! crate is a binary only (its client is a private module), so the tests speak the protocol
//! with a client of their own:
//!
//! - `POST /v1/pre-reboot` locks a reboot slot, `POST /v1/steady-state` releases it; both
//!   carry the header `fleet-lock-protocol: true` and the body
//!   `{"client_params": {"group": …, "id": …}}`; the group matches `^[a-zA-Z0-9.-]+$`, the id
//!   is not empty. Locks are recursive and owned: locking what one holds and releasing what
//!   one does not hold both succeed.
//! - 200 is success; an error is a 4xx/5xx with `{"kind": …, "value": …}`, `kind` one of a
//!   few fixed words (zincati counts them in a metric).
//! - zincati's id is its node UUID, by default the machine's *app-specific* ID (systemd's
//!   `sd_id128_get_machine_app_specific`, HMAC-SHA256 keyed by `/etc/machine-id` over
//!   zincati's application ID, made a v4 UUID), in lower-case hex without dashes.
//!
//! inplace maps a client to its Node (the Node's name, or the zincati ID of the Node's
//! `status.nodeInfo.machineID`), records the lock on that Node ([`HOLDER_ANNOTATION`]), and
//! grants it only while the group has room and every rollout selecting the node has a free
//! slot. A held node is down for the rollouts (`foreign.rs`, like kured's and FLUO's reboots).

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// On a Node: the FleetLock client holding a reboot slot for it, `GROUP/ID`.
pub const HOLDER_ANNOTATION: &str = "inplace.dev/fleetlock-holder";

/// Who reboots a held node, as the rollout's status names it.
pub const FLEETLOCK: &str = "a FleetLock client";

/// The header every lock and unlock request carries, with the value `true`.
pub const PROTOCOL_HEADER: &str = "fleet-lock-protocol";

/// zincati's application ID (`de35106b6ec24688b63afddaa156679b`, `src/identity/mod.rs`).
const ZINCATI_APP_ID: [u8; 16] = [
    0xde, 0x35, 0x10, 0x6b, 0x6e, 0xc2, 0x46, 0x88, 0xb6, 0x3a, 0xfd, 0xda, 0xa1, 0x56, 0x67, 0x9b,
];

/// A request's `client_params`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ClientParams {
    /// The reboot group.
    pub group: String,
    /// The client's ID.
    pub id: String,
}

#[derive(serde::Deserialize)]
struct Body {
    client_params: ClientParams,
}

/// A refused request: the HTTP status and the protocol's error object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// 4xx or 5xx.
    pub status: u16,
    /// One of a few fixed words.
    pub kind: &'static str,
    /// What a person reads.
    pub value: String,
}

impl Refusal {
    fn bad_request(value: String) -> Refusal {
        Refusal {
            status: 400,
            kind: "bad_request",
            value,
        }
    }
}

/// A request as the protocol requires it: the header, then the body's `client_params`.
pub fn parse_request(header: Option<&str>, body: &[u8]) -> Result<ClientParams, Refusal> {
    if header != Some("true") {
        return Err(Refusal::bad_request(format!(
            "the header {PROTOCOL_HEADER}: true is missing"
        )));
    }
    let body: Body = serde_json::from_slice(body)
        .map_err(|e| Refusal::bad_request(format!("the body is not FleetLock's: {e}")))?;
    let params = body.client_params;
    let group_ok = !params.group.is_empty()
        && params
            .group
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    if !group_ok {
        return Err(Refusal::bad_request(format!(
            "client_params.group {:?} does not match ^[a-zA-Z0-9.-]+$",
            params.group
        )));
    }
    if params.id.is_empty() {
        return Err(Refusal::bad_request("client_params.id is empty".to_owned()));
    }
    Ok(params)
}

/// The ID zincati sends by default on the machine whose `/etc/machine-id` is `machine_id`
/// (32 hex digits): its app-specific machine ID, as systemd derives it.
pub fn zincati_id(machine_id: &str) -> Option<String> {
    let key = hex::decode(machine_id.trim())
        .ok()
        .filter(|k| k.len() == 16)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(&ZINCATI_APP_ID);
    let digest = mac.finalize().into_bytes();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    // A version 4 UUID, variant 1 (systemd's id128_make_v4_uuid).
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    Some(hex::encode(id))
}

/// Whether the client `id` is the node `name` with `machine_id`: its name, or zincati's ID.
pub fn is_client_of(id: &str, name: &str, machine_id: Option<&str>) -> bool {
    id == name || machine_id.and_then(zincati_id).is_some_and(|z| z == id)
}

/// The annotation's value for `client`.
pub fn holder_value(client: &ClientParams) -> String {
    format!("{}/{}", client.group, client.id)
}

/// The holder recorded on a Node, if any.
pub fn holder(annotations: Option<&BTreeMap<String, String>>) -> Option<&str> {
    annotations
        .and_then(|a| a.get(HOLDER_ANNOTATION))
        .map(String::as_str)
}

/// A rollout's budget as the lock request finds it: the slots `maxUnavailable` gives its
/// selected nodes and the nodes down now (its own activations and others' disruption,
/// the FleetLock holders among them), named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutBudget {
    /// The rollout.
    pub rollout: String,
    /// Its activation slots.
    pub slots: usize,
    /// Its selected nodes that are down, with why.
    pub down: Vec<(String, String)>,
}

/// Whether `client`, the client of `node`, may lock a reboot slot: already holding it (the
/// lock is recursive), else room in its group (`max_holders`, counting `group_holders`) and
/// a free slot in every rollout that selects the node.
pub fn may_lock(
    client: &ClientParams,
    node_holder: Option<&str>,
    group_holders: usize,
    max_holders: usize,
    budgets: &[RolloutBudget],
) -> Result<(), Refusal> {
    let value = holder_value(client);
    match node_holder {
        Some(held) if held == value => return Ok(()),
        Some(held) => {
            return Err(Refusal {
                status: 409,
                kind: "failed_lock_node_held",
                value: format!("the node's reboot slot is held by {held}"),
            });
        }
        None => {}
    }
    if group_holders >= max_holders {
        return Err(Refusal {
            status: 409,
            kind: "failed_lock_semaphore_full",
            value: format!(
                "group {} holds {group_holders} of its {max_holders} reboot slots",
                client.group
            ),
        });
    }
    if let Some(full) = budgets.iter().find(|b| b.down.len() >= b.slots) {
        let named: Vec<String> = full
            .down
            .iter()
            .map(|(node, why)| format!("{node} {why}"))
            .collect();
        return Err(Refusal {
            status: 409,
            kind: "failed_lock_rollout_budget",
            value: format!(
                "NodeRollout {} has {} of {} slots in use: {}",
                full.rollout,
                full.down.len(),
                full.slots,
                named.join(", ")
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(group: &str, id: &str) -> ClientParams {
        ClientParams {
            group: group.into(),
            id: id.into(),
        }
    }

    #[test]
    fn a_request_needs_the_header_a_group_of_the_protocols_letters_and_an_id() {
        let body = br#"{"client_params": {"group": "workers", "id": "c988d250"}}"#;
        assert_eq!(
            parse_request(Some("true"), body),
            Ok(client("workers", "c988d250"))
        );
        let refused = |header, body: &[u8]| parse_request(header, body).unwrap_err().value;
        assert!(refused(None, body).contains("fleet-lock-protocol"));
        assert!(refused(Some("false"), body).contains("fleet-lock-protocol"));
        assert!(
            refused(
                Some("true"),
                br#"{"client_params": {"group": "a b", "id": "x"}}"#
            )
            .contains("client_params.group \"a b\"")
        );
        assert!(
            refused(
                Some("true"),
                br#"{"client_params": {"group": "g", "id": ""}}"#
            )
            .contains("client_params.id is empty")
        );
        assert!(refused(Some("true"), b"{}").contains("not FleetLock's"));
    }

    #[test]
    fn zincatis_id_is_the_app_specific_machine_id_systemd_derives() {
        // `systemd-id128 machine-id --app-specific=de35106b6ec24688b63afddaa156679b` on a
        // machine whose /etc/machine-id is the first (systemd 252, this project's test host).
        let id = zincati_id("3d1219c7c4c5404aaa1f6d2a48adfda4").unwrap();
        assert_eq!(id, "975228d46dc94622b9bbe16671e2b58d");
        assert!(zincati_id("not hex").is_none());
        assert!(zincati_id("abcd").is_none());
        assert!(is_client_of(
            &id,
            "worker-1",
            Some("3d1219c7c4c5404aaa1f6d2a48adfda4")
        ));
        assert!(is_client_of("worker-1", "worker-1", None));
        assert!(!is_client_of("worker-2", "worker-1", None));
    }

    #[test]
    fn a_lock_is_recursive_owned_bounded_by_its_group_and_by_every_rollouts_slots() {
        let me = client("default", "a");
        let budget = |down: usize| RolloutBudget {
            rollout: "workers".into(),
            slots: 2,
            down: (0..down)
                .map(|i| (format!("n{i}"), "cordoned".into()))
                .collect(),
        };
        assert_eq!(may_lock(&me, Some("default/a"), 5, 1, &[budget(2)]), Ok(()));
        let held = may_lock(&me, Some("default/b"), 0, 1, &[]).unwrap_err();
        assert_eq!(held.kind, "failed_lock_node_held");
        let full = may_lock(&me, None, 1, 1, &[]).unwrap_err();
        assert_eq!(full.kind, "failed_lock_semaphore_full");
        assert_eq!(full.value, "group default holds 1 of its 1 reboot slots");
        assert_eq!(may_lock(&me, None, 0, 1, &[budget(1)]), Ok(()));
        let busy = may_lock(&me, None, 0, 1, &[budget(2)]).unwrap_err();
        assert_eq!(busy.kind, "failed_lock_rollout_budget");
        assert_eq!(
            busy.value,
            "NodeRollout workers has 2 of 2 slots in use: n0 cordoned, n1 cordoned"
        );
    }
}
