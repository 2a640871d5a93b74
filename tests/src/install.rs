//! inplace installed into a test cluster the way its docs install it, shared by the suites,
//! the demo and `inplace-testbed cluster`: the manifests (CRDs, the agent's and the
//! controller's RBAC and admission policy), the controller run as its shipped ServiceAccount,
//! and the agent laid out on a node as its package lays it out.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::apiserver::{repo_root, run_kubectl};
use crate::error::IoContext;
use crate::nspawn::{Node, NodeFile, NodeOptions};
use crate::workspace_build::workspace_bin;
use crate::{Error, Result};

/// The controller's ServiceAccount as the shipped RBAC names it, and its groups.
pub const CONTROLLER_USER: &str = "system:serviceaccount:inplace-system:inplace-controller";
/// The groups of [`CONTROLLER_USER`].
pub const CONTROLLER_GROUPS: [&str; 2] = [
    "system:serviceaccounts",
    "system:serviceaccounts:inplace-system",
];

/// Applies the CRDs (waiting until they are served), the agent's RBAC and admission policy,
/// and the controller's namespace and RBAC from `packaging/kubernetes`, as `kubeconfig`'s user.
pub fn install_manifests(kubeconfig: &Path) -> Result<()> {
    let packaging = repo_root().join("packaging/kubernetes");
    let path = |relative: &str| packaging.join(relative).display().to_string();
    let kubectl = |what: &str, args: &[&str]| {
        run_kubectl(kubeconfig, args).map_err(|e| Error::Invalid(format!("{what}: {e:#}")))
    };
    let crds = path("crds");
    kubectl(
        "installing the CRDs",
        &["apply", "--server-side", "-f", &crds],
    )?;
    kubectl(
        "waiting for the CRDs",
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=120s",
            "-f",
            &crds,
        ],
    )?;
    kubectl(
        "installing the agent's and the controller's RBAC and admission policy",
        &[
            "apply",
            "-f",
            &path("agent"),
            "-f",
            &path("controller/namespace.yaml"),
            "-f",
            &path("controller/rbac.yaml"),
        ],
    )?;
    Ok(())
}

/// Starts `inplace-controller run` (no leader election, metrics on a free port) with
/// `kubeconfig`, logging to `log_path`; killed when the handle is dropped.
pub fn spawn_controller(
    binary: &Path,
    kubeconfig: &Path,
    log_path: &Path,
) -> Result<tokio::process::Child> {
    let log = std::fs::File::create(log_path).ctx(|| format!("creating {}", log_path.display()))?;
    let log2 = log
        .try_clone()
        .ctx(|| "duplicating a log file".to_owned())?;
    tokio::process::Command::new(binary)
        .args([
            "run",
            "--no-leader-election",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .stdout(log)
        .stderr(log2)
        .kill_on_drop(true)
        .spawn()
        .ctx(|| format!("starting {}", binary.display()))
}

/// The agent and the controller of this workspace, built into the running program's target
/// directory and profile (`workspace_build`: a no-op when current); their paths.
pub async fn workspace_binaries() -> Result<(PathBuf, PathBuf)> {
    let built = tokio::task::spawn_blocking(|| {
        Ok::<_, Error>((
            workspace_bin("inplace-agent")?,
            workspace_bin("inplace-controller")?,
        ))
    });
    built
        .await
        .map_err(|e| Error::Invalid(format!("the build task: {e}")))?
}

/// The agent's files as its package lays them out (docs/usage/deb.md): the binary, the
/// shipped unit and tmpfiles, and a policy allowing `artifact_prefix` over plain HTTP.
pub async fn agent_files(agent: &Path, artifact_prefix: &str) -> Result<Vec<NodeFile>> {
    let root = repo_root();
    Ok(vec![
        NodeFile::from_host(agent, "/usr/bin/inplace-agent", 0o755).await?,
        NodeFile::from_host(
            root.join("systemd/inplace-agent.service"),
            "/etc/systemd/system/inplace-agent.service",
            0o644,
        )
        .await?,
        NodeFile::from_host(
            root.join("systemd/inplace-agent.tmpfiles.conf"),
            "/usr/lib/tmpfiles.d/inplace-agent.conf",
            0o644,
        )
        .await?,
        NodeFile::new(
            "/etc/inplace/agent.toml",
            format!(
                "[policy]\nallowed_url_prefixes = [\"{artifact_prefix}\"]\nallow_http = true\n\
                 [activation]\nhealth_interval = \"200ms\"\n"
            ),
            0o644,
        ),
    ])
}

/// The agent as its package installs it, on a node about to boot ([`agent_files`], the unit
/// enabled). Its identity is the kubelet's kubeconfig (`/etc/kubernetes/kubelet.conf`), which
/// the node has of its own.
pub async fn add_agent(
    options: &mut NodeOptions,
    agent: &Path,
    artifact_prefix: &str,
) -> Result<()> {
    options
        .files
        .extend(agent_files(agent, artifact_prefix).await?);
    options
        .enable_units
        .push("inplace-agent.service".to_owned());
    Ok(())
}

/// The agent's files ([`agent_files`]) written onto the booted `node`, with
/// `kubeconfig_yaml` as the kubelet's kubeconfig (the agent's identity); the caller may add
/// a drop-in, then [`start_agent`].
pub async fn put_agent(
    node: &Node,
    agent: &Path,
    artifact_prefix: &str,
    kubeconfig_yaml: &str,
) -> Result<()> {
    for file in agent_files(agent, artifact_prefix).await? {
        node.write_file(&file.path, &file.contents, file.mode)
            .await?;
    }
    node.write_file(
        "/etc/kubernetes/kubelet.conf",
        kubeconfig_yaml.as_bytes(),
        0o600,
    )
    .await
}

/// Starts the agent [`put_agent`] installed, as its package's post-install does (its
/// directories, then the unit, enabled so that it comes back after a reboot), and waits
/// until the unit is active (`Type=notify`: the agent said READY). The error carries the
/// unit's journal.
pub async fn start_agent(node: &Node) -> Result<()> {
    let started = node
        .sh("systemd-tmpfiles --create /usr/lib/tmpfiles.d/inplace-agent.conf && systemctl daemon-reload && systemctl enable --now inplace-agent.service")
        .await?;
    let active = match started.success() {
        true => node
            .wait_active("inplace-agent.service", Duration::from_secs(60))
            .await
            .err()
            .map(|e| e.to_string()),
        false => Some(started.stderr_text()),
    };
    match active {
        None => Ok(()),
        Some(why) => {
            let journal = node
                .journal("inplace-agent.service", 80)
                .await
                .unwrap_or_default();
            Err(Error::Invalid(format!(
                "the agent did not start on {}: {why}\n{journal}",
                node.name()
            )))
        }
    }
}

/// Where a node keeps the agent's sysext images (docs/usage/flatcar.md).
pub const AGENT_IMAGES: &str = "/opt/extensions/inplace-agent";

/// The agent's sysext `image` under [`AGENT_IMAGES`] and the guard's units, which live
/// outside the image (docs/usage/flatcar.md, docs/usage/agent-updates.md).
pub async fn agent_image_files(image: &Path) -> Result<Vec<NodeFile>> {
    let name = image.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        Error::Invalid(format!("an image path without a name: {}", image.display()))
    })?;
    let mut files =
        vec![NodeFile::from_host(image, format!("{AGENT_IMAGES}/{name}"), 0o644).await?];
    for unit in ["inplace-agent-guard.service", "inplace-agent-guard.path"] {
        files.push(
            NodeFile::from_host(
                repo_root().join("systemd").join(unit),
                format!("/etc/systemd/system/{unit}"),
                0o644,
            )
            .await?,
        );
    }
    Ok(files)
}

/// docs/usage/flatcar.md's install on a booted node that has [`agent_image_files`]: the
/// image linked into /etc/extensions and merged (and merged again at every boot), the
/// agent's directories, the agent and the guard's path unit started, with `also_enable`.
pub fn agent_image_install_script(image_name: &str, also_enable: &[&str]) -> String {
    format!(
        "set -e; mkdir -p /etc/extensions; \
         ln -sf {AGENT_IMAGES}/{image_name} /etc/extensions/inplace-agent.raw; \
         systemctl enable systemd-sysext.service; \
         systemd-sysext refresh && systemctl daemon-reload; \
         systemd-tmpfiles --create inplace-agent.conf; \
         systemctl enable --now {} inplace-agent.service inplace-agent-guard.path",
        also_enable.join(" ")
    )
}
