//! `--agent-update`: the agent updating itself across the fleet, as
//! docs/usage/agent-updates.md says. Agent v2 through a NodeRelease with `spec.agent` and a
//! NodeRollout (one node at a time), then an agent v3 that exits 1 at start with
//! `maxFailures: 0`: the first node's guard restores v2 after `confirm_timeout`, its plan ends
//! `RolledBack` (`AgentNotConfirmed`), the rollout halts, the other nodes are never touched.
//! The kubelets are never restarted by any of it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use inplace_proto::{DesiredState, NodeRelease, NodeRollout, Phase};
use inplace_tests::agent_images::{Behaviour, ReleaseKey, agent_image, next_version, sha256_hex};
use inplace_tests::artifact_server::{Artifact, ArtifactServer};
use inplace_tests::nspawn::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kubectl_inplace::render::{self, Style};
use serde_json::json;

use crate::cluster::DEMO_LABEL;
use crate::concurrency::Concurrency;
use crate::fleet::{FLEET_LABEL, Member, PATIENCE, ROLLOUT, step};
use crate::follow::{Ending, Stage, Watch, follow, print_limits, the_halt};
use crate::nodes::node_sh;

/// The NodeRollout of the agent updates.
pub(crate) const AGENT_ROLLOUT: &str = "agent";
/// How long a new agent has to confirm itself before the guard restores the previous one
/// (the nodes' `[self_update] confirm_timeout`): short, so that the broken v3 halts soon.
pub(crate) const CONFIRM_TIMEOUT: &str = "20s";

/// The agent versions of `--agent-update`: v1 is the installed agent's own version, v2 is
/// `next_version(v1, 2)` from `--agent-bin-dir`, v3 (`next_version(v1, 3)`) is a script that
/// exits 1.
pub(crate) struct AgentVersions {
    pub(crate) v1: String,
    pub(crate) v2: String,
    pub(crate) v3: String,
    pub(crate) v2_binary: PathBuf,
}

/// The version `agent` reports (`inplace-agent --version`).
pub(crate) fn agent_version(agent: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new(agent)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", agent.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .nth(1)
        .map(str::to_owned)
        .with_context(|| format!("{} --version printed {text:?}", agent.display()))
}

/// The versions of `--agent-update`, with v2's binary found in `bin_dir`.
pub(crate) fn agent_versions(agent: &Path, bin_dir: &Path) -> anyhow::Result<AgentVersions> {
    let v1 = agent_version(agent)?;
    let v2 = next_version(&v1, 2);
    let v2_binary = bin_dir.join(format!("inplace-agent-{v2}"));
    if !v2_binary.is_file() {
        bail!(
            "--agent-bin-dir: {} not found: build it first (scripts/demo.sh --agent-update runs `INPLACE_AGENT_VERSION={v2} cargo build --release -p inplace-agent --target-dir target/agent-versions`)",
            v2_binary.display()
        );
    }
    let found = agent_version(&v2_binary)?;
    if found != v2 {
        bail!("{} reports {found}, not {v2}", v2_binary.display());
    }
    Ok(AgentVersions {
        v3: next_version(&v1, 3),
        v1,
        v2,
        v2_binary,
    })
}

/// What the agent rollouts need from the demo's setup.
pub(crate) struct AgentUpdate<'a> {
    pub(crate) client: &'a kube::Client,
    pub(crate) server: &'a ArtifactServer,
    pub(crate) watch: &'a Watch,
    pub(crate) key: &'a ReleaseKey,
    pub(crate) versions: &'a AgentVersions,
    pub(crate) images: PathBuf,
}

/// The whole step: v2 everywhere, then the broken v3 that halts. Fails unless the cluster
/// and the nodes show exactly what the module's comment says.
pub(crate) async fn roll_out_agents(
    update: &AgentUpdate<'_>,
    members: &[Member],
    style: &Style,
    tty: bool,
    fleet: &Arc<Mutex<Vec<Node>>>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let kubelets = kubelet_starts(fleet, members).await?;
    hand_over(update.client).await?;
    let versions = update.versions;
    let v2_image = agent_image(
        Behaviour::Works,
        &versions.v2_binary,
        &versions.v2,
        &update.images.join("agent-v2"),
        "",
    )?;
    let v2_release = publish(update, &v2_image, &versions.v2).await?;
    step(&format!(
        "updating the agent {} → {}: NodeRelease {v2_release} (spec.agent, signed), NodeRollout {AGENT_ROLLOUT}, maxUnavailable 1, maxFailures 0",
        versions.v1, versions.v2
    ));
    let rollout: NodeRollout = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": AGENT_ROLLOUT},
        "spec": {"release": v2_release, "nodeSelector": {"matchLabels": {FLEET_LABEL: "true"}},
                 "maxUnavailable": 1, "maxFailures": 0},
    }))?;
    let rollouts: Api<NodeRollout> = Api::all(update.client.clone());
    rollouts
        .create(&PostParams::default(), &rollout)
        .await
        .context("creating the agent's NodeRollout")?;
    let limits = Concurrency::start(update.client, &format!("{FLEET_LABEL}=true"));
    limits.listed().await?;
    let stage = Stage {
        rollout: AGENT_ROLLOUT,
        release: &v2_release,
        seen: None,
        limits: Some(&limits),
        ends: Ending::AllSucceeded,
    };
    follow(update.watch, &stage, members, style, tty, fleet).await?;
    println!("\n{}", bold("Agent update", style));
    for m in members {
        let running = running_agent(fleet, &m.name, &kubelets).await?;
        if running != versions.v2 {
            bail!(
                "{}: the agent runs {running}, expected {}",
                m.name,
                versions.v2
            );
        }
        println!(
            "  {:<10} Succeeded  agent {running}; the kubelet never restarted",
            m.name
        );
    }
    roll_out_broken_agent(update, members, style, tty, fleet, &kubelets, &limits).await?;
    println!(
        "  agent update and broken agent: {}",
        render::human_duration(started.elapsed())
    );
    Ok(())
}

/// The agent v3 that exits 1 at start, with `maxFailures: 0`.
async fn roll_out_broken_agent(
    update: &AgentUpdate<'_>,
    members: &[Member],
    style: &Style,
    tty: bool,
    fleet: &Arc<Mutex<Vec<Node>>>,
    kubelets: &BTreeMap<String, String>,
    limits: &Concurrency,
) -> anyhow::Result<()> {
    let versions = update.versions;
    let image = agent_image(
        Behaviour::ExitsAtStart,
        &versions.v2_binary,
        &versions.v3,
        &update.images.join("agent-v3"),
        "",
    )?;
    let release = publish(update, &image, &versions.v3).await?;
    step(&format!(
        "rolling out a broken agent {} (exits 1 at start): NodeRollout {AGENT_ROLLOUT} → release {release}, maxFailures 0; the guard restores the previous agent after confirm_timeout ({CONFIRM_TIMEOUT})",
        versions.v3
    ));
    Api::<NodeRollout>::all(update.client.clone())
        .patch(
            AGENT_ROLLOUT,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"release": release, "maxFailures": 0}})),
        )
        .await
        .context("pointing the agent's rollout at the broken agent")?;
    let stage = Stage {
        rollout: AGENT_ROLLOUT,
        release: &release,
        seen: None,
        limits: Some(limits),
        ends: Ending::Halted,
    };
    follow(update.watch, &stage, members, style, tty, fleet).await?;
    let (rollout, plans) = update.watch.snapshot(AGENT_ROLLOUT);
    let (failure, halt) = the_halt(rollout.as_ref())?;
    println!("\n{}", bold("Broken agent", style));
    println!(
        "  {release} ({}: the agent exits 1 at start), maxFailures 0",
        versions.v3
    );
    for m in members {
        let plan = plans
            .iter()
            .find(|p| {
                p.metadata.name.as_deref() == Some(m.name.as_str())
                    && p.spec.release.as_deref() == Some(release.as_str())
            })
            .with_context(|| format!("{} has no plan for {release}", m.name))?;
        let running = running_agent(fleet, &m.name, kubelets).await?;
        if running != versions.v2 {
            bail!(
                "{}: the agent runs {running}, expected {}",
                m.name,
                versions.v2
            );
        }
        let what = if m.name == failure.node {
            let phase = render::effective_phase(plan);
            let message = render::ready_summary(plan);
            if phase != Phase::RolledBack || !message.contains("AgentNotConfirmed") {
                bail!("{} failed but its plan shows {phase:?}: {message}", m.name);
            }
            format!("RolledBack  AgentNotConfirmed; the guard restored agent {running}")
        } else {
            if plan.spec.desired_state != DesiredState::Staged {
                bail!("{} was activated after the rollout halted", m.name);
            }
            format!("Staged, never activated; agent {running}")
        };
        println!("  {:<10} {what}; the kubelet never restarted", m.name);
    }
    println!("  rollout Halted=True {}: {}", halt.reason, halt.message);
    print_limits(limits);
    Ok(())
}

/// Deletes the kubelet rollout and waits until it is gone: a node has one owner, and the
/// agent's rollout takes the nodes over (docs/design/controller.md, Ownership).
async fn hand_over(client: &kube::Client) -> anyhow::Result<()> {
    step(&format!(
        "handing the nodes over: deleting NodeRollout {ROLLOUT} (the nodes keep what they run)"
    ));
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    rollouts
        .delete(ROLLOUT, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting NodeRollout {ROLLOUT}"))?;
    let deadline = Instant::now() + PATIENCE;
    while rollouts.get_opt(ROLLOUT).await?.is_some() {
        if Instant::now() > deadline {
            bail!("NodeRollout {ROLLOUT} was not gone within {PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}

/// Signs `image` for `version`, serves it and its signature, and creates the NodeRelease
/// `agent-<version>` that names it; returns the release's name.
async fn publish(update: &AgentUpdate<'_>, image: &Path, version: &str) -> anyhow::Result<String> {
    let file = image
        .file_name()
        .and_then(|n| n.to_str())
        .context("the agent image's name")?;
    let signature = update.key.sign(image, version)?;
    update
        .server
        .put(&format!("/agent/{file}"), Artifact::file(image)?);
    update.server.put(
        &format!("/agent/{file}.minisig"),
        Artifact::file(&signature)?,
    );
    let bytes = std::fs::read(image).with_context(|| format!("reading {}", image.display()))?;
    let name = format!("agent-{version}");
    let release: NodeRelease = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
        "metadata": {"name": name, "labels": {DEMO_LABEL: "true"}},
        "spec": {
            "version": version,
            "agent": {"version": version, "url": update.server.url(&format!("/agent/{file}")),
                      "sha256": sha256_hex(&bytes), "size": bytes.len(),
                      "signatureUrl": update.server.url(&format!("/agent/{file}.minisig"))},
        }
    }))?;
    Api::<NodeRelease>::all(update.client.clone())
        .create(&PostParams::default(), &release)
        .await
        .with_context(|| format!("creating NodeRelease {name}"))?;
    Ok(name)
}

/// When each node's kubelet main process started (µs since boot): unchanged means never
/// restarted.
async fn kubelet_starts(
    fleet: &Arc<Mutex<Vec<Node>>>,
    members: &[Member],
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut starts = BTreeMap::new();
    for m in members {
        starts.insert(m.name.clone(), kubelet_start(fleet, &m.name).await?);
    }
    Ok(starts)
}

async fn kubelet_start(fleet: &Arc<Mutex<Vec<Node>>>, name: &str) -> anyhow::Result<String> {
    let shown = node_sh(
        fleet,
        name,
        "systemctl show -p ExecMainStartTimestampMonotonic kubelet.service",
    )
    .await?;
    Ok(shown.trim().to_owned())
}

/// The version of the agent `name` runs, once its unit is active again; fails if the
/// node's kubelet was restarted since `kubelets` was taken.
async fn running_agent(
    fleet: &Arc<Mutex<Vec<Node>>>,
    name: &str,
    kubelets: &BTreeMap<String, String>,
) -> anyhow::Result<String> {
    let now = kubelet_start(fleet, name).await?;
    if kubelets.get(name) != Some(&now) {
        bail!(
            "{name}: the kubelet was restarted ({:?} → {now})",
            kubelets.get(name)
        );
    }
    crate::nodes::wait_agent(fleet, name).await?;
    let version = node_sh(fleet, name, "inplace-agent --version").await?;
    Ok(version
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned())
}

fn bold(text: &str, style: &Style) -> String {
    if style.color {
        format!("\x1b[1m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}
