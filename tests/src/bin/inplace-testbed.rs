//! Test-bed maintenance: `inplace-testbed build-rootfs` prebuilds the cached node root
//! filesystem (for `make`), `inplace-testbed sweep` removes nodes left by crashed test runs,
//! `inplace-testbed boot NAME` boots a node and keeps it until Ctrl-C (for poking around with
//! `nsenter -t <pid> -a bash`).

use anyhow::{Context, bail};
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
        _ => bail!("usage: inplace-testbed build-rootfs [MIRROR] | sweep | boot NAME"),
    }
    Ok(())
}
