//! What a real Kubernetes node holds besides the kubelet: containerd's and the CNI's
//! configuration, the KubeletConfiguration, and the units that prepare the node for them.
//! Each setting that this machine kind needs, and the error it prevents, is in
//! docs/development/test-beds.md § Real Kubernetes nodes.

/// The name the sandbox (pause) image is imported under; containerd's `sandbox_image`.
pub const PAUSE_IMAGE: &str = "inplace.test/pause:1";
/// The workload image the tests' and the demo's Pods run (`imagePullPolicy: Never`).
pub const WORKLOAD_IMAGE: &str = "inplace.test/workload:1";
/// Where the node finds the image tarballs it imports at boot (bound read-only from the host).
pub const IMAGES_DIR: &str = "/var/lib/inplace-testbed/images";
/// The KubeletConfiguration, on the node (not in the kubelet's image: ports differ per node).
pub const KUBELET_CONFIG_PATH: &str = "/etc/kubernetes/kubelet-config.yaml";
/// The kubelet's kubeconfig (`system:node:NAME`), which the agent uses as its identity too.
pub const KUBELET_KUBECONFIG_PATH: &str = "/etc/kubernetes/kubelet.conf";
/// The cluster CA, which the kubelet trusts for client certificates.
pub const CLIENT_CA_PATH: &str = "/etc/kubernetes/pki/ca.crt";

/// containerd 1.6 (Debian bookworm): the CRI plugin with the local pause image, cgroupfs
/// (no systemd cgroup driver: the host's PID 1 is not systemd), no OOM score below the
/// node's own (no CAP_SYS_RESOURCE here), Debian's CNI plugin directory.
pub const CONTAINERD_CONFIG: &str = r#"version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "inplace.test/pause:1"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
"#;

/// The nodes share the host's network, so Pods run with `hostNetwork: true`; the runtime
/// still needs a CNI network to call itself ready, and the Node is not `Ready` without one.
/// A loopback-only network gives other Pods a network namespace with just `lo`, and leaves
/// nothing behind on the host (a bridge would land in the host's namespace).
pub const CNI_CONFIG: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "inplace-testbed",
  "plugins": [{"type": "loopback"}]
}
"#;

/// The ports a node's kubelet listens on: nodes share the host's network, so each has its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletPorts {
    /// The kubelet's API (`port`, 10250 on a real node).
    pub api: u16,
    /// `/healthz` (`healthzPort`, 10248 on a real node).
    pub healthz: u16,
}

/// The node's KubeletConfiguration: cgroupfs on this host's cgroup v1 layout (kubelet ≥ 1.35
/// refuses v1 unless `failCgroupV1: false`), containerd's socket, webhook authentication and
/// authorization against the API server with the cluster CA for client certificates (as
/// kubeadm sets it up), no read-only port, this node's own ports on loopback. The node's
/// filesystem is the host's, shared with every build there: with the default hard eviction
/// (`nodefs.available<10%`) the kubelet evicted the test Pods ("must evict pod(s) to reclaim
/// ephemeral-storage") once the host's disk was 90 % full, and image garbage collection at
/// 85 % would remove the imported images no registry can give back. Both only at 1 % / 100 %.
/// The Node registers with [`provider_id`] of `node`, as a cloud's nodes do: Cluster API links
/// a Machine to its Node by it.
pub fn kubelet_config(node: &str, ports: KubeletPorts) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
providerID: {provider_id}
address: 127.0.0.1
port: {api}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
readOnlyPort: 0
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {CLIENT_CA_PATH}
authorization:
  mode: Webhook
resolvConf: ""
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
"#,
        api = ports.api,
        healthz = ports.healthz,
        provider_id = provider_id(node),
    )
}

/// The `spec.providerID` of the bed's node `node` (the scheme names the bed, as `aws://` or
/// `gce://` name a cloud).
pub fn provider_id(node: &str) -> String {
    format!("inplace-testbed:///{node}")
}

/// Runs before containerd: makes the node's v1 cgroup controllers writable (systemd-nspawn
/// mounts them read-only without a user namespace: runc fails with "mkdir
/// /sys/fs/cgroup/cpuset/default: read-only file system"), and puts the values the kubelet
/// insists on over three read-only kernel tunables, inside the node only.
pub const PREPARE_SCRIPT: &str = r#"#!/bin/sh
set -eu
for dir in $(findmnt -t cgroup -n -o TARGET); do
    case "$dir" in */systemd) continue ;; esac
    mount -o remount,bind,rw "$dir"
done
mkdir -p /run/inplace-testbed/sysctl
for setting in kernel/panic=10 kernel/panic_on_oops=1 vm/overcommit_memory=1; do
    key=${setting%%=*}
    file=/run/inplace-testbed/sysctl/$(echo "$key" | tr / .)
    echo "${setting#*=}" >"$file"
    mount --bind "$file" "/proc/sys/$key"
done
"#;

/// Where [`PREPARE_SCRIPT`] lives on the node.
pub const PREPARE_SCRIPT_PATH: &str = "/usr/local/sbin/inplace-testbed-prepare-kube";

/// The oneshot unit that runs [`PREPARE_SCRIPT`] before containerd.
pub const PREPARE_UNIT: &str = "[Unit]
Description=Prepare the test bed's node for containerd and the kubelet (cgroups, tunables)
DefaultDependencies=no
After=local-fs.target
Before=containerd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/inplace-testbed-prepare-kube

[Install]
WantedBy=multi-user.target
";

/// Imports the locally built images into containerd's `k8s.io` namespace at every boot, before
/// the kubelet starts: there is no registry to pull from.
pub const IMAGES_UNIT: &str = "[Unit]
Description=Import the test bed's container images into containerd
Requires=containerd.service
After=containerd.service
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for image in /var/lib/inplace-testbed/images/*.tar; do ctr -n k8s.io images import \"$image\"; done'

[Install]
WantedBy=multi-user.target
";
