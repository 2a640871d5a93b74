//! Test-bed maintenance: `inplace-testbed build-rootfs [--suite bookworm|trixie] [MIRROR]`
//! prebuilds the cached node root filesystems (both suites unless one is named; for `make`), `inplace-testbed sweep` removes nodes left by crashed test runs,
//! `inplace-testbed boot NAME` boots a node and keeps it until Ctrl-C (for poking around with
//! `nsenter -t <pid> -a bash`), `inplace-testbed kube --dir DIR [--node NAME]...` runs the real
//! control plane (etcd, kube-apiserver, kube-controller-manager) until Ctrl-C or SIGTERM,
//! `inplace-testbed cluster --dir DIR --nodes N [--kubelet RELEASE]` a whole cluster on real
//! nodes (docs/development/test-beds.md § Real Kubernetes nodes) until Ctrl-C or SIGTERM.

use anyhow::{Context, bail};
use std::path::Path;

use inplace_tests::apiserver::ApiServer;
use inplace_tests::install::workspace_binaries;
use inplace_tests::kube_node::{ClusterOptions, KUBELET_RELEASES, KubeCluster};
use inplace_tests::nspawn::{Node, NodeOptions, RootfsRecipe, Suite, sweep_stale_nodes};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["build-rootfs", rest @ ..] => build_rootfs(rest).await?,
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
        ["cluster", rest @ ..] => serve_cluster(rest).await?,
        _ => bail!(
            "usage: inplace-testbed build-rootfs [--suite bookworm|trixie] [MIRROR] | sweep | boot NAME | kube --dir DIR [--node NAME]... | cluster --dir DIR --nodes N [--kubelet RELEASE] [--no-controller]"
        ),
    }
    Ok(())
}

/// `build-rootfs [--suite NAME] [MIRROR]`: the named suite's root filesystem, or every
/// suite's side by side (one debootstrap each; each tree has its own build lock).
async fn build_rootfs(args: &[&str]) -> anyhow::Result<()> {
    let (suites, mirror) = match args {
        ["--suite", name, rest @ ..] => (vec![name.parse::<Suite>()?], rest),
        rest => (Suite::ALL.to_vec(), rest),
    };
    let recipes: Vec<RootfsRecipe> = match mirror {
        [] => suites.into_iter().map(RootfsRecipe::of).collect(),
        [mirror] => suites
            .into_iter()
            .map(|suite| RootfsRecipe {
                mirror: (*mirror).to_owned(),
                ..RootfsRecipe::of(suite)
            })
            .collect(),
        _ => bail!("build-rootfs: expected [--suite bookworm|trixie] [MIRROR], got {args:?}"),
    };
    let built = futures::future::join_all(recipes.iter().map(|recipe| recipe.ensure())).await;
    for (recipe, path) in recipes.iter().zip(built) {
        let path =
            path.with_context(|| format!("building the {} root filesystem", recipe.suite.name()))?;
        println!("{}", path.display());
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
    until_stopped().await?;
    drop(server);
    Ok(())
}

/// `cluster --dir DIR --nodes N [--kubelet RELEASE] [--no-controller]`: the real control
/// plane, N real nodes on the oldest built kubelet (or RELEASE) with containerd and the agent,
/// the controller, every built kubelet served; `DIR/admin.kubeconfig`,
/// `DIR/releases/RELEASE.yaml` and `DIR/images.txt`. Runs until SIGINT or SIGTERM, then
/// removes every node.
async fn serve_cluster(args: &[&str]) -> anyhow::Result<()> {
    let (mut dir, mut nodes, mut kubelet, mut controller) = (None, 3, KUBELET_RELEASES[0], true);
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let mut value = || {
            rest.next()
                .with_context(|| format!("cluster: {flag} needs a value"))
        };
        match *flag {
            "--dir" => dir = Some(Path::new(value()?).to_path_buf()),
            "--nodes" => nodes = value()?.parse().context("cluster: --nodes N")?,
            "--kubelet" => kubelet = value()?,
            "--no-controller" => controller = false,
            other => bail!("cluster: unknown flag {other}"),
        }
    }
    let dir = dir.context("cluster: --dir DIR is required")?;
    println!("building the agent and the controller (cargo; cached)");
    let (agent, controller_bin) = workspace_binaries().await?;
    let options = ClusterOptions {
        dir: std::path::absolute(&dir)?,
        nodes,
        name_prefix: "node".to_owned(),
        kubelet: kubelet.to_owned(),
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
