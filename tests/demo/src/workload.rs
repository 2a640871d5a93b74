//! The workload the update must not disturb: a Deployment with one Pod on every node (the
//! locally imported image, `hostNetwork`) and a PodDisruptionBudget, in a namespace of the
//! demo's own; and the proof that every Pod kept its container through the update (the same
//! container ID, start time and process, as the API server and the node's containerd report
//! them).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use inplace_tests::kube_node::workload::{
    RunningContainer, Spread, containers_of, pod_listing_args, web_manifest,
};
use inplace_tests::nspawn::Node;

use crate::fleet::{Demo, PATIENCE, step};
use crate::nodes::node_sh;

/// The namespace the demo's workload runs in (removed with it on an existing cluster).
pub(crate) const WORKLOAD_NAMESPACE: &str = "inplace-demo";
const SELECTOR: &str = "app=web";

/// The running containers, by Pod name.
pub(crate) type Containers = BTreeMap<String, RunningContainer>;

/// Runs the workload, one Pod on every node, and waits until each Pod's container runs;
/// shows `kubectl get nodes` and the Pods.
pub(crate) async fn start(demo: &Demo<'_>) -> anyhow::Result<Containers> {
    step(&format!(
        "running a workload: Deployment {WORKLOAD_NAMESPACE}/web, one Pod on every node, with a PodDisruptionBudget"
    ));
    let manifest = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {WORKLOAD_NAMESPACE}\n---\n{}",
        web_manifest(WORKLOAD_NAMESPACE, demo.members.len(), Spread::OnePerNode)
    );
    let path = demo.work.join("workload.yaml");
    std::fs::write(&path, manifest).with_context(|| format!("writing {}", path.display()))?;
    kubectl(
        demo.kubeconfig,
        &["apply", "-f", &path.display().to_string()],
    )?;
    let started = Instant::now();
    let running = loop {
        match snapshot(demo).await {
            Ok(running) if running.len() == demo.members.len() => break running,
            Ok(_) | Err(_) if started.elapsed() < PATIENCE => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(running) => bail!("only {} of the Pods run: {running:?}", running.len()),
            Err(e) => return Err(e),
        }
    };
    show(demo, "kubectl get nodes")?;
    show(
        demo,
        &format!("kubectl get pods -n {WORKLOAD_NAMESPACE} -o wide"),
    )?;
    Ok(running)
}

/// The workload's containers now.
pub(crate) async fn snapshot(demo: &Demo<'_>) -> anyhow::Result<Containers> {
    let listing = kubectl(
        demo.kubeconfig,
        &pod_listing_args(WORKLOAD_NAMESPACE, SELECTOR),
    )?;
    let fleet: &Arc<Mutex<Vec<Node>>> = demo.fleet;
    Ok(containers_of(&listing, |node| async move {
        node_sh(fleet, &node, "ctr -n k8s.io tasks ls")
            .await
            .map_err(|e| inplace_tests::Error::Invalid(format!("{e:#}")))
    })
    .await?)
}

/// Fails unless every Pod of `before` still runs the same container (ID, start time,
/// process, no restart) and no Pod was replaced; prints one line per Pod.
pub(crate) async fn check_kept(demo: &Demo<'_>, before: &Containers) -> anyhow::Result<()> {
    let after = snapshot(demo).await?;
    for (pod, was) in before {
        let Some(now) = after.get(pod) else {
            bail!("Pod {pod} is gone (was on {}): {after:?}", was.node);
        };
        if now != was {
            bail!("Pod {pod} did not keep its container: before {was:?}, after {now:?}");
        }
        print_kept(pod, now);
    }
    if after.len() != before.len() {
        bail!("the Pods changed: before {before:?}, after {after:?}");
    }
    Ok(())
}

/// The line that says `pod` kept its container `now`.
pub(crate) fn print_kept(pod: &str, now: &RunningContainer) {
    println!(
        "    {pod} on {}: container {} started {}, pid {}, restarts {}: kept",
        now.node,
        &now.id[..12.min(now.id.len())],
        now.started_at,
        now.pid,
        now.restarts
    );
}

/// Prints `command` (kubectl as the admin) and what it prints, indented.
pub(crate) fn show(demo: &Demo<'_>, command: &str) -> anyhow::Result<()> {
    show_with(demo.kubeconfig, command)
}

/// [`show`] with the admin's `kubeconfig`.
pub(crate) fn show_with(kubeconfig: &Path, command: &str) -> anyhow::Result<()> {
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let out = kubectl(kubeconfig, &args)?;
    println!("    $ {command}");
    for line in out.lines() {
        println!("      {line}");
    }
    Ok(())
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    tokio::task::block_in_place(|| inplace_tests::apiserver::run_kubectl(kubeconfig, args))
}
