//! `inplace-demo`: the local demo fleet. Boots nspawn nodes that are real Kubernetes nodes
//! (the real kubelet of Kubernetes' own Go module in a `kubernetes` system extension,
//! containerd, runc, CNI) with the real agent unit, starts a real Kubernetes control plane
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler of the release `tests/kube`
//! pins), the controller and an artifact server, brings the fleet to kubelet v1 and runs a
//! Pod on every node, then rolls v2 out with `maxUnavailable: 1` under a maintenance window
//! that opens a minute later (printing what `kubectl inplace status` says while it holds;
//! once every node has staged v2 the demo opens the window rather than wait) while drawing
//! live progress and watching that no more than one node is ever activating.
//! It shows `kubectl get nodes` before and after, fails unless every Pod kept its container
//! (same ID, start time, process), and prints a summary (time per node, kubelet downtime per
//! swap, the most nodes activating at once). `--broken-v3` then rolls out a kubelet that
//! cannot start and shows the rollout halt after the first rollback. Cleans up on exit, on an
//! error and on Ctrl-C. Runs as root; `scripts/demo.sh` (`make demo`) builds what it needs.
//! `--cluster-api` shows the same update driven by Cluster API's controllers instead
//! ([`cluster_api`]).

mod agent_update;
mod broken;
mod cluster;
mod cluster_api;
mod cluster_api_follow;
mod concurrency;
mod fleet;
mod follow;
mod kubelet;
mod measure;
mod nodes;
mod render;
mod report;
mod setup;
mod window;
mod workload;

use std::path::PathBuf;

use clap::Parser;

/// The local demo fleet of inplace.
#[derive(Parser, Debug, Clone)]
#[command(name = "inplace-demo", version, about)]
pub struct Args {
    /// How many nodes to boot.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub nodes: u32,
    /// Node names are `<prefix>-1`, `<prefix>-2`, ...
    #[arg(long, default_value = "demo")]
    pub name_prefix: String,
    /// Run against an existing cluster (its admin kubeconfig) instead of starting one. Its API
    /// server must be reachable from this machine's network (the nodes share it). The demo
    /// installs the CRDs and the shipped RBAC and admission policy, and removes its own
    /// objects (rollout, releases, plans, Node objects, the nodes' identities) at the end.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Where the release binaries are (inplace-agent, inplace-controller,
    /// kubectl-inplace). Default: next to this program.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Where the cluster's state, the kubeconfigs, images and logs go (the cluster's state
    /// is started afresh on every run).
    #[arg(long, default_value = "/var/tmp/inplace-demo")]
    pub work_dir: PathBuf,
    /// Do not wait for Enter at the end: clean up and exit (CI, tests).
    #[arg(long)]
    pub no_wait: bool,
    /// Seconds each kubelet image download takes (the artifact server throttles so the
    /// download bars have something to show; 0: full speed).
    #[arg(long, default_value_t = 4)]
    pub download_seconds: u64,
    /// Seconds the kubelet must stay healthy after a swap before the agent commits.
    #[arg(long, default_value_t = 5)]
    pub health_window: u64,
    /// After v2, roll out a broken release (v2's kubelet with a drop-in passing a flag the
    /// kubelet refuses), with `maxFailures: 0`: the first node rolls back to v2 and the
    /// rollout halts before any other node is touched.
    #[arg(long)]
    pub broken_v3: bool,
    /// At the end, update the agent itself across the fleet (docs/usage/agent-updates.md):
    /// agent v2 through a NodeRelease with `spec.agent`, one node at a time, then an agent v3
    /// that exits 1 at start with `maxFailures: 0`: the first node's guard restores v2, its
    /// plan ends RolledBack and the rollout halts. Needs `--agent-bin-dir`.
    #[arg(long, requires = "agent_bin_dir")]
    pub agent_update: bool,
    /// Where `--agent-update` finds agent v2: `inplace-agent-<v2>` (v2 one patch above v1,
    /// pre-release `next.2`: `0.1.0` -> `0.1.1-next.2`), v1 being the
    /// version of `--bin-dir`'s agent (scripts/demo.sh builds it).
    #[arg(long)]
    pub agent_bin_dir: Option<PathBuf>,
    /// Instead of a NodeRollout, let Cluster API's own controllers drive the update
    /// (docs/usage/cluster-api.md): Cluster API's core manager (`make capi`), the extension
    /// registered by its ExtensionConfig, a MachineDeployment with a Machine on every node,
    /// and a bump of its version from v1.36.1 to v1.36.3, updated in place.
    #[arg(long, conflicts_with_all = ["kubeconfig", "broken_v3", "agent_update"])]
    pub cluster_api: bool,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("inplace-demo: starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(fleet::main(args));
    // Background tasks (watches, pollers) end with the runtime.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    code
}
