//! The real kubelet: built from Kubernetes' own Go module at every release pinned under
//! `tests/kubelet/` (`tests/kubelet/build.sh`, cached by Go), and packaged the way Flatcar's
//! sysext-bakery ships Kubernetes: a `kubernetes` system extension holding `usr/bin/kubelet`,
//! the kubelet's unit and its drop-in, and an extension-release file.

use std::path::{Path, PathBuf};

use tokio::process::Command;

use crate::apiserver::{is_newer_than_sources, repo_root, target_dir};
use crate::error::IoContext;
use crate::nspawn::host::FileLock;
use crate::sysext::{SysextBuilder, SysextImage, host_architecture};
use crate::{Error, Result};

/// The kubelet releases the bed builds: a patch update (v1.36.1 → v1.36.3, the common
/// in-place case) and a minor upgrade (v1.35.4 → v1.36.3). v1.36.3 is the control plane's.
pub const KUBELET_RELEASES: [&str; 3] = ["v1.35.4", "v1.36.1", "v1.36.3"];

/// The kubelet's unit as the image ships it. `Restart=always` without a start limit: a
/// kubelet that cannot start crash-loops, as on a real node, and the health checks see it.
pub const KUBELET_UNIT: &str = "[Unit]
Description=kubelet: the Kubernetes node agent
Documentation=https://kubernetes.io/docs/
Wants=containerd.service
After=containerd.service inplace-testbed-images.service
StartLimitIntervalSec=0

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
";

/// Where the image puts the kubelet's drop-in (kubeadm's layout).
pub const KUBELET_DROP_IN_PATH: &str =
    "usr/lib/systemd/system/kubelet.service.d/10-kubelet-args.conf";

/// What a built kubelet image does when started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletImage {
    /// Starts with the node's kubeconfig and KubeletConfiguration.
    Working,
    /// Its drop-in passes a flag the kubelet refuses (`unknown flag`): the release that must
    /// roll back.
    RefusesToStart,
    /// Its drop-in adds a `Condition…=` the node does not meet: a restart of the unit ends
    /// `done` and starts nothing (the agent must see that no kubelet runs).
    NeverStarts,
}

impl KubeletImage {
    /// The drop-in of the image: the kubelet's command line, as kubeadm's drop-in gives it.
    pub fn drop_in(self) -> String {
        let extra = match self {
            KubeletImage::Working | KubeletImage::NeverStarts => "",
            KubeletImage::RefusesToStart => " --inplace-testbed-no-such-flag",
        };
        let drop_in = kubelet_service_drop_in("/usr/bin/kubelet", extra);
        match self {
            KubeletImage::NeverStarts => {
                format!("{drop_in}\n[Unit]\nConditionPathExists=/inplace-testbed-never\n")
            }
            _ => drop_in,
        }
    }

    fn file_name(self, release: &str) -> String {
        match self {
            KubeletImage::Working => kubernetes_image_name(release, ""),
            KubeletImage::RefusesToStart => kubernetes_image_name(release, "-refuses-to-start"),
            KubeletImage::NeverStarts => kubernetes_image_name(release, "-never-starts"),
        }
    }
}

/// A `kubelet.service` drop-in running the kubelet at `binary` with the node's kubeconfig and
/// KubeletConfiguration (as kubeadm's drop-in gives them) and `extra` flags.
pub fn kubelet_service_drop_in(binary: &str, extra: &str) -> String {
    format!(
        "[Service]\nExecStart=\nExecStart={binary} --kubeconfig={} --config={}{extra}\n",
        super::config::KUBELET_KUBECONFIG_PATH,
        super::config::KUBELET_CONFIG_PATH,
    )
}

/// Flatcar's file name for a kubernetes extension (`kubernetes-v1.36.3-x86-64.raw`), with an
/// optional variant before the architecture.
fn kubernetes_image_name(release: &str, variant: &str) -> String {
    format!("kubernetes-{release}{variant}-{}.raw", host_architecture())
}

/// The kubelet of `release`, built first if it is missing or older than its module
/// (`make test` builds them all beside the first node tests, so this is usually a check of
/// file times). `tests/kubelet/build.sh` holds a lock on its output: a caller that comes
/// while another builds waits for it, then finds Go's cache full (seconds).
pub async fn kubelet_binary(release: &str) -> Result<PathBuf> {
    let source = repo_root().join("tests/kubelet").join(release);
    if !source.join("go.mod").is_file() {
        return Err(Error::Invalid(format!(
            "no kubelet release {release} in tests/kubelet (built: {KUBELET_RELEASES:?})"
        )));
    }
    let bin_dir = target_dir().join("kubelet/bin");
    let binary = bin_dir.join(format!("kubelet-{release}"));
    if fresh(&binary, &source) {
        return Ok(binary);
    }
    eprintln!(
        "building the kubelet {release} from its Go module (tests/kubelet; minutes the first time)"
    );
    run(Command::new(repo_root().join("tests/kubelet/build.sh"))
        .arg(&bin_dir)
        .arg(release))
    .await?;
    Ok(binary)
}

fn fresh(binary: &Path, source: &Path) -> bool {
    is_newer_than_sources(binary, source).unwrap_or(false)
}

/// The container images every node imports (`tests/tools/node-images.sh`): the directory
/// holding `pause.tar` and `workload.tar`, built first when missing or older than the program,
/// the script or the image writer (so a change to either is exercised by the next local run).
pub async fn node_images() -> Result<PathBuf> {
    let tools = repo_root().join("tests/tools");
    let sources = [tools.join("pod"), tools.clone(), tools.join("oci-image")];
    let out = target_dir().join("node-images");
    let built = |name: &str| sources.iter().all(|source| fresh(&out.join(name), source));
    if built("pause.tar") && built("workload.tar") {
        return Ok(out);
    }
    tokio::fs::create_dir_all(&out)
        .await
        .ctx(|| format!("creating {}", out.display()))?;
    let _lock = FileLock::acquire(out.join(".build.lock")).await?;
    if built("pause.tar") && built("workload.tar") {
        return Ok(out);
    }
    run(Command::new(repo_root().join("tests/tools/node-images.sh")).arg(&out)).await?;
    Ok(out)
}

/// Packs the kubelet of `release` as a `kubernetes` system extension into `out_dir`, under
/// Flatcar's file name: `usr/bin/kubelet`, `usr/lib/systemd/system/kubelet.service`, the
/// drop-in of `variant`, and `usr/lib/extension-release.d/extension-release.kubernetes`.
/// Packed once per content into `<target>/kubelet/images` and copied from there: a test run
/// packs the same few images for every cluster, demo and crash bed.
pub async fn kubelet_sysext(
    release: &str,
    variant: KubeletImage,
    out_dir: &Path,
) -> Result<SysextImage> {
    let binary = kubelet_binary(release).await?;
    let bytes = tokio::fs::read(&binary)
        .await
        .ctx(|| format!("reading {}", binary.display()))?;
    SysextBuilder::new("kubernetes")
        .file("usr/bin/kubelet", bytes, 0o755)
        .file(
            "usr/lib/systemd/system/kubelet.service",
            KUBELET_UNIT.as_bytes().to_vec(),
            0o644,
        )
        .file(KUBELET_DROP_IN_PATH, variant.drop_in().into_bytes(), 0o644)
        .build_cached(
            &out_dir.join(variant.file_name(release)),
            &target_dir().join("kubelet/images"),
        )
        .await
}

async fn run(command: &mut Command) -> Result<()> {
    let shown = format!("{:?}", command.as_std());
    let output = command
        .kill_on_drop(true)
        .output()
        .await
        .ctx(|| format!("running {shown}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::CommandFailed {
        command: shown,
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}
