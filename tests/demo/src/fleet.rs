//! The demo, step by step: servers, images, nodes on kubelet v1, controller, a workload,
//! then the v2 rollout (and, with `--broken-v3`, a kubelet that cannot start, which halts;
//! with `--agent-update`, the agent updating itself, then a broken agent that halts). Each
//! step is a named function of its own module; `run` says their order and what each hands
//! the next.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use inplace_tests::agent_images::ReleaseKey;
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::kube_node::KubeletPorts;
use inplace_tests::nspawn::Node;
use kubectl_inplace::render::Style;

use crate::Args;
use crate::agent_update::{self, AGENT_ROLLOUT, AgentUpdate};
use crate::broken::roll_out_broken_v3;
use crate::cluster::Cluster;
use crate::follow::Watch;
use crate::nodes::AgentInstall;
use crate::report::inspect_hints;
use crate::{kubelet, setup, workload};

/// The two real kubelet releases the demo swaps between (built from Kubernetes' Go module,
/// `tests/kubelet`): a patch update, the common in-place case. `--broken-v3` rolls out V2's
/// kubelet again in an image whose drop-in passes a flag the kubelet refuses.
pub(crate) const V1: &str = "v1.36.1";
pub(crate) const V2: &str = "v1.36.3";
/// The broken release's NodeRelease.
pub(crate) const BROKEN_RELEASE: &str = "kubelet-broken";
/// How long the agent may wait for a healthy window before it rolls back. A crash-looping
/// kubelet never gives it one, so the broken release's rollback comes after its timeout: a
/// shorter one keeps the demo short.
pub(crate) const HEALTH_TIMEOUT: &str = "3m";
pub(crate) const BROKEN_HEALTH_TIMEOUT: &str = "15s";
/// The rollouts' `maxUnavailable` after the setup, which the demo checks from outside.
pub(crate) const MAX_UNAVAILABLE: usize = 1;
/// The NodeRollout's name.
pub(crate) const ROLLOUT: &str = "kubelet";
/// The label that selects the demo's nodes.
pub(crate) const FLEET_LABEL: &str = "inplace.dev/demo-fleet";
/// Patience for any one phase of the demo (a loaded 2-core machine is slow).
pub(crate) const PATIENCE: Duration = Duration::from_secs(600);

/// Runs the demo; every path out (success, error, Ctrl-C) cleans up.
pub async fn main(args: Args) -> ExitCode {
    if args.cluster_api {
        return crate::cluster_api::main(&args).await;
    }
    let fleet = Arc::new(Mutex::new(Vec::<Node>::new()));
    let mut keep = Keep::default();
    let code = until_ctrl_c(run(&args, &fleet, &mut keep)).await;
    println!("\ncleaning up: powering off the nodes, stopping the controller and the servers ...");
    let nodes: Vec<Node> = fleet
        .lock()
        .map(|mut f| f.drain(..).collect())
        .unwrap_or_default();
    let offs = nodes.into_iter().map(|n| async move {
        let name = n.name().to_owned();
        if let Err(e) = n.poweroff().await {
            eprintln!("  powering off {name}: {e}");
        }
    });
    futures::future::join_all(offs).await;
    if let Some(cluster) = &keep.api {
        // Before the controller stops: it takes its finalizer off the rollout.
        let names = keep.nodes.clone();
        if let Err(e) = tokio::task::block_in_place(|| {
            cluster.remove_demo_objects(&[AGENT_ROLLOUT, ROLLOUT], &names)
        }) {
            eprintln!("  removing the demo's objects from the cluster: {e:#}");
        }
    }
    if let Some(mut c) = keep.controller.take() {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    drop(keep.artifacts.take());
    // A started cluster (etcd, kube-apiserver, kube-controller-manager) stops with it.
    drop(keep.api.take());
    println!("done.");
    code
}

/// Runs `demo` until it ends or Ctrl-C; says why it failed. The caller cleans up after.
pub(crate) async fn until_ctrl_c(
    demo: impl std::future::Future<Output = anyhow::Result<()>>,
) -> ExitCode {
    let outcome = tokio::select! {
        r = demo => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted (Ctrl-C)")),
    };
    match &outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ninplace-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Unless `--no-wait`: says `what` stays up and waits for Enter (or Ctrl-C).
pub(crate) async fn wait_unless_no_wait(args: &Args, what: &str) {
    if args.no_wait {
        return;
    }
    println!("\n{what} Press Enter (or Ctrl-C) to clean up.");
    let mut line = String::new();
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
    let _ = tokio::io::AsyncBufReadExt::read_line(&mut stdin, &mut line).await;
}

/// What must outlive `run` until cleanup.
#[derive(Default)]
pub(crate) struct Keep {
    pub(crate) api: Option<Cluster>,
    /// The nodes' names (their Node objects and plans, to remove from an existing cluster).
    pub(crate) nodes: Vec<String>,
    pub(crate) artifacts: Option<ArtifactServer>,
    pub(crate) controller: Option<tokio::process::Child>,
}

/// Where the demo finds its programs and the repository's files.
pub(crate) struct Paths {
    pub(crate) agent: PathBuf,
    pub(crate) controller: PathBuf,
    pub(crate) bin_dir: PathBuf,
    pub(crate) work: PathBuf,
}

fn paths(args: &Args) -> anyhow::Result<Paths> {
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()
            .context("locating this program")?
            .parent()
            .context("this program's directory")?
            .to_path_buf(),
    };
    let find = |name: &str| -> anyhow::Result<PathBuf> {
        let p = bin_dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            bail!(
                "{} not found: build it first (scripts/demo.sh runs `cargo build --release -p inplace-agent -p inplace-controller -p inplace-tests -p kubectl-inplace --bins`)",
                p.display()
            )
        }
    };
    Ok(Paths {
        agent: find("inplace-agent")?,
        controller: find("inplace-controller")?,
        bin_dir: bin_dir.clone(),
        work: args.work_dir.clone(),
    })
}

pub(crate) fn step(text: &str) {
    println!("==> {text}");
}

/// One node of the fleet, as the demo tracks it.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) name: String,
    /// Its kubelet's ports on host loopback (the nodes share the host's network).
    pub(crate) ports: KubeletPorts,
}

/// What the rollout steps share once the fleet is up.
pub(crate) struct Demo<'a> {
    pub(crate) args: &'a Args,
    pub(crate) client: &'a kube::Client,
    pub(crate) server: &'a ArtifactServer,
    pub(crate) watch: &'a Watch,
    pub(crate) members: &'a [Member],
    pub(crate) style: &'a Style,
    pub(crate) tty: bool,
    pub(crate) fleet: &'a Arc<Mutex<Vec<Node>>>,
    /// The admin's kubeconfig (a copy in the work directory).
    pub(crate) kubeconfig: &'a Path,
    /// The demo's work directory.
    pub(crate) work: &'a Path,
}

async fn run(args: &Args, fleet: &Arc<Mutex<Vec<Node>>>, keep: &mut Keep) -> anyhow::Result<()> {
    let started = Instant::now();
    inplace_tests::prereq::require_root()?;
    inplace_tests::prereq::require_nspawn()?;
    inplace_tests::prereq::require_squashfs_tools()?;
    let paths = paths(args)?;
    tokio::fs::create_dir_all(paths.work.join("images"))
        .await
        .with_context(|| format!("creating {}", paths.work.display()))?;
    let tty = std::io::stdout().is_terminal();
    let style = Style::for_terminal(tty);
    // Before anything starts: a missing agent v2 fails at once, not after the kubelet show.
    let agent_versions = match (&args.agent_update, &args.agent_bin_dir) {
        (true, Some(dir)) => Some(agent_update::agent_versions(&paths.agent, dir)?),
        _ => None,
    };
    let release_key = ReleaseKey::generate()?;

    let (client, kubeconfig) = setup::start_cluster(args, &paths, keep).await?;
    let (server, images) = setup::serve_kubelet_images(args, &paths).await?;
    let agent = AgentInstall::build(&paths, agent_versions.is_some().then_some(&release_key))?;
    let members = setup::boot_fleet(args, &server, keep, fleet, &agent, &images.v1).await?;
    let cluster = keep.api.as_ref().context("the cluster")?;
    let controller = setup::start_controller(&paths, cluster)?;
    keep.controller = Some(controller);

    let watch = Watch::start(&client);
    let demo = Demo {
        args,
        client: &client,
        server: &server,
        watch: &watch,
        members: &members,
        style: &style,
        tty,
        fleet,
        kubeconfig: &kubeconfig,
        work: &paths.work,
    };
    let workload = workload::start(&demo).await?;
    let limits = kubelet::roll_out_v2(&demo, &images.v2, &workload, started).await?;
    if let Some(broken) = &images.broken {
        roll_out_broken_v3(&demo, broken, &limits, &workload).await?;
    }
    if let Some(versions) = &agent_versions {
        let update = AgentUpdate {
            client: &client,
            server: &server,
            watch: &watch,
            key: &release_key,
            versions,
            images: paths.work.join("images"),
        };
        agent_update::roll_out_agents(&update, &members, &style, tty, fleet).await?;
    }
    let pids: Vec<(String, i32)> = fleet
        .lock()
        .map(|f| f.iter().map(|n| (n.name().to_owned(), n.pid1())).collect())
        .unwrap_or_default();
    inspect_hints(&paths, &kubeconfig, &members, &pids);
    wait_unless_no_wait(args, "The fleet stays up while you look.").await;
    Ok(())
}
