//! `inplace-controller`: turns releases and rollouts into per-node plans.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use inplace_controller::context::ReconcileSettings;
use inplace_controller::metrics::Metrics;
use inplace_controller::rollout::alert_gate::PrometheusSettings;
use inplace_controller::rollout::fleetlock::FleetLockSettings;
use inplace_controller::rollout::kured_lock::{KURED_RECHECK, KuredSettings};
use inplace_controller::runtime::leader::LeaseSettings;
use inplace_controller::runtime::run::{Settings, run};
use k8s_openapi::jiff::SignedDuration;

/// The controller decodes and drops hundreds of thousands of small objects per large
/// rollout; with glibc's allocator a third of its CPU was malloc and free
/// (docs/design/scale-history.md § What the runs found).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        /// The Prometheus whose alerts `spec.gates.alerts` names (`http://prometheus:9090`;
        /// asked at `<url>/api/v1/alerts`). Unset: a rollout listing alerts is held with
        /// reason `GateUnavailable`.
        #[arg(long, env = "INPLACE_PROMETHEUS_URL")]
        prometheus_url: Option<url::Url>,
        /// Give up on Prometheus' answer after this long (`5s`); the gate then stays closed.
        #[arg(long, env = "INPLACE_PROMETHEUS_TIMEOUT", default_value = "5s")]
        prometheus_timeout: inplace_proto::Duration,
        /// How often a rollout that lists alerts asks Prometheus again (`30s`).
        #[arg(long, default_value = "30s")]
        alert_recheck: inplace_proto::Duration,
        /// Share the fleet with kured: its DaemonSet as `NAMESPACE/NAME` (kured's
        /// `--ds-namespace`/`--ds-name`, usually `kube-system/kured`). Rollouts then grant
        /// nothing while a kured daemon holds its reboot lock, and hold it themselves while
        /// they activate nodes. Unset: kured's lock is not read.
        #[arg(long, env = "INPLACE_KURED_DAEMONSET")]
        kured_daemonset: Option<String>,
        /// kured's lock annotation (kured's `--lock-annotation`).
        #[arg(long, default_value = inplace_controller::decision::kured::KURED_LOCK_ANNOTATION)]
        kured_lock_annotation: String,
        /// The TTL written on the lock inplace takes (as kured's `--lock-ttl`, `2h`); unset:
        /// none, the lock stays until inplace releases it.
        #[arg(long)]
        kured_lock_ttl: Option<inplace_proto::Duration>,
        /// Serve the FleetLock protocol here (`0.0.0.0:8090`): zincati's `fleet_lock`
        /// strategy asks inplace for its reboot slots, which come from the rollouts' budget
        /// (docs/usage/fleetlock.md). Unset: not served.
        #[arg(long, env = "INPLACE_FLEETLOCK_ADDR")]
        fleetlock_addr: Option<SocketAddr>,
        /// How many FleetLock clients of one group may hold a reboot slot at once.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        fleetlock_max_holders: u16,
    },
    /// Serve Cluster API's in-place update hooks (a Runtime Extension) over HTTPS, from
    /// the management cluster.
    Capi {
        /// Where to listen.
        #[arg(long, default_value = "0.0.0.0:9443")]
        listen: SocketAddr,
        /// PEM certificate chain (reloaded when the file changes).
        #[arg(long)]
        cert: PathBuf,
        /// PEM private key (reloaded when the file changes).
        #[arg(long)]
        key: PathBuf,
        /// `retryAfterSeconds` while an update is in progress (1 to 600).
        #[arg(long, default_value_t = 5)]
        retry_after_seconds: i32,
        /// `timeoutSeconds` announced for UpdateMachine (1 to 30).
        #[arg(long, default_value_t = 30)]
        update_machine_timeout_seconds: i32,
        /// Cordon and drain a node after staging and before activation.
        #[arg(long)]
        drain: bool,
        /// Give a drain up after this long (`10m`, `90s`).
        #[arg(long, default_value = "10m")]
        drain_timeout: inplace_proto::Duration,
        /// A drain past its timeout: `Halt` fails the update; `Force` deletes the pods left
        /// without eviction (PodDisruptionBudgets ignored) and fails only if they are still
        /// there another timeout later.
        #[arg(long, default_value = "Halt", value_parser = parse_on_drain_timeout)]
        drain_on_timeout: inplace_proto::OnDrainTimeout,
        /// A kubeconfig for the management cluster (default: in-cluster, or $KUBECONFIG).
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
    },
    /// Make NodeReleases.
    Release {
        #[command(subcommand)]
        command: inplace_controller::release::cli::ReleaseCommand,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds { out } => write_crds(out),
        Command::Release { command } => command.run(),
        Command::Capi {
            listen,
            cert,
            key,
            retry_after_seconds,
            update_machine_timeout_seconds,
            drain,
            drain_timeout,
            drain_on_timeout,
            kubeconfig,
        } => {
            init_tracing();
            let mut settings = inplace_capi::Config::new(listen, cert, key);
            settings.retry_after_seconds = retry_after_seconds;
            settings.update_machine_timeout_seconds = update_machine_timeout_seconds;
            settings.drain = drain;
            settings.drain_timeout = drain_timeout.get();
            settings.drain_on_timeout = drain_on_timeout;
            settings.validate().map_err(anyhow::Error::msg)?;
            // One process-wide TLS provider (ring), as kube-rs uses.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(async move {
                let client = kube::Client::try_from(config(kubeconfig).await?)
                    .context("connecting to the management cluster")?;
                inplace_capi::run(settings, client, wait_for_signal())
                    .await
                    .context("serving the Cluster API hooks")
            })
        }
        Command::Run {
            metrics_addr,
            kubeconfig,
            lease_namespace,
            identity,
            no_leader_election,
            no_node_events,
            prometheus_url,
            prometheus_timeout,
            alert_recheck,
            kured_daemonset,
            kured_lock_annotation,
            kured_lock_ttl,
            fleetlock_addr,
            fleetlock_max_holders,
        } => {
            let kured = kured_daemonset
                .map(|at| kured_settings(&at, kured_lock_annotation, kured_lock_ttl))
                .transpose()?;
            init_tracing();
            // One thread: the controller's work is a stream of small events and writes,
            // and on a multi-threaded runtime a fifth of its CPU went to waking and
            // parking the second worker for each of them (docs/design/scale-history.md
            // § What the runs found). A round's decision is pure and short, so nothing waits
            // long behind it.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(async move {
                let config = config(kubeconfig).await?;
                let identity = identity.unwrap_or_else(default_identity);
                let settings = Settings {
                    metrics_addr: Some(metrics_addr),
                    lease: (!no_leader_election)
                        .then(|| LeaseSettings::new(&lease_namespace, &identity)),
                    reconcile: ReconcileSettings {
                        node_events: !no_node_events,
                        prometheus: prometheus_url.map(|url| PrometheusSettings {
                            url,
                            timeout: prometheus_timeout.get(),
                        }),
                        alert_recheck: alert_recheck.get(),
                        kured,
                        fleetlock: fleetlock_addr.map(|addr| FleetLockSettings {
                            addr,
                            max_holders: usize::from(fleetlock_max_holders),
                        }),
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

/// `--kured-daemonset NAMESPACE/NAME` and the lock's annotation and TTL.
fn kured_settings(
    at: &str,
    annotation: String,
    ttl: Option<inplace_proto::Duration>,
) -> anyhow::Result<KuredSettings> {
    let Some((namespace, name)) = at
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
    else {
        anyhow::bail!("--kured-daemonset {at:?}: expected NAMESPACE/NAME, e.g. kube-system/kured");
    };
    let ttl = ttl.map_or(Ok(SignedDuration::ZERO), |t| {
        SignedDuration::try_from(t.get())
    })?;
    Ok(KuredSettings {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        annotation,
        ttl,
        recheck: KURED_RECHECK,
    })
}

/// `--drain-on-timeout`, spelled as a rollout's `spec.drain.onTimeout`.
fn parse_on_drain_timeout(value: &str) -> Result<inplace_proto::OnDrainTimeout, String> {
    serde_json::from_value(serde_json::Value::String(value.to_owned()))
        .map_err(|_| format!("{value:?}: expected Halt or Force"))
}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `--kured-daemonset` names kured's DaemonSet as NAMESPACE/NAME; the annotation and
    /// TTL flags come along; anything else is refused naming the flag and the value.
    #[test]
    fn kured_daemonset_is_namespace_slash_name() {
        let ttl: inplace_proto::Duration = "2h".parse().unwrap();
        let settings =
            kured_settings("kube-system/kured", "my.example/lock".into(), Some(ttl)).unwrap();
        assert_eq!(
            (settings.namespace.as_str(), settings.name.as_str()),
            ("kube-system", "kured")
        );
        assert_eq!(settings.annotation, "my.example/lock");
        assert_eq!(settings.ttl, SignedDuration::from_hours(2));
        let untimed = kured_settings("kube-system/kured", "a".into(), None).unwrap();
        assert_eq!(
            untimed.ttl,
            SignedDuration::ZERO,
            "unset: a lock without TTL"
        );
        for bad in ["kured", "/kured", "kube-system/", ""] {
            let error = kured_settings(bad, "a".into(), None)
                .unwrap_err()
                .to_string();
            assert_eq!(
                error,
                format!(
                    "--kured-daemonset {bad:?}: expected NAMESPACE/NAME, e.g. kube-system/kured"
                )
            );
        }
    }

    /// The flags as the controller's command line reads them.
    #[test]
    fn run_reads_the_kured_flags() {
        let cli = Cli::try_parse_from([
            "inplace-controller",
            "run",
            "--kured-daemonset",
            "kube-system/kured",
            "--kured-lock-ttl",
            "90m",
        ])
        .unwrap();
        let Command::Run {
            kured_daemonset,
            kured_lock_annotation,
            kured_lock_ttl,
            ..
        } = cli.command
        else {
            panic!("not run");
        };
        assert_eq!(kured_daemonset.as_deref(), Some("kube-system/kured"));
        assert_eq!(kured_lock_annotation, "weave.works/kured-node-lock");
        assert_eq!(
            kured_lock_ttl.map(|t| t.get()),
            Some(std::time::Duration::from_secs(90 * 60))
        );
        let error = Cli::try_parse_from(["inplace-controller", "run", "--kured-lock-ttl", "soon"])
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("--kured-lock-ttl"), "{error}");
    }
}
