//! One real Kubernetes node: an nspawn node with containerd, runc and the CNI plugins of the
//! root filesystem, the locally built images imported at boot, and the real kubelet of a
//! `kubernetes` system extension merged at boot, registering its Node with the API server
//! as `system:node:NAME`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::config::{self, KubeletPorts};
use crate::nspawn::{Node, NodeFile, NodeOptions, ServiceInstall};
use crate::sysext::SysextImage;
use crate::{Error, Result};

/// What makes a node a Kubernetes node of one cluster.
#[derive(Debug, Clone)]
pub struct KubeNodeConfig {
    /// The node's name: hostname, Node object, plan.
    pub name: String,
    /// The kubelet's kubeconfig (`system:node:NAME`, a client certificate of the cluster CA);
    /// the agent uses the same file as its identity.
    pub kubeconfig_yaml: String,
    /// The cluster CA (PEM), trusted by the kubelet for client certificates.
    pub ca_pem: Vec<u8>,
    /// The `kubernetes` extension the node boots with (merged at boot).
    pub kubelet_image: SysextImage,
    /// The container image tarballs to import at boot ([`super::kubelet::node_images`]).
    pub images_dir: PathBuf,
    /// The kubelet's own ports (nodes share the host's network).
    pub ports: KubeletPorts,
    /// Where `kubelet.service` runs the kubelet from: `None`, the image's `/usr/bin/kubelet`;
    /// a path (`/opt/bin/kubelet`, where nodes without system extensions keep it), a link
    /// to the image's kubelet at boot that a `Binary` artifact can replace.
    pub kubelet_path: Option<PathBuf>,
}

impl KubeNodeConfig {
    /// Free loopback ports for a node's kubelet.
    pub fn free_ports() -> Result<KubeletPorts> {
        Ok(KubeletPorts {
            api: crate::ports::free_port()?,
            healthz: crate::ports::free_port()?,
        })
    }

    /// Adds everything a Kubernetes node needs to `options`, the way an image builder would
    /// lay it out, and the nspawn settings this host needs for containerd and the kubelet
    /// (docs/development/test-beds.md § Real Kubernetes nodes says why each is there).
    pub async fn add_to(&self, options: &mut NodeOptions) -> Result<()> {
        options.cgroup_controllers = true;
        options.extra_nspawn_args.extend([
            // runc joins a session keyring; nspawn's filter answers EPERM, runc wants ENOSYS.
            "--system-call-filter=@keyring".to_owned(),
            // runc brings up `lo` in each container's network namespace; the kubelet's OOM
            // watcher reads /dev/kmsg.
            "--capability=CAP_NET_ADMIN,CAP_SYSLOG".to_owned(),
            "--bind-ro=/dev/kmsg".to_owned(),
            // containerd's overlayfs snapshotter: the kernel refuses an overlay whose upper
            // directory is on overlayfs (the node's root), with "invalid argument".
            "--tmpfs=/var/lib/containerd:mode=0711".to_owned(),
            format!(
                "--bind-ro={}:{}",
                self.images_dir.display(),
                config::IMAGES_DIR
            ),
        ]);
        let stored = format!(
            "/opt/extensions/kubernetes/{}",
            file_name(&self.kubelet_image.path)?
        );
        options.files.extend([
            NodeFile::from_host(&self.kubelet_image.path, &stored, 0o644).await?,
            NodeFile::new(
                "/etc/containerd/config.toml",
                config::CONTAINERD_CONFIG,
                0o644,
            ),
            NodeFile::new(
                "/etc/cni/net.d/10-inplace-testbed.conflist",
                config::CNI_CONFIG,
                0o644,
            ),
            NodeFile::new(
                config::KUBELET_CONFIG_PATH,
                config::kubelet_config(&self.name, self.ports),
                0o644,
            ),
            NodeFile::new(
                config::KUBELET_KUBECONFIG_PATH,
                self.kubeconfig_yaml.clone(),
                0o600,
            ),
            NodeFile::new(config::CLIENT_CA_PATH, self.ca_pem.clone(), 0o644),
            NodeFile::new(config::PREPARE_SCRIPT_PATH, config::PREPARE_SCRIPT, 0o755),
        ]);
        options.symlinks.push((
            PathBuf::from("/etc/extensions/kubernetes.raw"),
            PathBuf::from(stored),
        ));
        if let Some(path) = &self.kubelet_path {
            options.files.push(NodeFile::new(
                "/etc/systemd/system/kubelet.service.d/20-kubelet-path.conf",
                super::kubelet::kubelet_service_drop_in(&path.display().to_string(), ""),
                0o644,
            ));
            options
                .symlinks
                .push((path.clone(), PathBuf::from("/usr/bin/kubelet")));
        }
        options.enable_units.push("containerd.service".to_owned());
        for (name, unit) in [
            ("inplace-testbed-prepare-kube.service", config::PREPARE_UNIT),
            ("inplace-testbed-images.service", config::IMAGES_UNIT),
        ] {
            ServiceInstall::new(name, unit).into_boot_options(options);
        }
        crate::sysext::merge_at_boot(options, &["kubelet.service"]);
        Ok(())
    }
}

/// A booted Kubernetes node.
pub struct KubeNode {
    /// The nspawn node.
    pub node: Node,
    /// Its kubelet's ports.
    pub ports: KubeletPorts,
}

impl KubeNode {
    /// Boots a node with `config` added to `options` and waits until its kubelet is active
    /// (the Node's readiness is the API's to tell: [`super::wait_node_ready`]).
    pub async fn boot(config: &KubeNodeConfig, mut options: NodeOptions) -> Result<KubeNode> {
        config.add_to(&mut options).await?;
        let node = Node::boot(&config.name, options).await?;
        let kube = KubeNode {
            node,
            ports: config.ports,
        };
        kube.wait_kubelet_healthy(Duration::from_secs(120)).await?;
        Ok(kube)
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        self.node.name()
    }

    /// The kubelet's `/healthz` URL (on the host's loopback: the node shares its network).
    pub fn healthz_url(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.ports.healthz)
    }

    /// Waits until the kubelet answers `/healthz` with `ok`; the error carries the journals
    /// of containerd and the kubelet.
    pub async fn wait_kubelet_healthy(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if healthz_ok(self.ports.healthz).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Node {
                    node: self.name().to_owned(),
                    message: format!(
                        "the kubelet did not answer {} within {timeout:?}\n{}",
                        self.healthz_url(),
                        self.diagnostics().await
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The journal tails of the node's runtime units, for failure messages.
    pub async fn diagnostics(&self) -> String {
        let mut text = String::new();
        for unit in [
            "inplace-testbed-prepare-kube.service",
            "containerd.service",
            "inplace-testbed-images.service",
            "kubelet.service",
        ] {
            let journal = self.node.journal(unit, 40).await.unwrap_or_default();
            text.push_str(&format!("--- {unit}\n{journal}\n"));
        }
        text
    }
}

/// Whether `GET /healthz` on the kubelet's port answers `ok` (plain HTTP/1.0 on loopback;
/// no client library for one line).
pub async fn healthz_ok(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        stream
            .write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        let text = String::from_utf8_lossy(&answer);
        Some(text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

fn file_name(path: &Path) -> Result<String> {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Invalid(format!("image path {}", path.display())))
}
