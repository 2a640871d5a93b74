//! `inplace-demo --cluster-api`: the in-place update driven by Cluster API's own controllers
//! on the bed `tests/tests/capi_machines.rs` proves it on ([`DeploymentBed`]): real-kubelet
//! nodes on v1.36.1, Cluster API's core manager (built from its Go module by `make capi`),
//! the extension registered through the shipped ExtensionConfig, the bed's infrastructure
//! provider and a MachineDeployment `workers` with a Machine on every node. The demo bumps
//! the MachineDeployment's version to v1.36.3 and tells what happens, then fails unless the
//! Machines kept their names and UIDs (none created), every Node runs the new kubelet, the
//! MachineDeployment rolled out and every Pod kept its container.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context as _, bail};
use inplace_tests::capi::deployment::{self, DeploymentBed, FROM, Release, TO};
use inplace_tests::capi::machines::{MachineWatch, identities};
use inplace_tests::kube_node::workload::{check_pods_kept, run_workload};

use crate::Args;
use crate::cluster_api_follow::Follow;
use crate::fleet::{step, until_ctrl_c, wait_unless_no_wait};
use crate::workload::{print_kept, show_with};

/// What a user types to bump the version (docs/usage/cluster-api.md's walk-through).
const BUMP_PATCH: &str = r#"{"spec":{"template":{"spec":{"version":"v1.36.3"}}}}"#;

/// Runs the Cluster API demo; every path out (success, error, Ctrl-C) cleans up.
pub async fn main(args: &Args) -> ExitCode {
    let mut bed = None;
    let code = until_ctrl_c(run(args, &mut bed)).await;
    println!(
        "\ncleaning up: stopping Cluster API's manager, the extension, the nodes and the control plane ..."
    );
    // Dropping the bed stops its processes, kills the nodes and removes their layers.
    drop(bed);
    println!("done.");
    code
}

async fn run(args: &Args, slot: &mut Option<DeploymentBed>) -> anyhow::Result<()> {
    let started = Instant::now();
    inplace_tests::prereq::require_root()?;
    inplace_tests::prereq::require_nspawn()?;
    inplace_tests::prereq::require_squashfs_tools()?;
    let nodes = usize::try_from(args.nodes)?;
    let work = args.work_dir.join("cluster-api");
    // The cluster's state is started afresh on every run.
    if work.exists() {
        std::fs::remove_dir_all(&work)
            .with_context(|| format!("removing the last run's {}", work.display()))?;
    }
    step(&format!(
        "booting {nodes} real-kubelet nodes on {FROM} and the cluster's control plane; starting \
         Cluster API's core manager (feature gates InPlaceUpdates, RuntimeSDK), the in-place \
         extension registered by packaging/kubernetes/capi/extensionconfig.yaml, and the \
         bed's infrastructure provider; applying a NodeRelease for {TO} and a Cluster with a \
         MachineDeployment `workers` of {nodes} Machines at {FROM}"
    ));
    let bed = slot.insert(
        DeploymentBed::start(&work, &args.name_prefix, nodes, Release::Working, &|s| {
            println!("    {s}")
        })
        .await?,
    );
    explain_roles();
    let kubeconfig = bed.cluster.admin_kubeconfig();
    show_with(&kubeconfig, "kubectl get machinedeployment workers")?;
    show_with(&kubeconfig, "kubectl get machines -o wide")?;

    step("a workload: the Deployment `web` with a PodDisruptionBudget, one Pod on every node");
    let containers = run_workload(&bed.cluster).await?;
    show_with(&kubeconfig, "kubectl get pods -o wide")?;

    let watch = MachineWatch::start(bed.cluster.client().await?);
    step("bumping the MachineDeployment's version, as a user does:");
    println!("    $ kubectl patch machinedeployment workers --type=merge -p '{BUMP_PATCH}'");
    bed.cluster.kubectl(&[
        "patch",
        "machinedeployment",
        "workers",
        "--type=merge",
        "-p",
        BUMP_PATCH,
    ])?;
    let bumped = Instant::now();
    Follow::new(bed).run().await?;
    println!(
        "    the MachineDeployment rolled out at {TO}, {:.0} s after the patch",
        bumped.elapsed().as_secs_f64()
    );
    show_with(&kubeconfig, "kubectl get machinedeployment workers")?;
    show_with(&kubeconfig, "kubectl get machines -o wide")?;
    show_with(&kubeconfig, "kubectl get nodes")?;

    step("checking what the update kept");
    same_machines(bed, &watch).await?;
    check_pods_kept(&bed.cluster, &containers, TO).await?;
    println!("    every Pod kept its container through the update:");
    for (pod, container) in &containers {
        print_kept(pod, container);
    }
    let seen = watch.seen();
    println!(
        "    most Machines updating at once: {} (the MachineDeployment's maxUnavailable: 1)",
        seen.most_updating
    );
    for (node, spell) in &seen.longest_not_ready {
        println!("    {node}: not Ready for {} ms at most", spell.as_millis());
    }
    println!(
        "    all done {:.0} s after the start",
        started.elapsed().as_secs_f64()
    );
    hints(&kubeconfig, bed);
    wait_unless_no_wait(args, "The cluster and Cluster API stay up while you look.").await;
    Ok(())
}

/// What is Cluster API's and what is the bed's, in the words of docs/usage/cluster-api.md.
fn explain_roles() {
    println!("    Cluster API's: the MachineDeployment, MachineSet and Machine controllers, the");
    println!("      Runtime SDK client that discovers the extension and calls its hooks");
    println!("    the bed's: the infrastructure and bootstrap provider (each Machine maps to a");
    println!("      node booted already) and one API server as management and workload cluster");
    println!("    inplace's: the extension (hooks) and the agent on every node");
}

/// Fails unless the Machines are the ones provisioned (names, UIDs, Nodes) and no other
/// Machine existed during the update; prints one line per Machine.
async fn same_machines(bed: &DeploymentBed, watch: &MachineWatch) -> anyhow::Result<()> {
    let all = deployment::machines(&bed.cluster)
        .await
        .map_err(anyhow::Error::msg)?;
    let now: Option<BTreeMap<String, (String, String)>> = identities(&all, bed.nodes);
    if now.as_ref() != Some(&bed.machines) {
        bail!(
            "the Machines changed: before {:?}, after {now:?}",
            bed.machines
        );
    }
    let uids: BTreeSet<String> = bed.machines.values().map(|(uid, _)| uid.clone()).collect();
    let seen = watch.seen().uids;
    if seen != uids {
        bail!("Machines were created or deleted during the update: {seen:?}, not {uids:?}");
    }
    for (name, (uid, node)) in &bed.machines {
        println!(
            "    Machine {name} (uid {uid}) on {node}: the same Machine, kubelet {FROM} -> {TO}"
        );
    }
    println!("    no Machine was created or deleted");
    Ok(())
}

/// Where to look while the demo waits.
fn hints(kubeconfig: &Path, bed: &DeploymentBed) {
    println!("\nLook around (in another shell, while this one waits):");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!(
        "  export PATH={}:$PATH   # the cluster's kubectl",
        inplace_tests::apiserver::bin_dir().display()
    );
    println!("  kubectl get cluster,machinedeployments,machinesets,machines -o wide");
    println!("  kubectl describe machines");
    println!("  kubectl get extensionconfig inplace -o yaml");
    println!("  kubectl get nodereleases,nodeupdateplans -o wide");
    println!("  kubectl get nodes,pods -o wide");
    if let Some(node) = bed.cluster.nodes.first() {
        println!(
            "  nsenter -t {} -a journalctl -u inplace-agent   # on {}",
            node.node.pid1(),
            node.name()
        );
    }
    println!(
        "  Cluster API's manager log: {}",
        bed.bed.manager.log_path().display()
    );
    println!(
        "  the extension's log: {}",
        bed.bed.extension.log_path().display()
    );
}
