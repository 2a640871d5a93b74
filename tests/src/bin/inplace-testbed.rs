//! Test-bed maintenance: `inplace-testbed build-rootfs` prebuilds the cached node root
//! filesystem (for `make`), `inplace-testbed sweep` removes nodes left by crashed test runs,
//! `inplace-testbed boot NAME` boots a node and keeps it until Ctrl-C (for poking around with
//! `nsenter -t <pid> -a bash`), `inplace-testbed kube --dir DIR [--node NAME]...` runs the real
//! control plane (etcd, kube-apiserver, kube-controller-manager) until Ctrl-C or SIGTERM.

use anyhow::{Context, bail};
use std::path::Path;

use inplace_tests::apiserver::ApiServer;
use inplace_tests::nspawn::{Node, NodeOptions, RootfsRecipe, sweep_stale_nodes};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["build-rootfs"] | ["build-rootfs", _] => {
            let mut recipe = RootfsRecipe::default();
            if let Some(mirror) = args.get(1) {
                recipe.mirror = mirror.clone();
            }
            let path = recipe
                .ensure()
                .await
                .context("building the root filesystem")?;
            println!("{}", path.display());
        }
        ["sweep"] => {
            for name in sweep_stale_nodes().await.context("sweeping stale nodes")? {
                println!("removed stale node {name}");
            }
        }
        ["boot", name] => {
            let node = Node::boot(name, NodeOptions::default())
                .await
                .with_context(|| format!("booting {name}"))?;
            println!(
                "node {} is up: nsenter -t {} -a bash   (Ctrl-C powers it off)",
                node.name(),
                node.pid1()
            );
            tokio::signal::ctrl_c()
                .await
                .context("waiting for Ctrl-C")?;
            node.poweroff().await.context("powering off")?;
        }
        ["kube", "--dir", dir, rest @ ..] => serve_kube(Path::new(dir), rest).await?,
        _ => bail!(
            "usage: inplace-testbed build-rootfs [MIRROR] | sweep | boot NAME | kube --dir DIR [--node NAME]..."
        ),
    }
    Ok(())
}

/// `kube --dir DIR [--node NAME]...`: the real control plane until SIGINT or SIGTERM, with
/// `DIR/admin.kubeconfig` and `DIR/NAME.kubeconfig` per node (identity `system:node:NAME`).
async fn serve_kube(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let mut nodes = Vec::new();
    for pair in args.chunks(2) {
        match pair {
            ["--node", name] => nodes.push(name.to_string()),
            _ => bail!("kube: expected --node NAME, got {pair:?}"),
        }
    }
    let server = ApiServer::start_in(dir, &nodes).await?;
    println!(
        "kube-apiserver is ready at {}: export KUBECONFIG={}   (Ctrl-C or SIGTERM stops it)",
        server.url(),
        server.admin_kubeconfig().display()
    );
    for node in &nodes {
        println!("node {node}: {}", server.node_kubeconfig(node)?.display());
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("handling SIGTERM")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    drop(server);
    Ok(())
}
