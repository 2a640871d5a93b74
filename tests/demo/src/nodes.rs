//! The demo's nodes: what each is booted with, its kubelet's port, and running commands on it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::nspawn::{Node, NodeFile, NodeOptions};

use crate::cluster::Cluster;
use crate::fleet::{Member, Paths};

/// The port of node `i`'s kubelet: `base + i`, or a free one when `base` is 0 (concurrent
/// demos, tests). Each node's kubelet listens on its own host-loopback port: the nodes share
/// the host's network (node configuration, like a real kubelet's config file).
pub(crate) fn kubelet_port(base: u16, i: u32) -> u16 {
    if base != 0 {
        return base.saturating_add(u16::try_from(i).unwrap_or(0));
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

pub(crate) async fn node_options(
    paths: &Paths,
    server: &ArtifactServer,
    cluster: &Cluster,
    m: &Member,
) -> anyhow::Result<NodeOptions> {
    // The node's own kubelet identity (system:node:NAME), as a kubelet's kubeconfig holds it.
    let node_kubeconfig = tokio::task::block_in_place(|| cluster.node_kubeconfig(&m.name))?;
    let config = format!(
        "# inplace-demo: artifacts come from the demo's artifact server on host loopback\n\
         [policy]\nallowed_url_prefixes = [\"{}\"]\nallow_http = true\n\
         [activation]\nhealth_interval = \"200ms\"\n",
        server.url("/")
    );
    Ok(NodeOptions {
        files: vec![
            NodeFile::from_host(&paths.agent, "/usr/bin/inplace-agent", 0o755).await?,
            NodeFile::from_host(
                paths.repo.join("systemd/inplace-agent.service"),
                "/etc/systemd/system/inplace-agent.service",
                0o644,
            )
            .await?,
            NodeFile::from_host(
                paths.repo.join("systemd/inplace-agent.tmpfiles.conf"),
                "/usr/lib/tmpfiles.d/inplace-agent.conf",
                0o644,
            )
            .await?,
            NodeFile::new("/etc/inplace/agent.toml", config, 0o644),
            NodeFile::new("/etc/kubernetes/kubelet.conf", node_kubeconfig, 0o600),
            NodeFile::new(
                "/etc/default/kubelet",
                format!("KUBELET_PORT={}\n", m.port),
                0o644,
            ),
        ],
        enable_units: vec!["inplace-agent.service".to_owned()],
        ..NodeOptions::default()
    })
}

pub(crate) async fn node_sh(
    fleet: &Arc<Mutex<Vec<Node>>>,
    name: &str,
    script: &str,
) -> anyhow::Result<String> {
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
    Ok(out?.stdout_text())
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
