//! The invariant of faults.md after every case, on the node and in the status.

use inplace_tests::kube_node::KubeletImage;
use inplace_tests::kube_node::kubelet::KUBELET_DROP_IN_PATH;
use sha2::Digest;

use super::{Bed, Kubelet, STAND_IN_FLAVOR, kubectl};

impl Bed {
    /// The invariant of faults.md on the host and in the status, with `tag` / `revision`
    /// committed and `previous` still on disk; on a real kubelet also the Node `Ready` and
    /// the Pod's container the one it was before the first case.
    pub async fn check_invariant(&self, tag: &str, revision: &str, previous: &str, label: &str) {
        self.check_links(tag, label).await;
        let node = &self.real.node;
        // The link's image is the committed one (its sha256, above); the merged /usr must be
        // a healthy image's, whatever image a crash left merged.
        let (merged, healthy) = match self.kubelet {
            Kubelet::Real => (KUBELET_DROP_IN_PATH, KubeletImage::Working.drop_in()),
            Kubelet::StandIn => (STAND_IN_FLAVOR, "healthy\n".to_owned()),
        };
        assert_eq!(
            node.exec_ok(&["cat", &format!("/{merged}")]).await.unwrap(),
            healthy,
            "{label}: the merged /usr is a healthy image's"
        );
        assert!(
            node.is_active("kubelet.service").await.unwrap(),
            "{label}: kubelet runs\n{}",
            self.real.diagnostics().await
        );
        if previous != tag {
            assert!(
                node.exists(format!(
                    "/opt/extensions/kubernetes/kubernetes-{previous}.raw"
                ))
                .await
                .unwrap(),
                "{label}: the previous revision ({previous}) is still on disk"
            );
        }
        let leftovers = node
            .sh_ok(
                "find /etc/extensions /opt/bin /opt/extensions -name '*.inplace-new*'; \
                 ls -A /var/lib/inplace/tmp 2>/dev/null || true",
            )
            .await
            .unwrap();
        assert!(
            leftovers.trim().is_empty(),
            "{label}: temporaries left: {leftovers}"
        );
        let status = self
            .real
            .api
            .get(node.name())
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(
            status.current_revision.as_deref(),
            Some(revision),
            "{label}: currentRevision"
        );
        self.check_pod(label).await;
    }

    /// The sysext link and the managed binary links point at complete files of `tag`; a
    /// binary the committed revision dropped has no link left.
    async fn check_links(&self, tag: &str, label: &str) {
        let node = &self.real.node;
        let link = node
            .exec_ok(&["readlink", "/etc/extensions/kubernetes.raw"])
            .await
            .unwrap();
        let expected = format!("/opt/extensions/kubernetes/kubernetes-{tag}.raw");
        assert_eq!(link.trim(), expected, "{label}: sysext link");
        let sum = node.exec_ok(&["sha256sum", &expected]).await.unwrap();
        assert!(
            sum.starts_with(&self.images[tag].sha256),
            "{label}: sysext image is complete and verified: {sum}"
        );
        let bin = node
            .exec_ok(&["readlink", "/opt/bin/kubectl"])
            .await
            .unwrap();
        let bin_sum = node.exec_ok(&["sha256sum", bin.trim()]).await.unwrap();
        assert!(
            bin_sum.starts_with(&hex::encode(sha2::Sha256::digest(kubectl(tag)))),
            "{label}: kubectl link → {bin}: {bin_sum}"
        );
        assert_eq!(
            node.exec_ok(&["/opt/bin/kubectl"]).await.unwrap().trim(),
            format!("kubectl-{tag}"),
            "{label}"
        );
        let crictl_now = node
            .sh_ok(
                "if [ -L /opt/bin/crictl ] || [ -e /opt/bin/crictl ]; \
                 then /opt/bin/crictl || echo broken; else echo absent; fi",
            )
            .await
            .unwrap();
        let crictl_wanted = if self.committed_crictl {
            format!("crictl-{tag}")
        } else {
            "absent".to_owned()
        };
        assert_eq!(crictl_now.trim(), crictl_wanted, "{label}: /opt/bin/crictl");
    }

    /// On a real kubelet: the Node is `Ready` and the Pod kept its container through every
    /// case so far.
    async fn check_pod(&self, label: &str) {
        if let Some(before) = &self.pod {
            self.real.assert_pods_kept(before, label).await;
        }
    }
}
