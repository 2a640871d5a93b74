//! The demo's setup, step by step: the cluster, the kubelet images and their server, the
//! nodes with the agent installed from its sysext image, the controller.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context as _, bail};
use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan};
use inplace_tests::apiserver::ApiServer;
use inplace_tests::artifact_server::{Artifact, ArtifactServer, Fault};
use inplace_tests::fake_kubelet::{CONFIG_PATH, FakeKubeletConfig};
use inplace_tests::nspawn::Node;
use inplace_tests::sysext::{SysextBuilder, SysextImage, kubernetes_image_file_name};
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, PostParams};
use kubectl_inplace::view;
use serde_json::json;

use crate::Args;
use crate::agent_update::AGENT_ROLLOUT;
use crate::cluster::Cluster;
use crate::fleet::{FLEET_LABEL, KUBELET_UNIT, Keep, Member, Paths, ROLLOUT, V1, V2, V3, step};
use crate::nodes::{AgentInstall, install_agent, kubelet_port, node_options, wait_agent};

/// Step 1: a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager of
/// the pinned release), or the existing cluster of --kubeconfig, with the CRDs, the
/// agent's RBAC and admission policy, the controller's RBAC, and an admin kubeconfig
/// for people.
pub(crate) async fn start_cluster(
    args: &Args,
    paths: &Paths,
    keep: &mut Keep,
) -> anyhow::Result<(kube::Client, PathBuf)> {
    let cluster = match &args.kubeconfig {
        Some(kubeconfig) => {
            step(&format!(
                "using the cluster of {} (the demo's objects are removed at the end; the CRDs and the shipped RBAC stay)",
                kubeconfig.display()
            ));
            Cluster::Existing {
                kubeconfig: kubeconfig.clone(),
                work: paths.work.join("identities"),
            }
        }
        None => {
            step(
                "starting Kubernetes (etcd, kube-apiserver, kube-controller-manager; the first run builds them from the pinned Go modules, minutes)",
            );
            let state = paths.work.join("kube");
            // A fresh cluster each run: the last run's nodes and plans are gone with their nodes.
            if state.exists() {
                std::fs::remove_dir_all(&state)
                    .with_context(|| format!("removing the last run's {}", state.display()))?;
            }
            let server = ApiServer::start_in(&state, &[])
                .await
                .context("starting the Kubernetes control plane")?;
            Cluster::Started(server)
        }
    };
    let cluster = keep.api.insert(cluster);
    tokio::task::block_in_place(|| cluster.install())?;
    let kubeconfig = paths.work.join("kubeconfig");
    std::fs::copy(cluster.admin_kubeconfig(), &kubeconfig)
        .with_context(|| format!("writing {}", kubeconfig.display()))?;
    let client = cluster.client().await?;
    let version = client
        .apiserver_version()
        .await
        .context("asking the API server its version")?;
    println!(
        "    {} (Kubernetes {}; admin kubeconfig {})",
        tokio::task::block_in_place(|| cluster.url())?,
        version.git_version,
        kubeconfig.display()
    );

    Ok((client, kubeconfig))
}

/// Step 2: kubelet sysext images v1 and v2, served by the artifact server.
pub(crate) async fn serve_kubelet_images(
    args: &Args,
    paths: &Paths,
) -> anyhow::Result<(ArtifactServer, Vec<SysextImage>)> {
    let mut kubelets = vec![
        FakeKubeletConfig::healthy(V1),
        FakeKubeletConfig::healthy(V2),
    ];
    if args.broken_v3 {
        kubelets.push(FakeKubeletConfig::crashing(V3));
    }
    let versions: Vec<&str> = kubelets.iter().map(|k| k.version.as_str()).collect();
    step(&format!(
        "building kubelet sysext images {}{}",
        versions.join(", "),
        if args.broken_v3 {
            " (the last one crash-loops)"
        } else {
            ""
        }
    ));
    let mut images = Vec::new();
    for kubelet in &kubelets {
        images.push(kubelet_image(paths, kubelet).await?);
    }
    let server = ArtifactServer::start().await?;
    for (version, image) in versions.iter().zip(&images) {
        let path = format!("/kubernetes/{}", kubernetes_image_file_name(version));
        server.put(&path, Artifact::file(&image.path)?);
        if let Some(rate) = image.size.checked_div(args.download_seconds) {
            server.fault(&path, Fault::Throttle(rate.max(4096)));
        }
        println!(
            "    {} ({}, sha256 {}…)",
            server.url(&path),
            view::human_bytes(image.size),
            &image.sha256[..12]
        );
    }

    Ok((server, images))
}

async fn kubelet_image(paths: &Paths, kubelet: &FakeKubeletConfig) -> anyhow::Result<SysextImage> {
    let version = kubelet.version.as_str();
    let binary = tokio::fs::read(&paths.fake_kubelet)
        .await
        .with_context(|| format!("reading {}", paths.fake_kubelet.display()))?;
    let image = SysextBuilder::new("kubernetes")
        .file("usr/bin/kubelet", binary, 0o755)
        .file(
            CONFIG_PATH.trim_start_matches('/'),
            kubelet.render().into_bytes(),
            0o644,
        )
        .file(
            "usr/lib/systemd/system/kubelet.service",
            KUBELET_UNIT.as_bytes().to_vec(),
            0o644,
        )
        .build(
            &paths
                .work
                .join("images")
                .join(kubernetes_image_file_name(version)),
        )
        .await
        .with_context(|| format!("building the {version} sysext"))?;
    Ok(image)
}

/// Step 3: Node objects, then the nodes themselves with the agent installed as
/// docs/usage/flatcar.md installs it: its own sysext image, linked and merged, the guard's
/// units beside it, the node's config and kubeconfig.
pub(crate) async fn boot_fleet(
    args: &Args,
    paths: &Paths,
    server: &ArtifactServer,
    client: &kube::Client,
    keep: &mut Keep,
    fleet: &Arc<Mutex<Vec<Node>>>,
    agent: &AgentInstall,
) -> anyhow::Result<Vec<Member>> {
    let members: Vec<Member> = (1..=args.nodes)
        .map(|i| Member {
            name: format!("{}-{i}", args.name_prefix),
            port: kubelet_port(args.kubelet_port, i),
        })
        .collect();
    let nodes_api: Api<KubeNode> = Api::all(client.clone());
    if matches!(keep.api, Some(Cluster::Existing { .. })) {
        refuse_to_reuse(client, &members).await?;
    }
    // From here on, cleanup removes these (on an existing cluster).
    keep.nodes = members.iter().map(|m| m.name.clone()).collect();
    for m in &members {
        let node: KubeNode = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": m.name, "labels": {FLEET_LABEL: "true", "node-role.kubernetes.io/worker": ""}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
        }))?;
        nodes_api
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating Node {}", m.name))?;
    }
    let cluster = keep.api.as_ref().context("the cluster")?;
    step(&format!(
        "booting {} nodes (systemd-nspawn, Debian bookworm; the first run builds the root filesystem, minutes)",
        members.len()
    ));
    let boot_started = Instant::now();
    let mut boots = Vec::new();
    for m in &members {
        let options = node_options(paths, server, cluster, m, agent).await?;
        let name = m.name.clone();
        let fleet = Arc::clone(fleet);
        boots.push(async move {
            let node = Node::boot(&name, options)
                .await
                .with_context(|| format!("booting node {name}"))?;
            println!("    {name} is up");
            if let Ok(mut f) = fleet.lock() {
                f.push(node);
            }
            anyhow::Ok(())
        });
    }
    futures::future::try_join_all(boots).await?;
    println!(
        "    {} nodes up in {}",
        members.len(),
        view::human_duration(boot_started.elapsed())
    );
    for m in &members {
        install_agent(fleet, &m.name, agent).await?;
        wait_agent(fleet, &m.name).await?;
    }
    println!(
        "    inplace-agent {} active on every node (from its sysext image, as flatcar.md installs it)",
        agent.version
    );

    Ok(members)
}

/// Step 4: the controller, as a separate process with the shipped RBAC: its identity is the
/// ServiceAccount the shipped ClusterRoleBinding names.
pub(crate) fn start_controller(
    paths: &Paths,
    cluster: &Cluster,
) -> anyhow::Result<tokio::process::Child> {
    step(
        "starting inplace-controller (ServiceAccount inplace-system/inplace-controller, the shipped RBAC)",
    );
    let controller_kubeconfig = paths.work.join("controller.kubeconfig");
    tokio::task::block_in_place(|| cluster.write_controller_kubeconfig(&controller_kubeconfig))
        .context("writing the controller's kubeconfig")?;
    let log_path = paths.work.join("controller.log");
    let controller = inplace_tests::install::spawn_controller(
        &paths.controller,
        &controller_kubeconfig,
        &log_path,
    )?;
    println!("    log: {}", log_path.display());

    Ok(controller)
}

/// On an existing cluster: fails if a Node or plan of the demo's node names, its rollouts or
/// one of its kubelet releases already exists — the demo removes those at the end, so it must never
/// adopt what is not its own.
async fn refuse_to_reuse(client: &kube::Client, members: &[Member]) -> anyhow::Result<()> {
    let nodes: Api<KubeNode> = Api::all(client.clone());
    let plans: Api<NodeUpdatePlan> = Api::all(client.clone());
    let mut taken = Vec::new();
    for m in members {
        if nodes.get_opt(&m.name).await?.is_some() {
            taken.push(format!("Node {}", m.name));
        }
        if plans.get_opt(&m.name).await?.is_some() {
            taken.push(format!("NodeUpdatePlan {}", m.name));
        }
    }
    for rollout in [ROLLOUT, AGENT_ROLLOUT] {
        if Api::<NodeRollout>::all(client.clone())
            .get_opt(rollout)
            .await?
            .is_some()
        {
            taken.push(format!("NodeRollout {rollout}"));
        }
    }
    let releases: Api<NodeRelease> = Api::all(client.clone());
    for name in ["kubelet-v1", "kubelet-v2", "kubelet-v3"] {
        if releases.get_opt(name).await?.is_some() {
            taken.push(format!("NodeRelease {name}"));
        }
    }
    if !taken.is_empty() {
        bail!(
            "the cluster already has {}: not the demo's to use or remove (--name-prefix picks other node names)",
            taken.join(", ")
        );
    }
    Ok(())
}
