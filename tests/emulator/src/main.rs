//! `inplace-api-emulator`: run the Kubernetes API emulator on a port and write a kubeconfig.

use anyhow::Context as _;
use clap::Parser;
use inplace_api_emulator::{AuthzMode, Emulator, EmulatorConfig, User};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Run the inplace Kubernetes API server emulator until SIGINT/SIGTERM.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write an admin kubeconfig.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Directories of CRD YAML files to install at start (repeatable).
    #[arg(long)]
    crds: Vec<PathBuf>,
    /// Also write a kubeconfig per node: `--node-kubeconfig worker-1=/tmp/worker-1.kubeconfig`.
    #[arg(long, value_parser = parse_node)]
    node_kubeconfig: Vec<(String, PathBuf)>,
    /// Enforce RBAC (otherwise every authenticated user may do everything).
    #[arg(long)]
    rbac: bool,
    /// Events kept per resource for watches from an older resourceVersion.
    #[arg(long, default_value_t = 10_000)]
    history_window: usize,
}

fn parse_node(s: &str) -> Result<(String, PathBuf), String> {
    let (n, p) = s.split_once('=').ok_or("expected NODE=PATH")?;
    Ok((n.to_string(), PathBuf::from(p)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let config = EmulatorConfig {
        listen: args.listen,
        history_window: args.history_window,
        authz: if args.rbac {
            AuthzMode::Rbac
        } else {
            AuthzMode::AlwaysAllow
        },
        ..EmulatorConfig::default()
    };
    let handle = Emulator::start(config).await?;
    for dir in &args.crds {
        handle
            .apply_crd_dir(dir)
            .await
            .with_context(|| format!("installing CRDs from {}", dir.display()))?;
    }
    if let Some(path) = &args.kubeconfig {
        handle.write_kubeconfig(path, &User::admin())?;
    }
    for (node, path) in &args.node_kubeconfig {
        handle.write_kubeconfig(path, &User::node(node))?;
    }
    println!("inplace-api-emulator listening on {}", handle.url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    handle.shutdown().await;
    Ok(())
}
