//! A whole cluster on real nodes, for people (`inplace-testbed cluster`) and tests alike: the
//! real control plane with the scheduler and workload controllers, N real nodes on the oldest
//! kubelet with the agent installed as a package would install it (its node identity), the
//! controller as its shipped ServiceAccount, and every built kubelet release served as a
//! sysext image on the bed's artifact server, with a ready-to-apply NodeRelease for each.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inplace_proto::{NodeUpdatePlan, Phase};
use kube::api::{Api, ListParams};

use super::config::WORKLOAD_IMAGE;
pub use super::rollout::{Activation, rollout_manifest};
use super::rollout::{release_manifest, release_manifest_activated, sysext_artifact};
use super::{KUBELET_RELEASES, KubeNode, KubeNodeConfig, KubeletImage, kubelet_sysext};
use crate::apiserver::{ApiServer, run_kubectl};
use crate::artifact_server::{Artifact, ArtifactServer};
use crate::error::IoContext;
use crate::install::{
    CONTROLLER_GROUPS, CONTROLLER_USER, add_agent, install_manifests, spawn_controller,
};
use crate::nspawn::{Node, NodeOptions};
use crate::sysext::{SysextBuilder, SysextImage, host_architecture};
use crate::{Error, Result};

/// How long a real node may take to be `Ready` on a loaded 2-core machine.
const READY_PATIENCE: Duration = Duration::from_secs(300);

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Where everything lives: the API server's state, images, kubeconfigs, the manifests.
    pub dir: PathBuf,
    /// How many nodes.
    pub nodes: usize,
    /// Node names are `PREFIX-1` ... (with a unique suffix, so that beds never collide).
    pub name_prefix: String,
    /// The kubelet release the nodes boot with.
    pub kubelet: String,
    /// The agent binary installed on every node.
    pub agent: PathBuf,
    /// The controller binary, run as its shipped ServiceAccount; `None`: no controller.
    pub controller: Option<PathBuf>,
    /// Where the nodes' `kubelet.service` runs the kubelet from
    /// ([`KubeNodeConfig::kubelet_path`]).
    pub kubelet_path: Option<PathBuf>,
}

/// A running cluster; dropping it stops the controller, the nodes and the control plane.
pub struct KubeCluster {
    /// The control plane.
    pub api: ApiServer,
    /// Serves every built kubelet release's image and `SHA256SUMS`.
    pub server: ArtifactServer,
    /// The nodes, in name order.
    pub nodes: Vec<KubeNode>,
    /// The images served, by release.
    pub images: Vec<(String, SysextImage)>,
    controller: Option<tokio::process::Child>,
    options: ClusterOptions,
    images_dir: PathBuf,
}

impl KubeCluster {
    /// Starts everything, telling `progress` what it is doing.
    pub async fn start(options: &ClusterOptions, progress: &dyn Fn(&str)) -> Result<KubeCluster> {
        let dir = &options.dir;
        create_dir(dir).await?;
        progress(
            "starting the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)",
        );
        let api = ApiServer::start_for_kubelets(&dir.join("api"))
            .await
            .map_err(|e| Error::Invalid(format!("starting the control plane: {e:#}")))?;
        install_manifests(&api.admin_kubeconfig())?;

        progress("packing every built kubelet release as a sysext image and serving it");
        let server = ArtifactServer::start().await?;
        let images = serve_kubelet_images(&server, &dir.join("images")).await?;
        let first = images
            .iter()
            .find(|(release, _)| *release == options.kubelet)
            .map(|(_, image)| image.clone())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "no kubelet {} (built: {KUBELET_RELEASES:?})",
                    options.kubelet
                ))
            })?;
        let images_dir = super::node_images().await?;

        progress(&format!(
            "booting {} nodes on kubelet {} with containerd and the agent",
            options.nodes, options.kubelet
        ));
        let boots = (1..=options.nodes).map(|i| {
            let name = Node::unique_name(&format!("{}-{i}", options.name_prefix));
            boot_node(
                &api,
                &server,
                options,
                name,
                first.clone(),
                images_dir.clone(),
            )
        });
        let mut nodes = Vec::new();
        for booted in futures::future::join_all(boots).await {
            nodes.push(booted?);
        }
        let client = api
            .client()
            .await
            .map_err(|e| Error::Invalid(format!("admin client: {e:#}")))?;
        for node in &nodes {
            if let Err(e) =
                super::wait_node_ready(&client, node.name(), Some(&options.kubelet), READY_PATIENCE)
                    .await
            {
                return Err(Error::Invalid(format!("{e}\n{}", node.diagnostics().await)));
            }
            progress(&format!(
                "node {} Ready on kubelet {}",
                node.name(),
                options.kubelet
            ));
        }
        let controller = match &options.controller {
            Some(binary) => {
                progress(
                    "starting inplace-controller (ServiceAccount inplace-system/inplace-controller)",
                );
                let kubeconfig = dir.join("controller.kubeconfig");
                api.write_kubeconfig(&kubeconfig, CONTROLLER_USER, &CONTROLLER_GROUPS)
                    .map_err(|e| Error::Invalid(format!("the controller's kubeconfig: {e:#}")))?;
                Some(spawn_controller(
                    binary,
                    &kubeconfig,
                    &dir.join("controller.log"),
                )?)
            }
            None => None,
        };
        let cluster = KubeCluster {
            api,
            server,
            nodes,
            images,
            controller,
            options: options.clone(),
            images_dir,
        };
        cluster.write_files()?;
        Ok(cluster)
    }

    /// The admin's kubeconfig (`DIR/admin.kubeconfig`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.options.dir.join("admin.kubeconfig")
    }

    /// Boots one more node on kubelet `release` (a machine replacement joining the cluster)
    /// and waits until its kubelet answers; its Node's readiness is the API's to tell.
    pub async fn add_node(&mut self, prefix: &str, release: &str) -> Result<&KubeNode> {
        let image = self.image(release)?.clone();
        let name = Node::unique_name(prefix);
        let node = boot_node(
            &self.api,
            &self.server,
            &self.options,
            name,
            image,
            self.images_dir.clone(),
        )
        .await?;
        self.nodes.push(node);
        Ok(&self.nodes[self.nodes.len() - 1])
    }

    /// A client acting as the admin.
    pub async fn client(&self) -> Result<kube::Client> {
        self.api
            .client()
            .await
            .map_err(|e| Error::Invalid(format!("admin client: {e:#}")))
    }

    /// kubectl of the pinned release as the admin; its standard output.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        run_kubectl(&self.admin_kubeconfig(), args).map_err(|e| Error::Invalid(format!("{e:#}")))
    }

    /// Writes `manifest` to `DIR/manifests/NAME.yaml` and applies it with kubectl.
    pub fn apply(&self, name: &str, manifest: &str) -> Result<()> {
        let dir = self.options.dir.join("manifests");
        std::fs::create_dir_all(&dir).ctx(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, manifest).ctx(|| format!("writing {}", path.display()))?;
        self.kubectl(&["apply", "-f", &path.display().to_string()])
            .map(|_| ())
    }

    /// Waits until every node's plan is in `phase`; the error holds the plans, the rollouts
    /// and the agents' journals.
    pub async fn wait_plans(&self, phase: Phase, timeout: Duration) -> Result<()> {
        // Polled through the API, not kubectl: a wait lasts minutes, and a kubectl run costs
        // 0.08 CPU-s (a warm `make test` ran kubectl 876 times with these waits, 643 without).
        let plans: Api<NodeUpdatePlan> = Api::all(self.client().await?);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let done = plans.list(&ListParams::default()).await.map_or(0, |list| {
                let phase_of = |plan: &NodeUpdatePlan| plan.status.as_ref()?.phase;
                list.iter().filter(|p| phase_of(p) == Some(phase)).count()
            });
            if done == self.nodes.len() {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                let rollouts = self
                    .kubectl(&["describe", "noderollouts"])
                    .unwrap_or_default();
                return Err(Error::Timeout {
                    what: format!(
                        "every plan {phase:?}:\n{}\n{rollouts}\n{}",
                        self.plans().unwrap_or_default(),
                        self.agent_journals().await
                    ),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The tail of every node's agent journal, for failure messages.
    pub async fn agent_journals(&self) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            let journal = node
                .node
                .journal("inplace-agent.service", 40)
                .await
                .unwrap_or_default();
            text.push_str(&format!("--- {} agent\n{journal}\n", node.name()));
        }
        text
    }

    /// The NodeRelease that moves a node to kubelet `release` (`DIR/releases/RELEASE.yaml`):
    /// its sysext image with sha256 and size, a restart of the kubelet, and health checks
    /// that need the kubelet's unit steady and the Node `Ready` on the new version (the real
    /// kubelet's own report).
    pub fn release_manifest(&self, release: &str) -> Result<String> {
        let image = self.image(release)?;
        Ok(release_manifest(
            &format!("kubelet-{release}"),
            release,
            &sysext_artifact(&self.server.url(&image_path(image)), image),
            "3m",
        ))
    }

    /// The served image of `release`.
    pub fn image(&self, release: &str) -> Result<&SysextImage> {
        self.images
            .iter()
            .find(|(r, _)| r == release)
            .map(|(_, image)| image)
            .ok_or_else(|| Error::Invalid(format!("no kubelet {release} served")))
    }

    /// Serves a kubelet image of `release` that cannot start (its drop-in passes a flag the
    /// kubelet refuses) and returns its NodeRelease, named `kubelet-RELEASE-refuses-to-start`
    /// (`…-by-reboot` when `activation` is [`Activation::Reboot`]), with a health-check
    /// timeout of 15 s (30 s after a reboot, so that the bed sees the node's boot finish,
    /// `systemctl is-system-running --wait`, before the agent reboots it back). The rollback
    /// then verifies the previous kubelet with the committed release's own checks and
    /// timeout, not these.
    pub async fn serve_broken_release(
        &self,
        release: &str,
        activation: Activation,
    ) -> Result<String> {
        let image = kubelet_sysext(
            release,
            KubeletImage::RefusesToStart,
            &self.options.dir.join("images"),
        )
        .await?;
        self.server
            .put(&image_path(&image), Artifact::file(&image.path)?);
        // It never gets healthy: no need to wait the working release's 3 minutes.
        let (suffix, timeout) = match activation {
            Activation::Restart => ("", "15s"),
            Activation::Reboot => ("-by-reboot", "30s"),
        };
        Ok(release_manifest_activated(
            &format!("kubelet-{release}-refuses-to-start{suffix}"),
            release,
            &sysext_artifact(&self.server.url(&image_path(&image)), &image),
            timeout,
            activation,
        ))
    }

    /// Serves the file `binary` as the kubelet of `version` and returns the NodeRelease
    /// `name` that installs it as a `Binary` artifact at `path` (a node whose
    /// [`ClusterOptions::kubelet_path`] is `path` runs it), with a health-check timeout of
    /// `timeout`.
    pub fn serve_kubelet_binary(
        &self,
        name: &str,
        version: &str,
        binary: &Path,
        path: &Path,
        timeout: &str,
    ) -> Result<String> {
        let bytes = std::fs::read(binary).ctx(|| format!("reading {}", binary.display()))?;
        let served = format!("/binaries/{name}/kubelet");
        let artifact = format!(
            "  - name: kubelet\n    type: Binary\n    url: {}\n    sha256: {}\n    size: {}\n    path: {}\n",
            self.server.url(&served),
            crate::sysext::sha256_hex(&bytes),
            bytes.len(),
            path.display()
        );
        self.server.put_bytes(&served, bytes);
        Ok(release_manifest(name, version, &artifact, timeout))
    }

    /// Serves a `containerd` system extension holding the nodes' own containerd and runc shim
    /// (Debian's, read from the first node) and returns its NodeRelease `containerd`: the image
    /// swapped in, `containerd.service` restarted, containerd and the kubelet healthy after.
    pub async fn serve_containerd_release(&self) -> Result<String> {
        let node = self
            .nodes
            .first()
            .ok_or_else(|| Error::Invalid("no nodes".to_owned()))?;
        let mut image = SysextBuilder::new("containerd");
        for binary in ["usr/bin/containerd", "usr/bin/containerd-shim-runc-v2"] {
            image = image.file(
                binary,
                node.node.read_file(format!("/{binary}")).await?,
                0o755,
            );
        }
        let image = image
            .build(
                &self
                    .options
                    .dir
                    .join("images")
                    .join(format!("containerd-{}.raw", host_architecture())),
            )
            .await?;
        self.server
            .put(&image_path(&image), Artifact::file(&image.path)?);
        Ok(format!(
            "apiVersion: inplace.dev/v1alpha1
kind: NodeRelease
metadata:
  name: containerd
spec:
  version: containerd-debian
  artifacts:
  - name: containerd
    type: Sysext
    url: {url}
    sha256: {sha256}
    size: {size}
  activation:
    restartUnits: [containerd.service]
  healthChecks:
    units: [containerd.service, kubelet.service]
    window: 3s
    timeout: 3m
",
            url = self.server.url(&image_path(&image)),
            sha256 = image.sha256,
            size = image.size,
        ))
    }

    fn write_files(&self) -> Result<()> {
        std::fs::copy(self.api.admin_kubeconfig(), self.admin_kubeconfig())
            .ctx(|| "copying the admin kubeconfig".to_owned())?;
        let releases = self.options.dir.join("releases");
        std::fs::create_dir_all(&releases).ctx(|| format!("creating {}", releases.display()))?;
        for (release, _) in &self.images {
            let path = releases.join(format!("{release}.yaml"));
            std::fs::write(&path, self.release_manifest(release)?)
                .ctx(|| format!("writing {}", path.display()))?;
        }
        let images = self.options.dir.join("images.txt");
        std::fs::write(&images, format!("{WORKLOAD_IMAGE}\n"))
            .ctx(|| format!("writing {}", images.display()))
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        if let Some(controller) = self.controller.as_mut() {
            let _ = controller.start_kill();
        }
    }
}

/// Where the server serves an image: its file name at the root.
fn image_path(image: &SysextImage) -> String {
    format!(
        "/{}",
        image
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    )
}

async fn serve_kubelet_images(
    server: &ArtifactServer,
    dir: &Path,
) -> Result<Vec<(String, SysextImage)>> {
    create_dir(dir).await?;
    let mut images = Vec::new();
    for release in KUBELET_RELEASES {
        let image = kubelet_sysext(release, KubeletImage::Working, dir).await?;
        server.put(&image_path(&image), Artifact::file(&image.path)?);
        images.push((release.to_owned(), image));
    }
    let paths: Vec<String> = images.iter().map(|(_, image)| image_path(image)).collect();
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    server.put_sha256sums("/SHA256SUMS", &paths)?;
    Ok(images)
}

async fn boot_node(
    api: &ApiServer,
    server: &ArtifactServer,
    options: &ClusterOptions,
    name: String,
    kubelet_image: SysextImage,
    images_dir: PathBuf,
) -> Result<KubeNode> {
    let kubeconfig = api
        .node_kubeconfig(&name)
        .map_err(|e| Error::Invalid(format!("the kubeconfig of {name}: {e:#}")))?;
    let config = KubeNodeConfig {
        kubeconfig_yaml: std::fs::read_to_string(&kubeconfig)
            .ctx(|| format!("reading {}", kubeconfig.display()))?,
        ca_pem: api.ca_pem().map_err(|e| Error::Invalid(format!("{e:#}")))?,
        kubelet_image,
        images_dir,
        ports: KubeNodeConfig::free_ports()?,
        kubelet_path: options.kubelet_path.clone(),
        name,
    };
    let mut node_options = NodeOptions::default();
    add_agent(&mut node_options, &options.agent, &server.url("/")).await?;
    KubeNode::boot(&config, node_options).await
}

async fn create_dir(dir: &Path) -> Result<()> {
    tokio::fs::create_dir_all(dir)
        .await
        .ctx(|| format!("creating {}", dir.display()))
}
