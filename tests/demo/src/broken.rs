//! `--broken-v3`: the crash-looping kubelet release that halts the rollout.

use std::sync::{Arc, Mutex};

use anyhow::{Context as _, bail};
use inplace_proto::{NodeRelease, NodeRollout, Phase};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::nspawn::Node;
use inplace_tests::sysext::{SysextImage, kubernetes_image_file_name};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubectl_inplace::view::{self, Style};
use serde_json::json;

use crate::Args;
use crate::concurrency::Concurrency;
use crate::fleet::{BROKEN_HEALTH_TIMEOUT, Member, ROLLOUT, V2, V3, step};
use crate::follow::{Ending, Stage, Watch, follow, print_limits, the_halt};
use crate::kubelet::release;
use crate::measure;
use crate::nodes::node_sh;

/// What the broken rollout needs from the demo's setup.
pub(crate) struct Broken<'a> {
    pub(crate) client: &'a kube::Client,
    pub(crate) server: &'a ArtifactServer,
    pub(crate) image: &'a SysextImage,
    pub(crate) watch: &'a Watch,
    pub(crate) limits: &'a Concurrency,
}

/// `--broken-v3`: points the rollout at a release whose kubelet crash-loops, with
/// `maxFailures: 0`. The first node granted a slot fails its health check and rolls back to
/// v2; the rollout halts naming it; every other node stays staged on v2, never activated.
/// Fails unless exactly that is what the cluster and the nodes show.
pub(crate) async fn roll_out_broken_v3(
    broken: &Broken<'_>,
    members: &[Member],
    style: &Style,
    tty: bool,
    fleet: &Arc<Mutex<Vec<Node>>>,
    args: &Args,
) -> anyhow::Result<()> {
    let releases: Api<NodeRelease> = Api::all(broken.client.clone());
    let rollouts: Api<NodeRollout> = Api::all(broken.client.clone());
    releases
        .create(
            &PostParams::default(),
            &release(
                broken.server,
                "kubelet-v3",
                V3,
                broken.image,
                BROKEN_HEALTH_TIMEOUT,
                args,
            )?,
        )
        .await
        .context("creating NodeRelease kubelet-v3")?;
    step(&format!(
        "rolling out a broken kubelet {V3} (it crash-loops): NodeRollout {ROLLOUT} → release kubelet-v3, maxFailures 0"
    ));
    rollouts
        .patch(
            ROLLOUT,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"release": "kubelet-v3", "maxFailures": 0}})),
        )
        .await
        .context("pointing the rollout at kubelet-v3")?;
    let stage = Stage {
        rollout: ROLLOUT,
        release: "kubelet-v3",
        seen: None,
        limits: Some(broken.limits),
        ends: Ending::Halted,
    };
    follow(broken.watch, &stage, members, style, tty, fleet).await?;

    let (rollout, plans) = broken.watch.snapshot(ROLLOUT);
    let (failure, halt) = the_halt(rollout.as_ref())?;
    let link_v2 = format!(
        "/opt/extensions/kubernetes/{}",
        kubernetes_image_file_name(V2)
    );
    println!(
        "\n{}",
        if style.color {
            "\x1b[1mBroken release\x1b[0m"
        } else {
            "Broken release"
        }
    );
    println!(
        "  kubelet-v3 ({V3}: its kubelet exits half a second after every start), maxFailures 0"
    );
    for m in members {
        let plan = plans
            .iter()
            .find(|p| {
                p.metadata.name.as_deref() == Some(m.name.as_str())
                    && p.spec.release.as_deref() == Some("kubelet-v3")
            })
            .with_context(|| format!("{} has no plan for kubelet-v3", m.name))?;
        let phase = view::effective_phase(plan);
        let answer = measure::kubelet_version(m.port).await;
        let link = node_sh(fleet, &m.name, "readlink /etc/extensions/kubernetes.raw").await?;
        if answer.as_deref() != Some(V2) || link.trim() != link_v2 {
            bail!(
                "{}: expected back on {V2}, the kubelet answers {answer:?} and the sysext link is {}",
                m.name,
                link.trim()
            );
        }
        let what = if m.name == failure.node {
            if phase != Phase::RolledBack {
                bail!("{} failed but its plan shows {phase:?}", m.name);
            }
            format!(
                "RolledBack  reason {}: {}; the kubelet answers {V2} again",
                failure.reason, failure.message
            )
        } else {
            if plan.spec.desired_state != inplace_proto::DesiredState::Staged {
                bail!("{} was activated after the rollout halted", m.name);
            }
            format!("{phase:?}, never activated; the kubelet answers {V2}")
        };
        println!("  {:<10} {what}", m.name);
    }
    println!("  rollout Halted=True {}: {}", halt.reason, halt.message);
    print_limits(broken.limits);
    Ok(())
}
