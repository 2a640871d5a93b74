//! NodeReleases and NodeRollouts on a [`KubeCluster`]: the manifests the beds apply, and the
//! rollout's status as `kubectl` shows it.

use std::time::{Duration, Instant};

use inplace_proto::{NodeRollout, condition};
use kube::api::Api;

use super::KubeCluster;
use crate::sysext::SysextImage;
use crate::{Error, Result};

/// The NodeRollout `kubelets` of the release named `release`: every node, one at a time,
/// halting at the first failure, with `disruption` (`None`, `Cordon` or `Drain`).
pub fn rollout_manifest(release: &str, disruption: &str) -> String {
    format!(
        "apiVersion: inplace.dev/v1alpha1\nkind: NodeRollout\nmetadata:\n  name: kubelets\n\
         spec:\n  release: {release}\n  maxUnavailable: 1\n  maxFailures: 0\n  disruption: {disruption}\n"
    )
}

/// How a release's kubelet takes over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// The image swapped and `kubelet.service` restarted.
    Restart,
    /// The image swapped and the node rebooted (`activation: {mode: Reboot}`).
    Reboot,
}

/// The NodeRelease `name` moving a node to kubelet `version` with `artifact` (a YAML list
/// item): the kubelet restarted, healthy when its unit is steady and its Node `Ready` on
/// `version` for 3 s, within `timeout`. A kubelet that cannot start dies in its first
/// second, and one that starts reports `Ready` at once: a longer window proves nothing more
/// here and costs every node update of the suites its length (the shipped examples say 30 s).
pub(super) fn release_manifest(name: &str, version: &str, artifact: &str, timeout: &str) -> String {
    release_manifest_activated(name, version, artifact, timeout, Activation::Restart)
}

/// [`release_manifest`] activated as `activation` says.
pub(super) fn release_manifest_activated(
    name: &str,
    version: &str,
    artifact: &str,
    timeout: &str,
    activation: Activation,
) -> String {
    let activation = match activation {
        Activation::Restart => "restartUnits: [kubelet.service]",
        Activation::Reboot => "mode: Reboot",
    };
    format!(
        "apiVersion: inplace.dev/v1alpha1
kind: NodeRelease
metadata:
  name: {name}
spec:
  version: {version}
  kubernetesVersion: {version}
  artifacts:
{artifact}  activation:
    {activation}
  healthChecks:
    units: [kubelet.service]
    nodeKubeletVersion: true
    nodeReady: true
    window: 3s
    timeout: {timeout}
"
    )
}

/// The `kubernetes` sysext artifact of `image`, served at `url`.
pub(super) fn sysext_artifact(url: &str, image: &SysextImage) -> String {
    format!(
        "  - name: kubernetes\n    type: Sysext\n    url: {url}\n    sha256: {}\n    size: {}\n",
        image.sha256, image.size
    )
}

impl KubeCluster {
    /// Waits until the NodeRollout `rollout` says `Halted=True`; returns what
    /// `kubectl describe noderollout` shows then. The error holds that, the plans and the
    /// agents' journals.
    pub async fn wait_halted(&self, rollout: &str, timeout: Duration) -> Result<String> {
        // Polled through the API, as the plans are (KubeCluster::wait_plans), and described
        // with kubectl once, at the end.
        let rollouts: Api<NodeRollout> = Api::all(self.client().await?);
        let deadline = Instant::now() + timeout;
        loop {
            let halted = rollouts
                .get_opt(rollout)
                .await
                .ok()
                .flatten()
                .is_some_and(|r| {
                    r.status
                        .is_some_and(|status| condition::is_true(&status.conditions, "Halted"))
                });
            let describe = || self.kubectl(&["describe", "noderollout", rollout]);
            if halted {
                return describe();
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "rollout {rollout} Halted:\n{}\n{}\n{}",
                        describe().unwrap_or_default(),
                        self.plans().unwrap_or_default(),
                        self.agent_journals().await
                    ),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Every plan, one a line: `NAME PHASE REASON: MESSAGE` (of its `Ready` condition).
    pub fn plans(&self) -> Result<String> {
        self.kubectl(&[
            "get",
            "nodeupdateplans",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.conditions[?(@.type=="Ready")].reason}: {.status.conditions[?(@.type=="Ready")].message}{"\n"}{end}"#,
        ])
    }
}
