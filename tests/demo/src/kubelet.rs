//! The kubelet rollouts: the fleet brought to v1, then the show, v2 one node at a time in a
//! maintenance window, with its proof and summary.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use inplace_proto::{NodeRelease, NodeRollout};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::sysext::{SysextImage, kubernetes_image_file_name};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::Args;
use crate::cluster::DEMO_LABEL;
use crate::concurrency::Concurrency;
use crate::fleet::{Demo, FLEET_LABEL, HEALTH_TIMEOUT, MAX_UNAVAILABLE, ROLLOUT, V1, V2, step};
use crate::follow::{Ending, Stage, follow, print_limits};
use crate::measure::{self, KubeletSeen};
use crate::nodes::node_sh;
use crate::report::summary;

/// Step 5: the fleet at v1: a release and a rollout that activates every node at once.
pub(crate) async fn set_up_v1(demo: &Demo<'_>, v1: &SysextImage) -> anyhow::Result<()> {
    let (client, watch, members) = (demo.client, demo.watch, demo.members);
    let (style, tty, fleet) = (demo.style, demo.tty, demo.fleet);
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    create_release(demo, "kubelet-v1", V1, v1).await?;
    step(&format!(
        "bringing the fleet to kubelet {V1} (setup: NodeRollout {ROLLOUT}, release kubelet-v1, all nodes at once)"
    ));
    let rollout_v1: NodeRollout = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": ROLLOUT},
        "spec": {"release": "kubelet-v1", "nodeSelector": {"matchLabels": {FLEET_LABEL: "true"}},
                 "maxUnavailable": "100%", "maxFailures": 0, "disruption": "None"},
    }))?;
    rollouts
        .create(&PostParams::default(), &rollout_v1)
        .await
        .context("creating the NodeRollout")?;
    let setup = Stage {
        rollout: ROLLOUT,
        release: "kubelet-v1",
        seen: None,
        limits: None,
        ends: Ending::AllSucceeded,
    };
    follow(watch, &setup, members, style, tty, fleet).await?;
    for m in members {
        let v = measure::kubelet_version(m.port).await;
        if v.as_deref() != Some(V1) {
            bail!("{}: the kubelet answers {v:?}, expected {V1}", m.name);
        }
    }
    println!("    every kubelet answers {V1}");

    Ok(())
}

/// Step 6: the show: release v2, one node at a time, cordoned while it swaps; then step 7, its
/// proof and summary. Returns the `maxUnavailable` watch, which the later steps keep checking.
pub(crate) async fn roll_out_v2(
    demo: &Demo<'_>,
    v2: &SysextImage,
    demo_started: Instant,
) -> anyhow::Result<Concurrency> {
    let (args, client, watch, members) = (demo.args, demo.client, demo.watch, demo.members);
    let (style, tty, fleet) = (demo.style, demo.tty, demo.fleet);
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    create_release(demo, "kubelet-v2", V2, v2).await?;
    step(&format!(
        "rolling out kubelet {V2}: NodeRollout {ROLLOUT} → release kubelet-v2, maxUnavailable {MAX_UNAVAILABLE}, disruption Cordon, in a maintenance window opening a minute from now"
    ));
    let limits = Concurrency::start(client, &format!("{FLEET_LABEL}=true"));
    limits.listed().await?;
    let seen: BTreeMap<String, Arc<Mutex<KubeletSeen>>> = members
        .iter()
        .map(|m| (m.name.clone(), Arc::new(Mutex::new(KubeletSeen::default()))))
        .collect();
    let pollers: Vec<_> = members
        .iter()
        .map(|m| measure::poll_kubelet(m.port, V1.into(), V2.into(), Arc::clone(&seen[&m.name])))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (window, opens) = crate::window::opening_soon(k8s_openapi::jiff::Timestamp::now())?;
    rollouts
        .patch(
            ROLLOUT,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"release": "kubelet-v2", "maxUnavailable": MAX_UNAVAILABLE, "disruption": "Cordon",
                                          "maintenanceWindows": [window]}})),
        )
        .await
        .context("pointing the rollout at kubelet-v2")?;
    crate::window::show_the_hold(client, ROLLOUT, opens, style).await?;
    // The rollout's time counts from the window's opening (staging goes on before it).
    let until_open = opens.duration_since(k8s_openapi::jiff::Timestamp::now());
    let rollout_started = Instant::now() + Duration::try_from(until_open).unwrap_or(Duration::ZERO);
    let rollout_v2 = Stage {
        rollout: ROLLOUT,
        release: "kubelet-v2",
        seen: Some(&seen),
        limits: Some(&limits),
        ends: Ending::AllSucceeded,
    };
    let timings = follow(watch, &rollout_v2, members, style, tty, fleet).await?;
    let rollout_took = rollout_started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for p in pollers {
        p.abort();
    }

    // 7. Proof and summary.
    let mut rows = Vec::new();
    for m in members {
        let answer = measure::kubelet_version(m.port).await;
        if answer.as_deref() != Some(V2) {
            bail!("{}: the kubelet answers {answer:?}, expected {V2}", m.name);
        }
        let show = node_sh(
            fleet,
            &m.name,
            "systemctl show kubelet.service -p ActiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic -p NRestarts; readlink /etc/extensions/kubernetes.raw",
        )
        .await?;
        let restart = measure::parse_unit_restart(&show);
        let link = show.lines().last().unwrap_or("").trim().to_owned();
        let gap = seen[&m.name].lock().ok().and_then(|s| s.swap_gap());
        rows.push((m.clone(), timings.get(&m.name).copied(), gap, restart, link));
    }
    summary(
        &rows,
        rollout_took,
        demo_started.elapsed(),
        args.health_window,
        style,
    );
    print_limits(&limits);
    Ok(limits)
}

/// Creates NodeRelease `name` of the kubelet `image` at `version`.
async fn create_release(
    demo: &Demo<'_>,
    name: &str,
    version: &str,
    image: &SysextImage,
) -> anyhow::Result<()> {
    let value = release(demo.server, name, version, image, HEALTH_TIMEOUT, demo.args)?;
    Api::<NodeRelease>::all(demo.client.clone())
        .create(&PostParams::default(), &value)
        .await
        .with_context(|| format!("creating NodeRelease {name}"))?;
    Ok(())
}

pub(crate) fn release(
    server: &ArtifactServer,
    name: &str,
    version: &str,
    image: &SysextImage,
    timeout: &str,
    args: &Args,
) -> anyhow::Result<NodeRelease> {
    let url = server.url(&format!(
        "/kubernetes/{}",
        kubernetes_image_file_name(version)
    ));
    let value = json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
        "metadata": {"name": name, "labels": {DEMO_LABEL: "true"}},
        "spec": {
            "version": version,
            "artifacts": [{"name": "kubernetes", "type": "Sysext", "url": url,
                           "sha256": image.sha256, "size": image.size}],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"units": ["kubelet.service"],
                             "window": format!("{}s", args.health_window), "timeout": timeout},
        }
    });
    serde_json::from_value(value).with_context(|| format!("NodeRelease {name}"))
}
