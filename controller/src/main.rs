//! `inplace-controller`: turns releases and rollouts into per-node plans.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use inplace_controller::context::ReconcileSettings;
use inplace_controller::leader::LeaseSettings;
use inplace_controller::metrics::Metrics;
use inplace_controller::run::{Settings, run};

#[derive(Parser)]
#[command(name = "inplace-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions, or write one file per CRD into a directory.
    Crds {
        /// Directory to write `<plural>.yaml` files into (default: print to stdout).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run the controllers (in-cluster, or with KUBECONFIG / --kubeconfig).
    Run {
        /// Where to serve /metrics, /healthz and /readyz.
        #[arg(long, default_value = "0.0.0.0:8080")]
        metrics_addr: SocketAddr,
        /// A kubeconfig file (default: in-cluster config, or $KUBECONFIG, or ~/.kube/config).
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// Namespace of the leader-election Lease.
        #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
        lease_namespace: String,
        /// This replica's identity in the Lease (default: $POD_NAME, or host name + pid).
        #[arg(long, env = "POD_NAME")]
        identity: Option<String>,
        /// Run without leader election (only ever one replica).
        #[arg(long)]
        no_leader_election: bool,
        /// Publish Events only for failures and rollout-level transitions, not for every
        /// node that starts or finishes (for very large fleets).
        #[arg(long)]
        no_node_events: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds { out } => write_crds(out),
        Command::Run {
            metrics_addr,
            kubeconfig,
            lease_namespace,
            identity,
            no_leader_election,
            no_node_events,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .init();
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(async move {
                let config = config(kubeconfig).await?;
                let identity = identity.unwrap_or_else(default_identity);
                let settings = Settings {
                    metrics_addr: Some(metrics_addr),
                    lease: (!no_leader_election)
                        .then(|| LeaseSettings::new(&lease_namespace, &identity)),
                    reconcile: ReconcileSettings {
                        node_events: !no_node_events,
                        ..ReconcileSettings::default()
                    },
                };
                let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
                tokio::spawn(async move {
                    wait_for_signal().await;
                    tracing::info!("stopping");
                    let _ = stop_tx.send(true);
                });
                run(config, settings, Arc::new(Metrics::default()), stop_rx).await
            })
        }
    }
}

async fn config(kubeconfig: Option<PathBuf>) -> anyhow::Result<kube::Config> {
    let Some(path) = kubeconfig else {
        return kube::Config::infer()
            .await
            .context("finding the Kubernetes API (in-cluster or ~/.kube/config)");
    };
    let config = kube::config::Kubeconfig::read_from(&path)
        .with_context(|| format!("reading {}", path.display()))?;
    kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .with_context(|| format!("using {}", path.display()))
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    format!("{host}-{}", std::process::id())
}

async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn write_crds(out: Option<PathBuf>) -> anyhow::Result<()> {
    for (file_name, crd) in inplace_proto::crd::all() {
        let yaml = inplace_proto::crd::to_yaml(&crd);
        match &out {
            Some(dir) => {
                let path = dir.join(file_name);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}
