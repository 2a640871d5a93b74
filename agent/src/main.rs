//! `inplace-agent`: applies this node's NodeUpdatePlan.
//!
//! `inplace-agent [--config FILE] [run]` runs the agent; `inplace-agent check-config`
//! validates the configuration (and its drop-ins, and the trusted keys directory) and
//! prints the merged result;
//! `inplace-agent metrics` prints the running agent's metrics; `inplace-agent guard` guards a
//! pending switch of the agent itself (docs/design/agent-self-update.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use inplace_agent::fetch::HttpFetcher;
use inplace_agent::health::RealProbes;
use inplace_agent::metrics_server::{self, Endpoints};
use inplace_agent::power::Logind;
use inplace_agent::self_update::host::RunningAgent;
use inplace_agent::settings::{self, Settings};
use inplace_agent::systemd::DbusSystemd;
use inplace_agent::update::{Agent, Host};
use inplace_agent::{check_config, kube_client, notify, self_update, status, watch};
use inplace_proto::NodeUpdatePlan;
use nix::fcntl::{Flock, FlockArg};
use tokio::signal::unix::{SignalKind, signal};
use tracing::Instrument;

#[derive(Parser)]
#[command(version = inplace_agent::build_version(), about = "Applies this node's NodeUpdatePlan")]
struct Cli {
    /// The main configuration file; drop-ins are read from `agent.d/` beside it.
    #[arg(long, default_value = settings::DEFAULT_CONFIG)]
    config: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent (the default).
    Run,
    /// Validate the configuration (and the trusted keys it names) and print the merged
    /// settings.
    CheckConfig,
    /// After a person repaired a node whose rollback failed: allow automatic action again.
    /// Takes the single-instance lock, so stop the service first.
    ClearDegraded,
    /// Guard a pending switch of the agent itself (run by inplace-agent-guard.service, as the
    /// previous agent binary): restore the previous agent image when the new agent has not
    /// confirmed itself by the deadline. Reads no configuration file: the new image's
    /// vendor layer may be what is broken.
    Guard {
        /// The agent's state directory.
        #[arg(long, default_value = self_update::GUARD_STATE_DIR)]
        state_dir: PathBuf,
        /// Where the agent's extension link lives.
        #[arg(long, default_value = self_update::GUARD_EXTENSIONS_DIR)]
        extensions_dir: PathBuf,
    },
    /// Print the running agent's Prometheus metrics (read from its Unix socket).
    Metrics {
        /// The socket; default: `metrics.socket` of the configuration.
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

fn hostname() -> Option<String> {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
}

fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("INPLACE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Under systemd, log to journald with structured fields; otherwise to stderr.
    let journald = std::env::var_os("JOURNAL_STREAM")
        .and_then(|_| tracing_journald::layer().ok())
        .map(|l| {
            // Plain field names (NODE, REVISION, PHASE, ...) for `journalctl NODE=worker-7`.
            l.with_syslog_identifier("inplace-agent".into())
                .with_field_prefix(None)
        });
    let registry = tracing_subscriber::registry().with(filter);
    match journald {
        Some(layer) => registry.with(layer).init(),
        None => registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .init(),
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command.unwrap_or(Command::Run) {
        Command::CheckConfig => check_config(&cli.config),
        Command::Metrics { socket } => print_metrics(&cli.config, socket),
        Command::ClearDegraded => runtime().and_then(|rt| rt.block_on(clear_degraded(&cli.config))),
        Command::Guard {
            state_dir,
            extensions_dir,
        } => runtime().and_then(|rt| rt.block_on(guard(&state_dir, &extensions_dir))),
        Command::Run => runtime().and_then(|rt| rt.block_on(run(&cli.config))),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // stderr reaches the journal under systemd too.
            eprintln!("inplace-agent: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One thread runs every task: the agent waits on the API, systemd and the network, and
/// its CPU work (hashing, writing, unpacking) runs on tokio's blocking pool. A multi-threaded
/// scheduler would add worker threads, their stacks and its own code (and libm) to the
/// footprint of an agent that idles on every node.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn check_config(path: &Path) -> anyhow::Result<()> {
    let files = settings::layer_files(path)?;
    let settings = settings::load(path, hostname)?;
    let keys = check_config::trusted_keys(&settings.policy)?;
    let mut described = check_config::describe(&settings.policy.trusted_keys_dir, &keys);
    let agent_keys = &settings.self_update.trusted_keys_dir;
    if settings.self_update.allow && *agent_keys != settings.policy.trusted_keys_dir {
        let keys = inplace_agent::signature::load_trusted_keys(agent_keys)
            .context("self_update.trusted_keys_dir")?;
        described.push_str(&format!(
            " (Kubernetes artifacts)\n{} (agent images)",
            check_config::describe(agent_keys, &keys)
        ));
    }
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = writeln!(
        out,
        "# read (when present): {files:?}\n{settings:#?}\n{described}"
    );
    Ok(())
}

fn print_metrics(config: &Path, socket: Option<PathBuf>) -> anyhow::Result<()> {
    let socket = match socket {
        Some(socket) => socket,
        None => {
            let settings = settings::load(config, hostname)
                .with_context(|| format!("configuration {}", config.display()))?;
            if !settings.metrics.enabled {
                bail!(
                    "metrics are disabled in the configuration (metrics.enabled = false); pass --socket to try anyway"
                );
            }
            settings.metrics.socket
        }
    };
    let text = metrics_server::scrape(&socket, std::time::Duration::from_secs(10))?;
    use std::io::Write;
    // A closed pipe (`| grep -m1`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    Ok(())
}

async fn guard(state_dir: &Path, extensions_dir: &Path) -> anyhow::Result<()> {
    let paths = self_update::GuardPaths::new(state_dir, extensions_dir);
    // The default job timeout of the agent's settings: restarting the old agent waits for
    // its READY=1.
    let systemd = DbusSystemd::connect(std::time::Duration::from_secs(300))
        .await
        .context("connecting to systemd")?;
    let boot_id = self_update::deadline::read_boot_id();
    let now = || self_update::ClockReading::read(boot_id.clone());
    let verdict = self_update::guard(&paths, &systemd, &now).await?;
    tracing::info!(?verdict, "agent switch guard done");
    Ok(())
}

async fn clear_degraded(config: &Path) -> anyhow::Result<()> {
    let settings = settings::load(config, hostname)?;
    let _lock = take_lock(&settings.paths.lock_file)?;
    let file = inplace_agent::journal::JournalFile::new(&settings.state_dir);
    let mut journal = file.load().await?;
    match journal.clear_degraded() {
        Some(failure) => {
            file.save(&journal).await?;
            println!("cleared: {}", failure.message);
        }
        None => println!("the node is not degraded"),
    }
    Ok(())
}

/// Holds the single-instance lock for as long as it lives.
fn take_lock(path: &Path) -> anyhow::Result<Flock<std::fs::File>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(lock),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => bail!(
            "another inplace-agent is running on this node (it holds {})",
            path.display()
        ),
        Err((_, e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}

async fn run(config: &Path) -> anyhow::Result<()> {
    let settings: Settings = settings::load(config, hostname)
        .with_context(|| format!("configuration {}", config.display()))?;
    let _lock = take_lock(&settings.paths.lock_file)?;
    let node = settings.node_name.clone();
    let node_name = node.clone();
    tracing::info!(%node, version = inplace_agent::build_version(), "starting");
    let notifier = Arc::new(notify::Notifier::default());
    notifier.status("connecting");

    let client = kube_client::client(&settings.kube).await?;
    let plans: kube::Api<NodeUpdatePlan> = kube::Api::all(client.clone());
    let systemd = DbusSystemd::connect(settings.activation.job_timeout)
        .await
        .context("connecting to systemd over D-Bus")?;
    let fetcher = HttpFetcher::new(&settings.download, &settings.policy)?
        .with_credentials(settings.credentials.clone())
        .with_mirrors(settings.mirrors.clone());
    let probes = RealProbes::new(Some(client), &node, settings.download.connect_timeout)?;
    let (sink, status_rx) = status::channel(plans.clone(), node.clone());
    let writer = tokio::spawn(status::run_writer(
        plans.clone(),
        node.clone(),
        status_rx,
        std::time::Duration::from_secs(5),
    ));
    let host = Host {
        systemd: Arc::new(systemd),
        fetcher: Arc::new(fetcher),
        probes: Arc::new(probes),
        status: Arc::new(sink),
        notify: {
            let notifier = notifier.clone();
            Arc::new(move |line: &str| notifier.status(line))
        },
        running: RunningAgent::this_process(),
        power: Arc::new(
            Logind::connect()
                .await
                .context("connecting to logind over D-Bus")?,
        ),
    };
    let endpoints = if settings.metrics.enabled {
        Some(Endpoints::bind(&settings.metrics).await?)
    } else {
        None
    };
    let mut agent = Agent::open(settings, host).await?;
    let metrics_server = endpoints.map(|endpoints| {
        tracing::info!(socket = %endpoints.socket().display(), tcp = ?endpoints.tcp_addr(), "serving metrics");
        tokio::spawn(endpoints.serve(agent.metrics()))
    });

    let (tx, rx) = tokio::sync::watch::channel(None);
    let watcher = tokio::spawn(watch::run(plans, node, tx));
    notify::ready();
    notifier.status("waiting for the plan");
    let _watchdog = notify::spawn_watchdog();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;

    let span = tracing::info_span!("agent", node = %node_name);
    let work = async {
        agent.follow(rx).instrument(span).await?;
        bail!("the plan watch ended")
    };
    // Stopping mid-step is as safe as a crash: the journal says where to resume.
    let result = tokio::select! {
        r = work => r,
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    };
    notify::stopping();
    watcher.abort();
    writer.abort();
    if let Some(server) = metrics_server {
        // The socket file goes with the server task.
        server.abort();
        let _ = server.await;
    }
    tracing::info!("stopped");
    result
}
