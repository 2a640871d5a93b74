//! `--broken-v3`: the kubelet release that cannot start and halts the rollout.

use std::time::Duration;

use anyhow::{Context as _, bail};
use inplace_proto::{NodeRelease, NodeRollout, Phase};
use inplace_tests::kube_node::wait_node_ready;
use inplace_tests::sysext::{SysextImage, kubernetes_image_file_name};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubectl_inplace::render;
use serde_json::json;

use crate::concurrency::Concurrency;
use crate::fleet::{BROKEN_HEALTH_TIMEOUT, BROKEN_RELEASE, Demo, ROLLOUT, V2, step};
use crate::follow::{Ending, Stage, follow, print_limits, the_halt};
use crate::kubelet::release;
use crate::nodes::node_sh;
use crate::workload::Containers;

/// `--broken-v3`: points the rollout at a release whose kubelet cannot start (v2's kubelet,
/// its drop-in passing a flag the kubelet refuses), with `maxFailures: 0`. The first node
/// granted a slot fails its health check and rolls back to v2; the rollout halts naming it;
/// every other node stays staged on v2, never activated; every Pod keeps its container.
/// Fails unless exactly that is what the cluster and the nodes show.
pub(crate) async fn roll_out_broken_v3(
    demo: &Demo<'_>,
    image: &SysextImage,
    limits: &Concurrency,
    workload: &Containers,
) -> anyhow::Result<()> {
    let (client, members, fleet) = (demo.client, demo.members, demo.fleet);
    let releases: Api<NodeRelease> = Api::all(client.clone());
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    releases
        .create(
            &PostParams::default(),
            &release(demo, BROKEN_RELEASE, V2, image, BROKEN_HEALTH_TIMEOUT)?,
        )
        .await
        .with_context(|| format!("creating NodeRelease {BROKEN_RELEASE}"))?;
    step(&format!(
        "rolling out a broken kubelet (its drop-in passes a flag the kubelet refuses): NodeRollout {ROLLOUT} → release {BROKEN_RELEASE}, maxFailures 0"
    ));
    rollouts
        .patch(
            ROLLOUT,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"release": BROKEN_RELEASE, "maxFailures": 0}})),
        )
        .await
        .with_context(|| format!("pointing the rollout at {BROKEN_RELEASE}"))?;
    let stage = Stage {
        rollout: ROLLOUT,
        release: BROKEN_RELEASE,
        seen: None,
        limits: Some(limits),
        ends: Ending::Halted,
    };
    follow(demo.watch, &stage, members, demo.style, demo.tty, fleet).await?;

    let (rollout, plans) = demo.watch.snapshot(ROLLOUT);
    let (failure, halt) = the_halt(rollout.as_ref())?;
    let link_v2 = format!(
        "/opt/extensions/kubernetes/{}",
        kubernetes_image_file_name(V2)
    );
    println!(
        "\n{}",
        if demo.style.color {
            "\x1b[1mBroken release\x1b[0m"
        } else {
            "Broken release"
        }
    );
    println!(
        "  {BROKEN_RELEASE} ({V2}'s kubelet, its drop-in passing a flag the kubelet refuses), maxFailures 0"
    );
    for m in members {
        let plan = plans
            .iter()
            .find(|p| {
                p.metadata.name.as_deref() == Some(m.name.as_str())
                    && p.spec.release.as_deref() == Some(BROKEN_RELEASE)
            })
            .with_context(|| format!("{} has no plan for {BROKEN_RELEASE}", m.name))?;
        let phase = render::effective_phase(plan);
        let back = wait_node_ready(client, &m.name, Some(V2), Duration::from_secs(60)).await;
        let link = node_sh(fleet, &m.name, "readlink /etc/extensions/kubernetes.raw").await?;
        if back.is_err() || link.trim() != link_v2 {
            bail!(
                "{}: expected back on {V2}: {back:?}, the sysext link is {}",
                m.name,
                link.trim()
            );
        }
        let what = if m.name == failure.node {
            if phase != Phase::RolledBack {
                bail!("{} failed but its plan shows {phase:?}", m.name);
            }
            format!(
                "RolledBack  reason {}: {}; the Node is Ready on {V2} again",
                failure.reason, failure.message
            )
        } else {
            if plan.spec.desired_state != inplace_proto::DesiredState::Staged {
                bail!("{} was activated after the rollout halted", m.name);
            }
            format!("{phase:?}, never activated; the Node is Ready on {V2}")
        };
        println!("  {:<10} {what}", m.name);
    }
    println!("  rollout Halted=True {}: {}", halt.reason, halt.message);
    println!("  the Pods kept their containers:");
    crate::workload::check_kept(demo, workload).await?;
    print_limits(limits);
    Ok(())
}
