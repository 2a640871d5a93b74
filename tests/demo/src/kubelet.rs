//! The kubelet rollout, the show: v2 one node at a time in a maintenance window, with its
//! proof (every Node on v2, every Pod's container kept) and summary.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use inplace_proto::{NodeRelease, NodeRollout};
use inplace_tests::fixtures::ReleaseFixture;
use inplace_tests::kube_node::wait_node_ready;
use inplace_tests::sysext::SysextImage;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cluster::DEMO_LABEL;
use crate::concurrency::Concurrency;
use crate::fleet::{Demo, FLEET_LABEL, HEALTH_TIMEOUT, MAX_UNAVAILABLE, ROLLOUT, V2, step};
use crate::follow::{Ending, Stage, follow, print_limits};
use crate::measure::{self, KubeletSeen};
use crate::nodes::node_sh;
use crate::report::summary;
use crate::workload::Containers;

/// Step 6: the show: release v2, one node at a time, cordoned while it swaps; then step 7, its
/// proof and summary. Returns the `maxUnavailable` watch, which the later steps keep checking.
pub(crate) async fn roll_out_v2(
    demo: &Demo<'_>,
    v2: &SysextImage,
    workload: &Containers,
    demo_started: Instant,
) -> anyhow::Result<Concurrency> {
    let (args, client, watch, members) = (demo.args, demo.client, demo.watch, demo.members);
    let (style, tty, fleet) = (demo.style, demo.tty, demo.fleet);
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    create_release(demo, "kubelet-v2", V2, v2).await?;
    step(&format!(
        "rolling out kubelet {V2}: NodeRollout {ROLLOUT} (release kubelet-v2, maxUnavailable {MAX_UNAVAILABLE}, disruption Cordon: the Pods stay), in a maintenance window opening a minute from now"
    ));
    let limits = Concurrency::start(client, &format!("{FLEET_LABEL}=true"));
    limits.listed().await?;
    let seen: BTreeMap<String, Arc<Mutex<KubeletSeen>>> = members
        .iter()
        .map(|m| (m.name.clone(), Arc::new(Mutex::new(KubeletSeen::default()))))
        .collect();
    let pollers: Vec<_> = members
        .iter()
        .map(|m| measure::poll_kubelet(client, m, Arc::clone(&seen[&m.name])))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (window, opens) = crate::window::opening_soon(k8s_openapi::jiff::Timestamp::now())?;
    let rollout: NodeRollout = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": ROLLOUT},
        "spec": {"release": "kubelet-v2", "nodeSelector": {"matchLabels": {FLEET_LABEL: "true"}},
                 "maxUnavailable": MAX_UNAVAILABLE, "maxFailures": 0, "disruption": "Cordon",
                 "maintenanceWindows": [window]},
    }))?;
    rollouts
        .create(&PostParams::default(), &rollout)
        .await
        .context("creating the NodeRollout")?;
    crate::window::show_the_hold(client, ROLLOUT, opens, style).await?;
    let mut rollout_v2 = Stage {
        rollout: ROLLOUT,
        release: "kubelet-v2",
        seen: Some(&seen),
        limits: Some(&limits),
        ends: Ending::AllStaged,
    };
    follow(watch, &rollout_v2, members, style, tty, fleet).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    if now < opens {
        let window = crate::window::open_now(now)?;
        println!(
            "    every node staged {V2}; rather than wait until {opens}, the demo moves the window to one open now:\n\
             \x20     kubectl patch noderollout {ROLLOUT} --type=merge -p '{{\"spec\":{{\"maintenanceWindows\":[{window}]}}}}'"
        );
        rollouts
            .patch(
                ROLLOUT,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"maintenanceWindows": [window]}})),
            )
            .await
            .context("opening the rollout's maintenance window")?;
    } else {
        println!("    the window opened at {opens} while the nodes were still staging {V2}");
    }
    // The rollout's time counts from the window's opening (staging went on before it).
    let rollout_started = Instant::now();
    rollout_v2.ends = Ending::AllSucceeded;
    let timings = follow(watch, &rollout_v2, members, style, tty, fleet).await?;
    let rollout_took = rollout_started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for p in pollers {
        p.abort();
    }

    // 7. Proof and summary.
    for m in members {
        wait_node_ready(client, &m.name, Some(V2), Duration::from_secs(60)).await?;
    }
    crate::workload::show(demo, "kubectl get nodes")?;
    println!("    every Pod kept its container through the update:");
    crate::workload::check_kept(demo, workload).await?;
    let mut rows = Vec::new();
    for m in members {
        let show = node_sh(
            fleet,
            &m.name,
            "systemctl show kubelet.service -p ActiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic -p NRestarts; readlink /etc/extensions/kubernetes.raw",
        )
        .await?;
        let restart = measure::parse_unit_restart(&show);
        let link = show.lines().last().unwrap_or("").trim().to_owned();
        let seen = seen[&m.name].lock().map(|s| s.clone()).unwrap_or_default();
        rows.push((
            m.clone(),
            timings.get(&m.name).copied(),
            seen,
            restart,
            link,
        ));
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
    let value = release(demo, name, version, image, HEALTH_TIMEOUT)?;
    Api::<NodeRelease>::all(demo.client.clone())
        .create(&PostParams::default(), &value)
        .await
        .with_context(|| format!("creating NodeRelease {name}"))?;
    Ok(())
}

pub(crate) fn release(
    demo: &Demo<'_>,
    name: &str,
    version: &str,
    image: &SysextImage,
    timeout: &str,
) -> anyhow::Result<NodeRelease> {
    let url = demo.server.url(&crate::setup::image_path(image));
    ReleaseFixture::kubelet(name, version, version)
        .label(DEMO_LABEL, "true")
        .kubernetes_sysext(&url, &image.sha256, Some(image.size))
        // The real kubelet's own report: its Node Ready on the new version.
        .node_kubelet_version()
        .node_ready()
        .checked_for(&format!("{}s", demo.args.health_window), timeout)
        .object()
        .with_context(|| format!("NodeRelease {name}"))
}
