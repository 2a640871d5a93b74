//! The demo's nodes: what each is booted with (a real Kubernetes node of the test bed, the
//! agent from its sysext image), and running commands on it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use inplace_tests::agent_images::{Behaviour, ReleaseKey, agent_image};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::install;
use inplace_tests::kube_node::{KubeNodeConfig, node_images};
use inplace_tests::nspawn::{ExecOutput, Node, NodeFile, NodeOptions};
use inplace_tests::sysext::SysextImage;

use crate::agent_update::{CONFIRM_TIMEOUT, agent_version};
use crate::cluster::Cluster;
use crate::fleet::{Member, Paths};

/// The agent as every node gets it: its own sysext image (`packaging/node/build-sysext.sh`
/// around `--bin-dir`'s agent), linked and started as docs/usage/flatcar.md installs it, with
/// the guard's units beside it; with a release key, agent updates allowed
/// (docs/usage/agent-updates.md) and signed by that key.
pub(crate) struct AgentInstall {
    pub(crate) version: String,
    image: PathBuf,
    file_name: String,
    release_key: Option<String>,
}

impl AgentInstall {
    pub(crate) fn build(paths: &Paths, key: Option<&ReleaseKey>) -> anyhow::Result<AgentInstall> {
        let version = agent_version(&paths.agent)?;
        let image = tokio::task::block_in_place(|| {
            agent_image(
                Behaviour::Works,
                &paths.agent,
                &version,
                &paths.work.join("images").join("agent-v1"),
                "",
            )
        })
        .context("building the agent's sysext image")?;
        let file_name = image
            .file_name()
            .and_then(|n| n.to_str())
            .context("the agent image's name")?
            .to_owned();
        Ok(AgentInstall {
            version,
            image,
            file_name,
            release_key: key.map(ReleaseKey::public_file).transpose()?,
        })
    }
}

/// The node `m` as [`KubeNode::boot`](inplace_tests::kube_node::KubeNode::boot) takes it: a
/// Kubernetes node of the cluster on `kubelet`, and the agent's files.
pub(crate) async fn node_options(
    server: &ArtifactServer,
    cluster: &Cluster,
    m: &Member,
    agent: &AgentInstall,
    kubelet: &SysextImage,
) -> anyhow::Result<(KubeNodeConfig, NodeOptions)> {
    // The node's own identity (system:node:NAME): the kubelet's kubeconfig, which the agent
    // uses too.
    let kubeconfig_yaml = tokio::task::block_in_place(|| cluster.node_kubeconfig(&m.name))?;
    let kube = KubeNodeConfig {
        name: m.name.clone(),
        kubeconfig_yaml,
        ca_pem: tokio::task::block_in_place(|| cluster.ca_pem())?,
        kubelet_image: kubelet.clone(),
        images_dir: node_images().await?,
        ports: m.ports,
        kubelet_path: None,
    };
    let config = format!(
        "# inplace-demo: artifacts come from the demo's artifact server on host loopback\n\
         [policy]\nallowed_url_prefixes = [\"{}\"]\nallow_http = true\n\
         [activation]\nhealth_interval = \"200ms\"\n",
        server.url("/")
    );
    let mut files = install::agent_image_files(&agent.image).await?;
    files.push(NodeFile::new("/etc/inplace/agent.toml", config, 0o644));
    if let Some(key) = &agent.release_key {
        files.push(NodeFile::new(
            "/etc/inplace/keys/demo-release.pub",
            key.clone(),
            0o644,
        ));
        files.push(NodeFile::new(
            "/etc/inplace/agent.d/50-agent-updates.toml",
            format!("[self_update]\nallow = true\nconfirm_timeout = \"{CONFIRM_TIMEOUT}\"\n"),
            0o644,
        ));
    }
    let options = NodeOptions {
        files,
        ..NodeOptions::default()
    };
    Ok((kube, options))
}

/// docs/usage/flatcar.md's by-hand install on a booted node: link the image, merge it, create
/// the agent's directories, start the agent and the guard's path unit.
pub(crate) async fn install_agent(
    fleet: &Arc<Mutex<Vec<Node>>>,
    name: &str,
    agent: &AgentInstall,
) -> anyhow::Result<()> {
    let script = install::agent_image_install_script(&agent.file_name, &[]);
    node_sh_ok(fleet, name, &script)
        .await
        .with_context(|| format!("installing the agent on {name}"))
}

/// Runs `script` on the node; its standard output, whatever its exit status.
pub(crate) async fn node_sh(
    fleet: &Arc<Mutex<Vec<Node>>>,
    name: &str,
    script: &str,
) -> anyhow::Result<String> {
    Ok(exec(fleet, name, script).await?.stdout_text())
}

/// Runs `script` on the node; an error unless it exits 0.
pub(crate) async fn node_sh_ok(
    fleet: &Arc<Mutex<Vec<Node>>>,
    name: &str,
    script: &str,
) -> anyhow::Result<()> {
    exec(fleet, name, script).await?.checked()?;
    Ok(())
}

async fn exec(
    fleet: &Arc<Mutex<Vec<Node>>>,
    name: &str,
    script: &str,
) -> anyhow::Result<ExecOutput> {
    // Exec needs the node across an await: take it out of the fleet and put it back.
    let node = {
        let mut f = fleet.lock().map_err(|_| anyhow::anyhow!("fleet lock"))?;
        let i = f
            .iter()
            .position(|n| n.name() == name)
            .with_context(|| format!("node {name} is not running"))?;
        f.swap_remove(i)
    };
    let out = node.sh(script).await;
    if let Ok(mut f) = fleet.lock() {
        f.push(node);
    }
    Ok(out?)
}

pub(crate) async fn wait_agent(fleet: &Arc<Mutex<Vec<Node>>>, name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let state = node_sh(
            fleet,
            name,
            "systemctl is-active inplace-agent.service || true",
        )
        .await?;
        if state.trim() == "active" {
            return Ok(());
        }
        if Instant::now() > deadline {
            let journal = node_sh(
                fleet,
                name,
                "journalctl -u inplace-agent.service -n 40 --no-pager",
            )
            .await?;
            bail!("the agent on {name} is {}:\n{journal}", state.trim());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
