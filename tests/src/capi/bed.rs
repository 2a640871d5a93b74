//! Cluster API on the real-node bed: the bed's providers ([`super::provider`]), Cluster API's
//! own manager ([`super::manager`]) and the extension registered from its packaged
//! ExtensionConfig ([`super::extension`]), all on one kube-apiserver that is both the
//! management and the workload cluster; plus the objects a user writes for a
//! MachineDeployment of the bed's nodes.

use std::time::Duration;

use anyhow::Context;

use super::extension::{self, CapiExtension};
use super::manager::CapiManager;
use super::provider::BedProviders;
use crate::apiserver::ApiServer;

/// How long Cluster API may take to discover the extension on a loaded machine.
const DISCOVERY_PATIENCE: &str = "--timeout=300s";

/// Everything Cluster API needs on top of a bed's control plane and nodes.
pub struct CapiBed {
    /// Cluster API's manager.
    pub manager: CapiManager,
    /// The in-place extension.
    pub extension: CapiExtension,
    /// The bed's infrastructure and control-plane providers.
    pub providers: BedProviders,
}

impl CapiBed {
    /// Installs and starts the providers, Cluster API's manager and the extension on
    /// `server`; returns once Cluster API has discovered the extension's handlers.
    pub async fn start(server: &ApiServer) -> anyhow::Result<CapiBed> {
        let providers = BedProviders::start(server).await?;
        let address = extension::service_address();
        let manager = CapiManager::start_with(server, &[(extension::SERVICE_HOST, address)])
            .await
            .context("starting Cluster API's manager")?;
        let extension = CapiExtension::start(server, address)
            .await
            .context("starting the extension")?;
        let bed = CapiBed {
            manager,
            extension,
            providers,
        };
        server
            .run_kubectl(&[
                "wait",
                "extensionconfig/inplace",
                "--for=condition=Discovered",
                DISCOVERY_PATIENCE,
            ])
            .with_context(|| format!("discovery of the extension:\n{}", bed.diagnostics()))?;
        Ok(bed)
    }

    /// The last lines of the manager's and the extension's logs and the providers' last
    /// error, for a failure message.
    pub fn diagnostics(&self) -> String {
        let extension = self.extension.log();
        let lines: Vec<&str> = extension.lines().collect();
        format!(
            "--- capi-manager\n{}\n--- extension\n{}\n--- bed providers: {}",
            self.manager.log_tail(),
            lines[lines.len().saturating_sub(20)..].join("\n"),
            self.providers
                .last_error()
                .unwrap_or_else(|| "no error".to_owned()),
        )
    }
}

/// What a user applies for a MachineDeployment `workers` of `replicas` of the bed's nodes on
/// kubelet `version`, in the Cluster `bed` (namespace `default`): the Cluster naming the bed's
/// BedCluster and BedControlPlane (the control plane's version is the bed's kube-apiserver's,
/// `control_plane_version`), the BedMachineTemplate and BedBootstrapConfigTemplate (the nodes
/// are booted already: the bootstrap data is never run), and the MachineDeployment, rolled
/// out one Machine at a time without surge (`maxUnavailable: 1`, `maxSurge: 0`: Cluster API
/// creates no extra Machine for an in-place update).
pub fn cluster_manifest(replicas: usize, version: &str, control_plane_version: &str) -> String {
    format!(
        "apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {{name: bed, namespace: default}}
spec:
  infrastructureRef: {{apiGroup: infrastructure.bed.inplace.dev, kind: BedCluster, name: bed}}
  controlPlaneRef: {{apiGroup: controlplane.bed.inplace.dev, kind: BedControlPlane, name: bed}}
---
apiVersion: infrastructure.bed.inplace.dev/v1alpha1
kind: BedCluster
metadata: {{name: bed, namespace: default}}
spec: {{}}
---
apiVersion: controlplane.bed.inplace.dev/v1alpha1
kind: BedControlPlane
metadata: {{name: bed, namespace: default}}
spec: {{version: {control_plane_version}}}
---
apiVersion: infrastructure.bed.inplace.dev/v1alpha1
kind: BedMachineTemplate
metadata: {{name: workers, namespace: default}}
spec:
  template:
    spec: {{}}
---
apiVersion: bootstrap.bed.inplace.dev/v1alpha1
kind: BedBootstrapConfigTemplate
metadata: {{name: workers, namespace: default}}
spec:
  template:
    spec: {{}}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {{name: workers, namespace: default}}
spec:
  clusterName: bed
  replicas: {replicas}
  selector:
    matchLabels: {{pool: workers}}
  rollout:
    strategy:
      type: RollingUpdate
      rollingUpdate: {{maxSurge: 0, maxUnavailable: 1}}
  template:
    metadata:
      labels: {{pool: workers}}
    spec:
      clusterName: bed
      version: {version}
      bootstrap:
        configRef: {{apiGroup: bootstrap.bed.inplace.dev, kind: BedBootstrapConfigTemplate, name: workers}}
      infrastructureRef: {{apiGroup: infrastructure.bed.inplace.dev, kind: BedMachineTemplate, name: workers}}
"
    )
}

/// How long a MachineDeployment over real nodes may take on a loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(900);
