//! (6) On real Kubernetes nodes (test bed 5): one node's kubelet swapped in place against the
//! same node rebooted and a machine replaced — the kubelet's `/healthz` and the Node's `Ready`
//! sampled every 100 ms, the Pods' containers compared through containerd.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use inplace_proto::Phase;
use inplace_tests::install::workspace_binaries;
use inplace_tests::kube_node::cluster::rollout_manifest;
use inplace_tests::kube_node::workload::{
    RunningContainer, Spread, running_containers, web_manifest,
};
use inplace_tests::kube_node::{self, ClusterOptions, KubeCluster, healthz_ok};

use crate::{Opts, Row};

const FROM: &str = "v1.36.1";
const TO: &str = "v1.36.3";
const PATIENCE: Duration = Duration::from_secs(600);

/// Gaps seen while sampling one node: the longest time `/healthz` was unanswered and the
/// longest time the Node was not `Ready` (as the API server had it).
#[derive(Debug, Default, Clone, Copy)]
struct Gaps {
    healthz: Duration,
    not_ready: Duration,
}

/// Samples `until` returns true, every 100 ms; the gaps on the way.
async fn sample_until(
    cluster: &KubeCluster,
    node: usize,
    mut until: impl AsyncFnMut() -> bool,
) -> Result<Gaps> {
    let client = cluster.client().await?;
    let (name, port) = (
        cluster.nodes[node].name().to_owned(),
        cluster.nodes[node].ports.healthz,
    );
    let (mut gaps, mut down_since, mut unready_since) = (Gaps::default(), None, None);
    let deadline = Instant::now() + PATIENCE;
    while !until().await {
        let now = Instant::now();
        anyhow::ensure!(
            now < deadline,
            "{name}: nothing happened within {PATIENCE:?}"
        );
        if healthz_ok(port).await {
            down_since = None;
        } else {
            let since = *down_since.get_or_insert(now);
            gaps.healthz = gaps.healthz.max(since.elapsed());
        }
        match kube_node::node_state(&client, &name).await? {
            Some((ready, _)) if ready == "True" => unready_since = None,
            _ => {
                let since = *unready_since.get_or_insert(now);
                gaps.not_ready = gaps.not_ready.max(since.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(gaps)
}

fn disrupted(
    before: &BTreeMap<String, RunningContainer>,
    after: &BTreeMap<String, RunningContainer>,
) -> usize {
    before
        .iter()
        .filter(|(pod, c)| after.get(*pod) != Some(c))
        .count()
}

fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// How to reproduce the in-place rows.
const REPRODUCE: &str = "cargo run -p inplace-tests --bin inplace-testbed -- cluster --dir DIR --nodes 1 --kubelet v1.36.1; docs/usage/quickstart.md § Update every kubelet in place";

/// The real-node rows.
pub async fn run(o: &Opts) -> Result<Vec<Row>> {
    let (agent, controller) = workspace_binaries().await?;
    let options = ClusterOptions {
        dir: o.dir.join("real-node"),
        nodes: 1,
        name_prefix: "bench-real".to_owned(),
        kubelet: FROM.to_owned(),
        agent: o.agent_bin.clone().unwrap_or(agent),
        controller: Some(controller),
        kubelet_path: None,
    };
    let _ = std::fs::remove_dir_all(&options.dir);
    let mut cluster = KubeCluster::start(&options, &|step| eprintln!("real node: {step}")).await?;
    cluster.apply("web", &web_manifest("default", 1, Spread::Preferred))?;
    cluster.kubectl(&["rollout", "status", "deployment/web", "--timeout=300s"])?;
    let client = cluster.client().await?;
    let name = cluster.nodes[0].name().to_owned();

    // In place: the rollout to TO, from the plan's activation to the Node Ready on TO.
    let before = running_containers(&cluster, "app=web").await?;
    cluster.apply("release", &cluster.release_manifest(TO)?)?;
    cluster.apply(
        "rollout",
        &rollout_manifest(&format!("kubelet-{TO}"), "None"),
    )?;
    let activated = async || {
        cluster
            .kubectl(&[
                "get",
                "nodeupdateplan",
                &name,
                "-o",
                "jsonpath={.spec.desiredState}",
            ])
            .is_ok_and(|s| s == "Active")
    };
    sample_until(&cluster, 0, activated).await?;
    let active_at = Instant::now();
    let ready_on_new = async || {
        matches!(kube_node::node_state(&client, &name).await,
            Ok(Some((ref r, ref v))) if r == "True" && v == TO)
    };
    let swap = sample_until(&cluster, 0, ready_on_new).await?;
    let active_to_ready = active_at.elapsed();
    cluster.wait_plans(Phase::Succeeded, PATIENCE).await?;
    let swap_disrupted = disrupted(&before, &running_containers(&cluster, "app=web").await?);

    // Rebooted: `systemctl reboot` in the node until the kubelet answers and the Pod runs again.
    let before = running_containers(&cluster, "app=web").await?;
    let started = Instant::now();
    cluster.nodes[0].node.reboot_and_wait().await?;
    let pod_back = async || {
        running_containers(&cluster, "app=web")
            .await
            .is_ok_and(|now| now.len() == before.len() && disrupted(&before, &now) == before.len())
    };
    let reboot = sample_until(&cluster, 0, pod_back).await?;
    let reboot_time = started.elapsed();

    // Replaced: a fresh node joins (boot to Ready), then the old one is drained until its Pod
    // runs on the new node.
    let started = Instant::now();
    let new = cluster.add_node("bench-new", TO).await?.name().to_owned();
    kube_node::wait_node_ready(&client, &new, Some(TO), PATIENCE).await?;
    let join = started.elapsed();
    let drain_started = Instant::now();
    cluster.kubectl(&["drain", &name, "--ignore-daemonsets", "--timeout=300s"])?;
    let moved = async || {
        running_containers(&cluster, "app=web")
            .await
            .is_ok_and(|now| now.values().all(|c| c.node == new) && !now.is_empty())
    };
    let deadline = Instant::now() + PATIENCE;
    while !moved().await {
        anyhow::ensure!(Instant::now() < deadline, "the Pod never ran on {new}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain = drain_started.elapsed();

    Ok(rows(&Measured {
        swap,
        active_to_ready,
        swap_disrupted,
        reboot,
        reboot_time,
        reboot_disrupted: before.len(),
        join,
        drain,
    }))
}

/// What [`run`] measured on its node.
struct Measured {
    swap: Gaps,
    active_to_ready: Duration,
    swap_disrupted: usize,
    reboot: Gaps,
    reboot_time: Duration,
    reboot_disrupted: usize,
    join: Duration,
    drain: Duration,
}

/// The rows of `m`, with the ratios to the in-place swap.
fn rows(m: &Measured) -> Vec<Row> {
    let Measured {
        swap,
        active_to_ready,
        swap_disrupted,
        reboot,
        reboot_time,
        reboot_disrupted,
        join,
        drain,
    } = m;
    let replace_time = *join + *drain;
    let in_place = active_to_ready.as_secs_f64().max(0.001);
    let ratio = |d: Duration| format!("{:.1}", d.as_secs_f64() / in_place);
    let reboot_how = "systemctl reboot in the node";
    let replace_how = "a new node, then kubectl drain NODE --ignore-daemonsets";
    let row = |name: &str, value: String, unit: &str, how: &str| {
        Row::reference("6 real node", name, value, unit, how)
    };
    vec![
        row(
            &format!("in-place kubelet swap {FROM} → {TO}: /healthz unanswered"),
            secs(swap.healthz),
            "s",
            REPRODUCE,
        ),
        row(
            "in-place kubelet swap: Node not Ready",
            secs(swap.not_ready),
            "s",
            REPRODUCE,
        ),
        row(
            "in-place kubelet swap: plan Active → Node Ready on the new kubelet",
            secs(*active_to_ready),
            "s",
            REPRODUCE,
        ),
        row(
            "in-place kubelet swap: Pods disrupted (containers changed)",
            swap_disrupted.to_string(),
            "Pods",
            REPRODUCE,
        )
        .target("0", *swap_disrupted == 0),
        row(
            "reboot: to the kubelet healthy and the Pod running again",
            secs(*reboot_time),
            "s",
            reboot_how,
        ),
        row(
            "reboot: /healthz unanswered / Node not Ready",
            format!("{} / {}", secs(reboot.healthz), secs(reboot.not_ready)),
            "s",
            reboot_how,
        ),
        row(
            "reboot: Pods disrupted",
            reboot_disrupted.to_string(),
            "Pods",
            reboot_how,
        ),
        row(
            "replace: a fresh node boot → Ready, then drain until the Pod runs on it",
            format!(
                "{} + {} = {}",
                secs(*join),
                secs(*drain),
                secs(replace_time)
            ),
            "s",
            replace_how,
        ),
        row(
            "reboot ÷ in-place (plan Active → Ready)",
            ratio(*reboot_time),
            "×",
            reboot_how,
        ),
        row(
            "replace ÷ in-place (plan Active → Ready)",
            ratio(replace_time),
            "×",
            replace_how,
        ),
    ]
}
