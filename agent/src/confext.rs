//! Configuration extension images (`systemd-confext`, systemd >= 254): a Config artifact
//! linked as `/var/lib/confexts/<name>.raw` ([`inplace_proto::Artifact::confext_name`]). It
//! is staged, verified and swapped like any Config; `update/swap.rs` refreshes it through
//! the same transient unit as system extensions and proves it merged. Here: the refusal, with
//! no I/O, on a node whose systemd has no `systemd-confext`.

use inplace_proto::validate::FieldError;
use inplace_proto::{Reason, UpdateContent};

use crate::systemd::CONFEXT_SINCE;

/// The plan's configuration extensions this node cannot merge: each as a `PolicyDenied`
/// problem at its `path`, naming the extension and the node's systemd. `systemd_version` is
/// PID 1's major version as read for this plan (`Err`: it could not be read; `None`: not
/// read, because the plan has no configuration extension).
pub fn unsupported(
    content: &UpdateContent,
    systemd_version: Option<&Result<u32, String>>,
) -> Vec<FieldError> {
    let runs = match systemd_version {
        None | Some(Ok(CONFEXT_SINCE..)) => return Vec::new(),
        Some(Ok(version)) => format!("this node runs systemd {version}"),
        Some(Err(e)) => format!("this node's systemd version could not be read ({e})"),
    };
    content
        .artifacts
        .iter()
        .enumerate()
        .filter_map(|(i, artifact)| {
            let name = artifact.confext_name()?;
            Some(FieldError {
                path: format!("spec.artifacts[{i}].path"),
                reason: Reason::PolicyDenied,
                message: format!(
                    "configuration extension {name} needs systemd-confext (systemd >= \
                     {CONFEXT_SINCE}) and {runs}; nothing was changed. Ship its files as \
                     Config artifacts, or update the node's OS first"
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use inplace_proto::ArtifactType;

    fn content(path: &str) -> UpdateContent {
        serde_json::from_value(serde_json::json!({"artifacts": [{
            "name": "kubelet-conf", "type": "Config", "url": "https://files.example/c.raw",
            "sha256": "0".repeat(64), "path": path,
        }]}))
        .unwrap()
    }

    #[test]
    fn a_confext_is_refused_below_systemd_254_with_the_reason() {
        let image = content("/var/lib/confexts/kubelet-conf.raw");
        let problems = unsupported(&image, Some(&Ok(252)));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].path, "spec.artifacts[0].path");
        assert_eq!(problems[0].reason, Reason::PolicyDenied);
        assert!(
            problems[0].message.contains("kubelet-conf")
                && problems[0].message.contains("systemd >= 254")
                && problems[0].message.contains("runs systemd 252"),
            "{}",
            problems[0].message
        );
        let unread = unsupported(&image, Some(&Err("no bus".into())));
        assert!(unread[0].message.contains("could not be read (no bus)"));
        assert!(unsupported(&image, Some(&Ok(254))).is_empty());
        assert!(unsupported(&image, Some(&Ok(257))).is_empty());
        // A plain configuration file needs no confext.
        assert!(unsupported(&content("/etc/kubernetes/kubelet.conf"), Some(&Ok(252))).is_empty());
        assert_eq!(image.artifacts[0].kind, ArtifactType::Config);
    }
}
