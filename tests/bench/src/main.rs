//! `inplace-bench`: measures inplace against the machine's limits and its peers.
//!
//! Each subcommand returns rows (name, value, unit, target, verdict, the command that
//! reproduces it with public tools); `all` prints one table and writes
//! `docs/benchmarks.md` with a description of the machine. Not a timed test: nothing here
//! fails because a number is bad.

mod download;
mod fanout;
mod fleet;
mod machine;
mod node;
mod real_node;
mod report;
mod util;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

pub use report::Row;

/// Command-line options shared by the measurements.
#[derive(Debug, Clone, Parser)]
#[command(name = "inplace-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options every measurement understands.
#[derive(Debug, Clone, clap::Args)]
struct Opts {
    /// Size of the download artifact, in MiB.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Repetitions per contender (medians are reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Seconds of idle sampling of the agent.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Sizes of the fleet simulation on the API emulator, one run each (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [3_000, 30_000])]
    fleet_nodes: Vec<u64>,
    /// Nodes of the fleet simulation on the real kube-apiserver + etcd (0: skip it). 10,000
    /// completed on this 2-core machine beside the controller (2.4 GiB apiserver, 152 s);
    /// 3,000 is the default so that a `make bench` beside other work ends in minutes.
    #[arg(long, default_value_t = 3_000)]
    real_fleet_nodes: u64,
    /// Nodes of the staging fan-out runs (0: skip them): each downloads --fanout-mib from
    /// one artifact server through a --fanout-link-mibps link, once without a staging
    /// limit and once with --fanout-max-concurrent.
    #[arg(long, default_value_t = 1_000)]
    fanout_nodes: u64,
    /// MiB each node downloads in the fan-out runs.
    #[arg(long, default_value_t = 4)]
    fanout_mib: u64,
    /// The artifact server's uplink in the fan-out runs, MiB/s, shared by every download.
    #[arg(long, default_value_t = 100)]
    fanout_link_mibps: u64,
    /// `spec.staging.maxConcurrent` of the limited run (a count or a percentage).
    #[arg(long, default_value = "50")]
    fanout_max_concurrent: String,
    /// A smoke run: 16 MiB, one repetition, 3 s idle, 300 simulated nodes (100 on the real
    /// API server).
    #[arg(long)]
    quick: bool,
    /// Working directory for artifacts and downloads (same disk for every contender).
    #[arg(long, default_value = "/var/tmp/inplace-bench")]
    dir: PathBuf,
    /// Where `all` writes the report (relative to the repository root unless absolute).
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
    /// The release agent binary (built by scripts/bench.sh).
    #[arg(long, env = "INPLACE_BENCH_AGENT")]
    agent_bin: Option<PathBuf>,
    /// Drop the page cache (`echo 3 > /proc/sys/vm/drop_caches`) before warming the
    /// source file for each download run.
    #[arg(long)]
    drop_caches: bool,
    /// An already built controller scale bench (`cargo bench -p inplace-controller --bench
    /// scale --no-run` names it); built here when absent.
    #[arg(long, env = "INPLACE_BENCH_FLEET_EXE")]
    fleet_exe: Option<PathBuf>,
    /// Parse a saved run of the scale bench instead of running it: stdout in FILE, the
    /// `/usr/bin/time -v` report in FILE.time (as `INPLACE_BENCH_NODES=N /usr/bin/time -v
    /// <scale bench> --bench > FILE 2> FILE.time` writes them).
    #[arg(long)]
    fleet_log: Option<PathBuf>,
    /// Download only from the test bed's artifact server (no nginx).
    #[arg(long)]
    no_nginx: bool,
}

impl Opts {
    fn effective(mut self) -> Self {
        if self.quick {
            self.size_mib = self.size_mib.min(16);
            self.reps = 1;
            self.idle_seconds = self.idle_seconds.min(3);
            self.fleet_nodes = vec![300];
            self.real_fleet_nodes = self.real_fleet_nodes.min(100);
            self.fanout_nodes = self.fanout_nodes.min(100);
        }
        self
    }
}

#[derive(Debug, Clone, Subcommand)]
enum Command {
    /// (1) Download + verify: the agent's fetcher against curl, sha256sum and openssl.
    Download(Opts),
    /// (2, 3, 5) On an nspawn node with the real agent: idle footprint, kubelet downtime
    /// per swap, the sysext floor, a reboot, Plan → Succeeded overhead.
    Node(Opts),
    /// (6) On real Kubernetes nodes: an in-place kubelet swap against a reboot and a machine
    /// replacement (kubelet /healthz, Node Ready, Pods disrupted).
    RealNode(Opts),
    /// (4) The controller's rollout simulation (3,000 and 30,000 nodes, and on the real
    /// API server).
    Fleet(Opts),
    /// (4, fan-out) The rollout simulation staging through one capped link, without and
    /// with `spec.staging.maxConcurrent`.
    Fanout(Opts),
    /// Everything; prints one table and writes docs/benchmarks.md.
    All(Opts),
    /// Internal: one fetch with the agent's fetcher; prints seconds and peak RSS (KiB).
    #[command(hide = true)]
    FetchOne {
        /// The URL.
        #[arg(long)]
        url: String,
        /// Expected sha256.
        #[arg(long)]
        sha256: String,
        /// Expected size in bytes.
        #[arg(long)]
        size: u64,
        /// Target directory.
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let multi_thread = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    };
    match cli.command {
        // The fetcher runs the way the agent runs it: every task on one thread, hashing and
        // writing on the blocking pool (agent/src/main.rs).
        Command::FetchOne {
            url,
            sha256,
            size,
            dir,
        } => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(download::fetch_one(&url, &sha256, size, &dir)),
        Command::Download(o) => {
            let rows = multi_thread()?.block_on(download::run(&o.effective()))?;
            report::print_table(&rows);
            Ok(())
        }
        Command::Node(o) => {
            let rows = multi_thread()?.block_on(node::run(&o.effective()))?;
            report::print_table(&rows);
            Ok(())
        }
        Command::RealNode(o) => {
            let rows = multi_thread()?.block_on(real_node::run(&o.effective()))?;
            report::print_table(&rows);
            Ok(())
        }
        Command::Fleet(o) => {
            let rows = multi_thread()?.block_on(fleet::run(&o.effective()))?;
            report::print_table(&rows);
            Ok(())
        }
        Command::Fanout(o) => {
            let rows = multi_thread()?.block_on(fanout::run(&o.effective()))?;
            report::print_table(&rows);
            Ok(())
        }
        Command::All(o) => {
            let o = o.effective();
            let rt = multi_thread()?;
            let mut rows = Vec::new();
            let mut notes = Vec::new();
            let load_before = machine::load_average();
            for (name, result) in [
                ("download", rt.block_on(download::run(&o))),
                ("node", rt.block_on(node::run(&o))),
                ("real node", rt.block_on(real_node::run(&o))),
                ("fleet", rt.block_on(fleet::run(&o))),
                ("fan-out", rt.block_on(fanout::run(&o))),
            ] {
                match result {
                    Ok(r) => rows.extend(r),
                    Err(e) => {
                        eprintln!("{name}: failed: {e:#}");
                        notes.push(format!(
                            "The `{name}` measurement failed in this run: {e:#}"
                        ));
                    }
                }
            }
            report::print_table(&rows);
            let out = report::repo_path(&o.out);
            report::write_markdown(&out, &o, &rows, &notes, &load_before)?;
            eprintln!("wrote {}", out.display());
            Ok(())
        }
    }
}
