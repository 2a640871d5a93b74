//! Flatcar's update operator (FLUO) in the rollout's budget: a node FLUO is rebooting is
//! down, and uses an activation slot like any disruption others cause (`foreign.rs`).
//!
//! Read from FLUO's own source, v0.10.0-rc2 (commit 8dd83d71 of
//! flatcar-linux-update-operator): `pkg/constants/constants.go` names the keys, and
//! `pkg/operator/operator.go` `remainingRebootingCapacity` counts a node as rebooting when
//! its annotations `reboot-ok` and `reboot-needed` are both `"true"` (the operator allowed
//! the reboot the agent asked for, and the agent has not come back yet:
//! `stillRebootingSelector`), or while it carries the label `before-reboot` or
//! `after-reboot` `"true"` (the operator's checks around the reboot). inplace counts the
//! same nodes. It only reads them: FLUO keeps its own `--max-rebooting-nodes`.

use std::collections::BTreeMap;

/// Every key FLUO writes starts with this.
pub const FLUO_PREFIX: &str = "flatcar-linux-update.v1.flatcar-linux.net/";
/// Annotation the agent sets to `"true"` when the node needs a reboot.
pub const REBOOT_NEEDED: &str = "flatcar-linux-update.v1.flatcar-linux.net/reboot-needed";
/// Annotation the operator sets to `"true"` when the node may drain and reboot.
pub const REBOOT_OK: &str = "flatcar-linux-update.v1.flatcar-linux.net/reboot-ok";
/// Label set while the operator runs its checks before a reboot.
pub const BEFORE_REBOOT: &str = "flatcar-linux-update.v1.flatcar-linux.net/before-reboot";
/// Label set while the operator runs its checks after a reboot.
pub const AFTER_REBOOT: &str = "flatcar-linux-update.v1.flatcar-linux.net/after-reboot";

/// Who reboots the node, as the rollout's status names it.
pub const FLUO: &str = "Flatcar's update operator";

/// Whether FLUO counts the node as rebooting, from its labels and annotations.
pub fn rebooting(
    labels: &BTreeMap<String, String>,
    annotations: Option<&BTreeMap<String, String>>,
) -> bool {
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    let label = |key: &str| labels.get(key).map(String::as_str);
    (annotation(REBOOT_OK) == Some("true") && annotation(REBOOT_NEEDED) == Some("true"))
        || label(BEFORE_REBOOT) == Some("true")
        || label(AFTER_REBOOT) == Some("true")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// FLUO's `stillRebootingSelector` and its before/after-reboot labels; a reboot only
    /// asked for (not yet allowed), or done (`reboot-needed` back to false), is not one.
    #[test]
    fn counts_the_nodes_fluo_counts_as_rebooting() {
        let none = map(&[]);
        let allowed = map(&[(REBOOT_OK, "true"), (REBOOT_NEEDED, "true")]);
        let asked = map(&[(REBOOT_NEEDED, "true")]);
        let done = map(&[(REBOOT_OK, "true"), (REBOOT_NEEDED, "false")]);
        assert!(rebooting(&none, Some(&allowed)));
        assert!(!rebooting(&none, Some(&asked)));
        assert!(!rebooting(&none, Some(&done)));
        assert!(!rebooting(&none, None));
        assert!(rebooting(&map(&[(BEFORE_REBOOT, "true")]), None));
        assert!(rebooting(&map(&[(AFTER_REBOOT, "true")]), None));
        assert!(!rebooting(&map(&[(AFTER_REBOOT, "false")]), None));
    }
}
