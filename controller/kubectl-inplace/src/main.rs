//! `kubectl-inplace`: the kubectl plugin. `kubectl inplace status [rollout]` shows rollouts
//! with a progress bar and every node's phase and reason; `kubectl inplace plan <node>`
//! explains one node's plan, its last error and what to do next. `--watch` re-renders on
//! watch events. `kubectl inplace pause|resume <rollout>` sets the rollout's `spec.paused`;
//! `kubectl inplace hold|release|skip <node>` set or remove the Node's steering annotations;
//! `kubectl inplace retry <node>` sets a new retry token on the node's plan;
//! `kubectl inplace preview -f rollout.yaml` shows what a rollout would do, writing nothing.

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use kubectl_inplace::preview::{preview_lines, preview_rollout, read_rollout};
use kubectl_inplace::render::Style;
use kubectl_inplace::steer::{NodeSteer, retry_node, set_paused, steer_node};
use kubectl_inplace::{Watched, client, plan, status, watch};

#[derive(Parser)]
#[command(
    name = "kubectl-inplace",
    version,
    about = "In-place node updates: rollouts and plans at a glance, pausing a rollout, steering a node"
)]
struct Cli {
    /// A kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Colours: auto (when stdout is a terminal), always, never.
    #[arg(long, global = true, default_value = "auto")]
    color: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Rollouts with a progress bar, and every node's phase, download progress and reason.
    Status {
        /// Only this NodeRollout.
        rollout: Option<String>,
        /// Re-render on every change (watch events, no polling).
        #[arg(short, long)]
        watch: bool,
    },
    /// Explain a node's plan: release, revision, artifacts, phase, conditions, what next.
    Plan {
        /// The node (its plan has the node's name).
        node: String,
        /// Re-render on every change (watch events, no polling).
        #[arg(short, long)]
        watch: bool,
    },
    /// Stop activating further nodes of a NodeRollout (sets spec.paused); staging goes on.
    Pause {
        /// The NodeRollout.
        rollout: String,
    },
    /// Let a paused NodeRollout activate nodes again (sets spec.paused to false).
    Resume {
        /// The NodeRollout.
        rollout: String,
    },
    /// Hold a node: its rollout stages it but does not activate it (annotation inplace.dev/hold).
    Hold {
        /// The Node.
        node: String,
    },
    /// Release a held or skipped node (removes inplace.dev/hold and inplace.dev/skip).
    Release {
        /// The Node.
        node: String,
    },
    /// Skip a node: it keeps the revision it runs, counted as skipped (inplace.dev/skip).
    Skip {
        /// The Node.
        node: String,
    },
    /// Retry a failed node once: a new token in its plan's inplace.dev/retry annotation.
    Retry {
        /// The Node (its plan has the node's name).
        node: String,
    },
    /// What the controller would do with a NodeRollout in a file: its nodes, activation
    /// order in waves, slots, topology groups, held / skipped nodes, the window, the skew
    /// check and each node's download. Writes nothing, downloads nothing.
    Preview {
        /// The NodeRollout (YAML or JSON).
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let tty = std::io::stdout().is_terminal();
    let color = match cli.color.as_str() {
        "always" => true,
        "never" => false,
        _ => tty,
    };
    let style = Style::for_terminal(color);
    let client = client(cli.kubeconfig.as_deref()).await?;
    let (watched, follow) = match cli.command {
        Command::Status { rollout, watch } => (Watched::Status(rollout), watch),
        Command::Plan { node, watch } => (Watched::Plan(node), watch),
        Command::Pause { rollout } => {
            println!("{}", set_paused(&client, &rollout, true).await?);
            return Ok(());
        }
        Command::Resume { rollout } => {
            println!("{}", set_paused(&client, &rollout, false).await?);
            return Ok(());
        }
        Command::Hold { node } => return steer(&client, &node, NodeSteer::Hold).await,
        Command::Release { node } => return steer(&client, &node, NodeSteer::Release).await,
        Command::Skip { node } => return steer(&client, &node, NodeSteer::Skip).await,
        Command::Retry { node } => {
            println!("{}", retry_node(&client, &node).await?);
            return Ok(());
        }
        Command::Preview { file } => {
            let rollout = read_rollout(&file)?;
            let (preview, release) = preview_rollout(&client, &rollout).await?;
            print_lines(&preview_lines(&rollout, release.as_ref(), &preview));
            return Ok(());
        }
    };
    if !follow {
        let lines = match &watched {
            Watched::Status(only) => status(&client, only.as_deref(), &style).await?,
            Watched::Plan(node) => plan(&client, node, &style).await?,
        };
        print_lines(&lines);
        return Ok(());
    }
    watch(&client, watched, style, |lines| {
        if tty {
            print!("\x1b[H\x1b[2J");
        } else {
            println!("---");
        }
        print_lines(&lines);
        true
    })
    .await
}

async fn steer(client: &kube::Client, node: &str, verb: NodeSteer) -> anyhow::Result<()> {
    println!("{}", steer_node(client, node, verb).await?);
    Ok(())
}

fn print_lines(lines: &[String]) {
    let mut out = std::io::stdout().lock();
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    let _ = out.flush();
}
