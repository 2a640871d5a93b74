//! Control-plane Machines: which release may update one in place, decided in one place for
//! `CanUpdateMachine` (the claim) and `UpdateMachine` (the node's plan).
//!
//! A kubeadm control-plane node runs the API server, controller manager, scheduler and etcd
//! as static Pods next to its kubelet. A release that only swaps the kubelet would leave
//! them at the old version and make the kubelet newer than its API server, which the
//! Kubernetes version skew policy does not allow. So a control-plane Machine is updated
//! in place only with a release whose author says it updates control-plane nodes
//! (`spec.updatesControlPlane: true` on the NodeRelease); otherwise Cluster API replaces it.

use serde_json::Value;

use crate::catalog::ReleaseLookup;

/// The label Cluster API's KubeadmControlPlane puts on every Machine it owns (value empty).
pub const CONTROL_PLANE_LABEL: &str = "cluster.x-k8s.io/control-plane";

/// Where an object's labels sit: a Machine's own, and a MachineSet's template (the labels its
/// Machines get).
const LABELS: [&str; 2] = ["/metadata/labels", "/spec/template/metadata/labels"];

/// Whether `object` (a Machine, or a MachineSet through its template) is a control-plane
/// Machine: it carries [`CONTROL_PLANE_LABEL`], whatever its value.
pub fn is_control_plane(object: &Value) -> bool {
    LABELS.iter().any(|pointer| {
        object
            .pointer(pointer)
            .and_then(|labels| labels.get(CONTROL_PLANE_LABEL))
            .is_some()
    })
}

/// The lookup as it stands for this Machine: a release found for a control-plane Machine
/// that does not say it updates control-plane nodes becomes [`ReleaseLookup::Refused`],
/// with why and how to opt in. Anything else is returned unchanged.
pub fn restrict(lookup: ReleaseLookup, control_plane: bool) -> ReleaseLookup {
    match lookup {
        ReleaseLookup::Found(found) if control_plane && !found.spec.updates_control_plane => {
            ReleaseLookup::Refused(format!(
                "this is a control-plane Machine (label {CONTROL_PLANE_LABEL}) and NodeRelease {} does not say it updates control-plane nodes (spec.updatesControlPlane is not true): updating only the kubelet would leave the API server and the other control-plane static Pods at the old version, so Cluster API replaces the Machine instead",
                found.name
            ))
        }
        other => other,
    }
}

/// A note for the unclaimed fields of a control-plane Machine when its bootstrap config
/// changes: those fields come from the KubeadmControlPlane, and kubeadm reads them only
/// when a node joins, so no release can apply them to a running node.
pub fn bootstrap_note(control_plane: bool, unclaimed: &[String]) -> Option<String> {
    let bootstrap = unclaimed
        .iter()
        .any(|path| path.starts_with("bootstrapConfig/"));
    (control_plane && bootstrap).then(|| {
        "a control-plane Machine's bootstrapConfig comes from its KubeadmControlPlane's spec.kubeadmConfigSpec, which kubeadm applies only when a node joins".to_owned()
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::catalog::select_release;
    use crate::catalog::tests::release;
    use serde_json::json;

    /// The lookup for v1.31.2: one valid release, opted in or not.
    pub(crate) fn found(updates_control_plane: bool) -> ReleaseLookup {
        let mut release = release("kubernetes-v1.31.2", "v1.31.2");
        release.spec.updates_control_plane = updates_control_plane;
        select_release(&[release], "v1.31.2")
    }

    #[test]
    fn the_control_plane_label_marks_a_machine_and_a_machine_set_template() {
        let labelled = |labels: Value| json!({"metadata": {"labels": labels}});
        assert!(is_control_plane(&labelled(
            json!({CONTROL_PLANE_LABEL: ""})
        )));
        assert!(!is_control_plane(&labelled(
            json!({"cluster.x-k8s.io/cluster-name": "c1"})
        )));
        assert!(!is_control_plane(&json!({"metadata": {}})));
        assert!(is_control_plane(&json!({
            "spec": {"template": {"metadata": {"labels": {CONTROL_PLANE_LABEL: ""}}}}
        })));
    }

    #[test]
    fn a_control_plane_machine_is_refused_a_release_that_does_not_opt_in() {
        let lookup = restrict(found(false), true);
        let ReleaseLookup::Refused(why) = &lookup else {
            panic!("{lookup:?}")
        };
        assert!(why.contains(CONTROL_PLANE_LABEL), "{why}");
        assert!(why.contains("kubernetes-v1.31.2"), "{why}");
        assert!(why.contains("spec.updatesControlPlane"), "{why}");
        assert_eq!(lookup.explain("v1.31.2"), *why);
    }

    #[test]
    fn a_release_that_opts_in_or_a_worker_keeps_the_release() {
        assert_eq!(restrict(found(true), true), found(true));
        assert_eq!(restrict(found(false), false), found(false));
        assert_eq!(
            restrict(ReleaseLookup::NotFound, true),
            ReleaseLookup::NotFound
        );
    }

    #[test]
    fn bootstrap_changes_of_a_control_plane_machine_are_traced_to_the_kubeadm_control_plane() {
        let unclaimed = vec!["bootstrapConfig/spec/clusterConfiguration/apiServer".to_owned()];
        assert!(
            bootstrap_note(true, &unclaimed)
                .unwrap()
                .contains("KubeadmControlPlane's spec.kubeadmConfigSpec")
        );
        assert_eq!(bootstrap_note(false, &unclaimed), None);
        assert_eq!(
            bootstrap_note(true, &["infrastructureMachine/spec/image".to_owned()]),
            None
        );
    }
}
