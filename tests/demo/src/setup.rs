//! The demo's setup, step by step: the cluster, the kubelet images and their server, the
//! nodes with the agent installed from its sysext image, the controller.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context as _, bail};
use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan};
use inplace_tests::apiserver::ApiServer;
use inplace_tests::artifact_server::{Artifact, ArtifactServer, Fault};
use inplace_tests::kube_node::{
    KubeNode, KubeNodeConfig, KubeletImage, kubelet_sysext, wait_node_ready,
};
use inplace_tests::nspawn::Node;
use inplace_tests::sysext::SysextImage;
use k8s_openapi::api::core::v1::{Namespace, Node as KubeNodeObject};
use kube::api::{Api, Patch, PatchParams};
use kubectl_inplace::render;
use serde_json::json;

use crate::Args;
use crate::agent_update::AGENT_ROLLOUT;
use crate::cluster::Cluster;
use crate::fleet::{
    BROKEN_RELEASE, FLEET_LABEL, Keep, Member, PATIENCE, Paths, ROLLOUT, V1, V2, step,
};
use crate::nodes::{AgentInstall, install_agent, node_options, wait_agent};
use crate::workload::WORKLOAD_NAMESPACE;

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
                "starting Kubernetes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler; the first run builds them from the pinned Go modules, minutes)",
            );
            let state = paths.work.join("kube");
            // A fresh cluster each run: the last run's nodes and plans are gone with their nodes.
            if state.exists() {
                std::fs::remove_dir_all(&state)
                    .with_context(|| format!("removing the last run's {}", state.display()))?;
            }
            let server = ApiServer::start_for_kubelets(&state)
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

/// Step 2: the real kubelets v1 and v2 (and the broken one) as sysext images the way
/// Flatcar's sysext-bakery ships Kubernetes, served by the artifact server.
pub(crate) async fn serve_kubelet_images(
    args: &Args,
    paths: &Paths,
) -> anyhow::Result<(ArtifactServer, KubeletImages)> {
    step(&format!(
        "packing the real kubelets {V1} and {V2}{} as sysext images (built from Kubernetes' Go module, tests/kubelet; the first run compiles them, minutes)",
        if args.broken_v3 {
            format!(", and a {V2} whose drop-in passes a flag the kubelet refuses")
        } else {
            String::new()
        }
    ));
    let dir = paths.work.join("images");
    let images = KubeletImages {
        v1: kubelet_sysext(V1, KubeletImage::Working, &dir).await?,
        v2: kubelet_sysext(V2, KubeletImage::Working, &dir).await?,
        broken: match args.broken_v3 {
            true => Some(kubelet_sysext(V2, KubeletImage::RefusesToStart, &dir).await?),
            false => None,
        },
    };
    let server = ArtifactServer::start().await?;
    for image in images.all() {
        let path = image_path(image);
        server.put(&path, Artifact::file(&image.path)?);
        if let Some(rate) = image.size.checked_div(args.download_seconds) {
            server.fault(&path, Fault::Throttle(rate.max(4096)));
        }
        println!(
            "    {} ({}, sha256 {}…)",
            server.url(&path),
            render::human_bytes(image.size),
            &image.sha256[..12]
        );
    }

    Ok((server, images))
}

/// The kubelet images the demo serves.
pub(crate) struct KubeletImages {
    pub(crate) v1: SysextImage,
    pub(crate) v2: SysextImage,
    pub(crate) broken: Option<SysextImage>,
}

impl KubeletImages {
    fn all(&self) -> impl Iterator<Item = &SysextImage> {
        [&self.v1, &self.v2].into_iter().chain(self.broken.as_ref())
    }
}

/// Where the artifact server serves `image`: `/kubernetes/` and its file name.
pub(crate) fn image_path(image: &SysextImage) -> String {
    let name = image
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("/kubernetes/{name}")
}

/// Step 3: the nodes, real Kubernetes nodes on kubelet v1 (containerd, runc, CNI; the
/// kubelet registers its Node as `system:node:NAME`), with the agent installed as
/// docs/usage/flatcar.md installs it: its own sysext image, linked and merged, the guard's
/// units beside it, the node's config; then the fleet's label on each Node.
pub(crate) async fn boot_fleet(
    args: &Args,
    server: &ArtifactServer,
    keep: &mut Keep,
    fleet: &Arc<Mutex<Vec<Node>>>,
    agent: &AgentInstall,
    kubelet: &SysextImage,
) -> anyhow::Result<Vec<Member>> {
    let client = &keep.api.as_ref().context("the cluster")?.client().await?;
    let mut members = Vec::new();
    for i in 1..=args.nodes {
        members.push(Member {
            name: format!("{}-{i}", args.name_prefix),
            ports: KubeNodeConfig::free_ports()?,
        });
    }
    if matches!(keep.api, Some(Cluster::Existing { .. })) {
        refuse_to_reuse(client, &members).await?;
    }
    // From here on, cleanup removes these (on an existing cluster).
    keep.nodes = members.iter().map(|m| m.name.clone()).collect();
    let cluster = keep.api.as_ref().context("the cluster")?;
    step(&format!(
        "booting {} Kubernetes nodes on kubelet {V1} (systemd-nspawn, Debian bookworm with containerd; the first run builds the root filesystem, minutes)",
        members.len()
    ));
    let boot_started = Instant::now();
    let mut boots = Vec::new();
    for m in &members {
        let (config, options) = node_options(server, cluster, m, agent, kubelet).await?;
        let fleet = Arc::clone(fleet);
        boots.push(async move {
            let booted = KubeNode::boot(&config, options)
                .await
                .with_context(|| format!("booting node {}", config.name))?;
            println!("    {} is up, its kubelet healthy", config.name);
            if let Ok(mut f) = fleet.lock() {
                f.push(booted.node);
            }
            anyhow::Ok(())
        });
    }
    futures::future::try_join_all(boots).await?;
    let nodes_api: Api<KubeNodeObject> = Api::all(client.clone());
    for m in &members {
        wait_node_ready(client, &m.name, Some(V1), PATIENCE).await?;
        // The role and the fleet's label are the admin's to set: NodeRestriction keeps a
        // kubelet from giving itself a role.
        let labels = json!({"metadata": {"labels": {FLEET_LABEL: "true", "node-role.kubernetes.io/worker": ""}}});
        nodes_api
            .patch(&m.name, &PatchParams::default(), &Patch::Merge(labels))
            .await
            .with_context(|| format!("labelling Node {}", m.name))?;
    }
    println!(
        "    {} Nodes Ready on kubelet {V1} in {}",
        members.len(),
        render::human_duration(boot_started.elapsed())
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
    let nodes: Api<KubeNodeObject> = Api::all(client.clone());
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
    for name in ["kubelet-v2", BROKEN_RELEASE] {
        if releases.get_opt(name).await?.is_some() {
            taken.push(format!("NodeRelease {name}"));
        }
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(WORKLOAD_NAMESPACE).await?.is_some() {
        taken.push(format!("Namespace {WORKLOAD_NAMESPACE}"));
    }
    if !taken.is_empty() {
        bail!(
            "the cluster already has {}: not the demo's to use or remove (--name-prefix picks other node names)",
            taken.join(", ")
        );
    }
    Ok(())
}
