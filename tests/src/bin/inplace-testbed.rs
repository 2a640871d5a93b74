//! Test-bed maintenance by hand (`inplace-testbed --help`): `build-rootfs` prebuilds the
//! cached node root filesystems (for `make`), `sweep` removes nodes left by crashed test runs,
//! `boot` keeps a node up for poking around, `kube` runs the real control plane and `cluster`
//! a whole cluster on real nodes (docs/development/test-beds.md § Real Kubernetes nodes).

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};

use inplace_tests::apiserver::ApiServer;
use inplace_tests::install::workspace_binaries;
use inplace_tests::kube_node::{ClusterOptions, KUBELET_RELEASES, KubeCluster};
use inplace_tests::nspawn::{Node, NodeOptions, RootfsRecipe, Suite, sweep_stale_nodes};

/// The test beds by hand: node root filesystems, nodes, the real control plane and whole
/// clusters on real nodes (docs/development/test-beds.md).
#[derive(Parser)]
#[command(name = "inplace-testbed")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build (once, cached) the root filesystems the nodes boot from: both suites side by side
    /// unless one is named.
    BuildRootfs {
        /// bookworm or trixie.
        #[arg(long)]
        suite: Option<String>,
        /// The Debian mirror debootstrap fetches from.
        mirror: Option<String>,
    },
    /// Remove the nodes left behind by crashed test runs.
    Sweep,
    /// Boot a node and keep it until Ctrl-C (poke around with `nsenter -t PID -a bash`).
    Boot { name: String },
    /// Run the real control plane (etcd, kube-apiserver, kube-controller-manager) until
    /// Ctrl-C or SIGTERM: DIR/admin.kubeconfig, and DIR/NAME.kubeconfig per node.
    Kube {
        /// Where the kubeconfigs and the control plane's state go.
        #[arg(long)]
        dir: PathBuf,
        /// A node identity (system:node:NAME) to write a kubeconfig for; repeatable.
        #[arg(long = "node", value_name = "NAME")]
        nodes: Vec<String>,
    },
    /// Run a whole cluster on real nodes (containerd, the real kubelet, the agent) with the
    /// controller until Ctrl-C or SIGTERM, then remove every node.
    Cluster {
        /// Where the cluster's files go: admin.kubeconfig, releases/, images.txt.
        #[arg(long)]
        dir: PathBuf,
        /// How many nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// The nodes' first kubelet (the oldest built release unless named).
        #[arg(long, value_name = "RELEASE", default_value = KUBELET_RELEASES[0])]
        kubelet: String,
        /// Leave the controller out (run your own against DIR/admin.kubeconfig).
        #[arg(long)]
        no_controller: bool,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::BuildRootfs { suite, mirror } => build_rootfs(suite, mirror).await?,
        Command::Sweep => {
            for name in sweep_stale_nodes().await.context("sweeping stale nodes")? {
                println!("removed stale node {name}");
            }
        }
        Command::Boot { name } => {
            let node = Node::boot(&name, NodeOptions::default())
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
        Command::Kube { dir, nodes } => serve_kube(&dir, &nodes).await?,
        Command::Cluster {
            dir,
            nodes,
            kubelet,
            no_controller,
        } => serve_cluster(&dir, nodes, kubelet, !no_controller).await?,
    }
    Ok(())
}

/// The named suite's root filesystem, or every suite's side by side (one debootstrap each;
/// each tree has its own build lock).
async fn build_rootfs(suite: Option<String>, mirror: Option<String>) -> anyhow::Result<()> {
    let suites = match suite {
        Some(name) => vec![name.parse::<Suite>()?],
        None => Suite::ALL.to_vec(),
    };
    let recipes: Vec<RootfsRecipe> = suites
        .into_iter()
        .map(|suite| match &mirror {
            Some(mirror) => RootfsRecipe {
                mirror: mirror.clone(),
                ..RootfsRecipe::of(suite)
            },
            None => RootfsRecipe::of(suite),
        })
        .collect();
    let built = futures::future::join_all(recipes.iter().map(|recipe| recipe.ensure())).await;
    for (recipe, path) in recipes.iter().zip(built) {
        let path =
            path.with_context(|| format!("building the {} root filesystem", recipe.suite.name()))?;
        println!("{}", path.display());
    }
    Ok(())
}

/// The real control plane until SIGINT or SIGTERM, with `DIR/admin.kubeconfig` and
/// `DIR/NAME.kubeconfig` per node (identity `system:node:NAME`).
async fn serve_kube(dir: &Path, nodes: &[String]) -> anyhow::Result<()> {
    let server = ApiServer::start_in(dir, nodes).await?;
    println!(
        "kube-apiserver is ready at {}: export KUBECONFIG={}   (Ctrl-C or SIGTERM stops it)",
        server.url(),
        server.admin_kubeconfig().display()
    );
    for node in nodes {
        println!("node {node}: {}", server.node_kubeconfig(node)?.display());
    }
    until_stopped().await?;
    drop(server);
    Ok(())
}

/// The real control plane, `nodes` real nodes on `kubelet` with containerd and the agent,
/// the controller unless left out, every built kubelet served; `DIR/admin.kubeconfig`,
/// `DIR/releases/RELEASE.yaml` and `DIR/images.txt`. Runs until SIGINT or SIGTERM, then
/// removes every node.
async fn serve_cluster(
    dir: &Path,
    nodes: usize,
    kubelet: String,
    controller: bool,
) -> anyhow::Result<()> {
    println!("building the agent and the controller (cargo; cached)");
    let (agent, controller_bin) = workspace_binaries().await?;
    let options = ClusterOptions {
        dir: std::path::absolute(dir)?,
        nodes,
        name_prefix: "node".to_owned(),
        kubelet,
        agent,
        controller: controller.then_some(controller_bin),
        kubelet_path: None,
    };
    let cluster = KubeCluster::start(&options, &|step| println!("==> {step}")).await?;
    println!(
        "ready: export KUBECONFIG={}\n  kubectl get nodes -o wide\n  kubectl apply -f {}/releases/<release>.yaml   (one per built kubelet: {})\n  images for Pods (imagePullPolicy: Never): {}/images.txt\nCtrl-C or SIGTERM stops everything.",
        cluster.admin_kubeconfig().display(),
        options.dir.display(),
        KUBELET_RELEASES.join(", "),
        options.dir.display(),
    );
    until_stopped().await?;
    drop(cluster);
    Ok(())
}

/// Returns at SIGINT (Ctrl-C) or SIGTERM.
async fn until_stopped() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("handling SIGTERM")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}
