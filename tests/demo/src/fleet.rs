//! The demo, step by step: servers, images, nodes, controller, v1, then the v2 rollout
//! (and, with `--broken-v3`, a crash-looping v3 that halts).

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan};
use inplace_tests::apiserver::ApiServer;
use inplace_tests::artifact_server::{Artifact, ArtifactServer, Fault};
use inplace_tests::fake_kubelet::{CONFIG_PATH, FakeKubeletConfig};
use inplace_tests::nspawn::Node;
use inplace_tests::sysext::{SysextBuilder, SysextImage, kubernetes_image_file_name};
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubectl_inplace::view::{self, Style};
use serde_json::json;

use crate::Args;
use crate::broken::{Broken, roll_out_broken_v3};
use crate::cluster::{Cluster, DEMO_LABEL};
use crate::concurrency::Concurrency;
use crate::follow::{Ending, Stage, Watch, follow, print_limits};
use crate::measure::{self, KubeletSeen};
use crate::nodes::{kubelet_port, node_options, node_sh, wait_agent};
use crate::report::{inspect_hints, summary};

/// The two kubelet versions the demo swaps between, and the broken one of `--broken-v3`.
pub(crate) const V1: &str = "v1.31.0";
pub(crate) const V2: &str = "v1.32.0";
pub(crate) const V3: &str = "v1.33.0";
/// How long the agent may wait for a healthy window before it rolls back. A crash-looping
/// kubelet never gives it one, so the broken release's rollback comes after its timeout: a
/// shorter one keeps the demo short.
const HEALTH_TIMEOUT: &str = "3m";
pub(crate) const BROKEN_HEALTH_TIMEOUT: &str = "45s";
/// The rollouts' `maxUnavailable` after the setup, which the demo checks from outside.
pub(crate) const MAX_UNAVAILABLE: usize = 1;
/// The NodeRollout's name.
pub(crate) const ROLLOUT: &str = "kubelet";
/// The label that selects the demo's nodes.
const FLEET_LABEL: &str = "inplace.dev/demo-fleet";
/// Patience for any one phase of the demo (a loaded 2-core machine is slow).
pub(crate) const PATIENCE: Duration = Duration::from_secs(600);

/// The kubelet unit shipped in the demo's sysext images: the image decides the kubelet
/// (binary, version), the node decides its port (`/etc/default/kubelet`).
const KUBELET_UNIT: &str = "[Unit]
Description=kubelet (inplace demo stand-in, from the kubernetes sysext)
StartLimitIntervalSec=0

[Service]
Type=simple
EnvironmentFile=-/etc/default/kubelet
ExecStart=/bin/sh -c 'sed \"s/^port=.*/port=$${KUBELET_PORT:-10248}/\" /usr/lib/fake-kubelet/config > /run/kubelet-demo.conf && exec /usr/bin/kubelet --config /run/kubelet-demo.conf'
Restart=always
RestartSec=1
";

/// Runs the demo; every path out (success, error, Ctrl-C) cleans up.
pub async fn main(args: Args) -> ExitCode {
    let fleet = Arc::new(Mutex::new(Vec::<Node>::new()));
    let mut keep = Keep::default();
    let outcome = tokio::select! {
        r = run(&args, &fleet, &mut keep) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted (Ctrl-C)")),
    };
    let code = match &outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ninplace-demo: {e:#}");
            ExitCode::FAILURE
        }
    };
    println!("\ncleaning up: powering off the nodes, stopping the controller and the servers ...");
    let nodes: Vec<Node> = fleet
        .lock()
        .map(|mut f| f.drain(..).collect())
        .unwrap_or_default();
    let offs = nodes.into_iter().map(|n| async move {
        let name = n.name().to_owned();
        if let Err(e) = n.poweroff().await {
            eprintln!("  powering off {name}: {e}");
        }
    });
    futures::future::join_all(offs).await;
    if let Some(cluster) = &keep.api {
        // Before the controller stops: it takes its finalizer off the rollout.
        let names = keep.nodes.clone();
        if let Err(e) = tokio::task::block_in_place(|| cluster.remove_demo_objects(ROLLOUT, &names))
        {
            eprintln!("  removing the demo's objects from the cluster: {e:#}");
        }
    }
    if let Some(mut c) = keep.controller.take() {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    drop(keep.artifacts.take());
    // A started cluster (etcd, kube-apiserver, kube-controller-manager) stops with it.
    drop(keep.api.take());
    println!("done.");
    code
}

/// What must outlive `run` until cleanup.
#[derive(Default)]
struct Keep {
    api: Option<Cluster>,
    /// The nodes' names (their Node objects and plans, to remove from an existing cluster).
    nodes: Vec<String>,
    artifacts: Option<ArtifactServer>,
    controller: Option<tokio::process::Child>,
}

/// Where the demo finds its programs and the repository's files.
pub(crate) struct Paths {
    pub(crate) agent: PathBuf,
    pub(crate) controller: PathBuf,
    pub(crate) fake_kubelet: PathBuf,
    pub(crate) bin_dir: PathBuf,
    pub(crate) repo: PathBuf,
    pub(crate) work: PathBuf,
}

fn paths(args: &Args) -> anyhow::Result<Paths> {
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()
            .context("locating this program")?
            .parent()
            .context("this program's directory")?
            .to_path_buf(),
    };
    let find = |name: &str| -> anyhow::Result<PathBuf> {
        let p = bin_dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            bail!(
                "{} not found: build it first (scripts/demo.sh runs `cargo build --release -p inplace-agent -p inplace-controller -p inplace-tests -p kubectl-inplace --bins`)",
                p.display()
            )
        }
    };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Ok(Paths {
        agent: find("inplace-agent")?,
        controller: find("inplace-controller")?,
        fake_kubelet: find("fake-kubelet")?,
        bin_dir: bin_dir.clone(),
        repo: repo.canonicalize().unwrap_or(repo),
        work: args.work_dir.clone(),
    })
}

pub(crate) fn step(text: &str) {
    println!("==> {text}");
}

/// One node of the fleet, as the demo tracks it.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) port: u16,
}

async fn run(args: &Args, fleet: &Arc<Mutex<Vec<Node>>>, keep: &mut Keep) -> anyhow::Result<()> {
    let started = Instant::now();
    inplace_tests::prereq::require_root()?;
    inplace_tests::prereq::require_nspawn()?;
    inplace_tests::prereq::require_squashfs_tools()?;
    let paths = paths(args)?;
    tokio::fs::create_dir_all(paths.work.join("images"))
        .await
        .with_context(|| format!("creating {}", paths.work.display()))?;
    let tty = std::io::stdout().is_terminal();
    let style = Style::for_terminal(tty);

    // 1. A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager of
    //    the pinned release), or the existing cluster of --kubeconfig, with the CRDs, the
    //    agent's RBAC and admission policy, the controller's RBAC, and an admin kubeconfig
    //    for people.
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
    let packaging = paths.repo.join("packaging/kubernetes");
    tokio::task::block_in_place(|| cluster.install(&packaging))?;
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

    // 2. Kubelet sysext images v1 and v2, served by the artifact server.
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
        images.push(kubelet_image(&paths, kubelet).await?);
    }
    let [v1, v2, ..] = images.as_slice() else {
        bail!("the v1 and v2 images were not built");
    };
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

    // 3. Node objects, then the nodes themselves with the agent installed as an image
    //    builder would: binary, hardened unit (enabled), tmpfiles, config, kubeconfig.
    let members: Vec<Member> = (1..=args.nodes)
        .map(|i| Member {
            name: format!("{}-{i}", args.name_prefix),
            port: kubelet_port(args.kubelet_port, i),
        })
        .collect();
    let nodes_api: Api<KubeNode> = Api::all(client.clone());
    if matches!(keep.api, Some(Cluster::Existing { .. })) {
        refuse_to_reuse(&client, &members).await?;
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
        let options = node_options(&paths, &server, cluster, m).await?;
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
        wait_agent(fleet, &m.name).await?;
    }
    println!("    inplace-agent.service active on every node");

    // 4. The controller, as a separate process with the shipped RBAC: its identity is the
    //    ServiceAccount the shipped ClusterRoleBinding names.
    step(
        "starting inplace-controller (ServiceAccount inplace-system/inplace-controller, the shipped RBAC)",
    );
    let controller_kubeconfig = paths.work.join("controller.kubeconfig");
    tokio::task::block_in_place(|| cluster.write_controller_kubeconfig(&controller_kubeconfig))
        .context("writing the controller's kubeconfig")?;
    let log_path = paths.work.join("controller.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let controller = tokio::process::Command::new(&paths.controller)
        .args([
            "run",
            "--no-leader-election",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .arg("--kubeconfig")
        .arg(&controller_kubeconfig)
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", paths.controller.display()))?;
    keep.controller = Some(controller);
    println!("    log: {}", log_path.display());

    // 5. The fleet at v1: a release and a rollout that activates every node at once.
    let releases: Api<NodeRelease> = Api::all(client.clone());
    let rollouts: Api<NodeRollout> = Api::all(client.clone());
    releases
        .create(
            &PostParams::default(),
            &release(&server, "kubelet-v1", V1, v1, HEALTH_TIMEOUT, args)?,
        )
        .await
        .context("creating NodeRelease kubelet-v1")?;
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
    let watch = Watch::start(&client);
    let setup = Stage {
        release: "kubelet-v1",
        seen: None,
        limits: None,
        ends: Ending::AllSucceeded,
    };
    follow(&watch, &setup, &members, &style, tty, fleet).await?;
    for m in &members {
        let v = measure::kubelet_version(m.port).await;
        if v.as_deref() != Some(V1) {
            bail!("{}: the kubelet answers {v:?}, expected {V1}", m.name);
        }
    }
    println!("    every kubelet answers {V1}");

    // 6. The show: release v2, one node at a time, cordoned while it swaps.
    releases
        .create(
            &PostParams::default(),
            &release(&server, "kubelet-v2", V2, v2, HEALTH_TIMEOUT, args)?,
        )
        .await
        .context("creating NodeRelease kubelet-v2")?;
    step(&format!(
        "rolling out kubelet {V2}: NodeRollout {ROLLOUT} → release kubelet-v2, maxUnavailable {MAX_UNAVAILABLE}, disruption Cordon, in a maintenance window opening a minute from now"
    ));
    let limits = Concurrency::start(&client, &format!("{FLEET_LABEL}=true"));
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
    crate::window::show_the_hold(&client, ROLLOUT, opens, &style).await?;
    // The rollout's time counts from the window's opening (staging goes on before it).
    let until_open = opens.duration_since(k8s_openapi::jiff::Timestamp::now());
    let rollout_started = Instant::now() + Duration::try_from(until_open).unwrap_or(Duration::ZERO);
    let rollout_v2 = Stage {
        release: "kubelet-v2",
        seen: Some(&seen),
        limits: Some(&limits),
        ends: Ending::AllSucceeded,
    };
    let timings = follow(&watch, &rollout_v2, &members, &style, tty, fleet).await?;
    let rollout_took = rollout_started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for p in pollers {
        p.abort();
    }

    // 7. Proof and summary.
    let mut rows = Vec::new();
    for m in &members {
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
        started.elapsed(),
        args.health_window,
        &style,
    );
    print_limits(&limits);
    if args.broken_v3
        && let Some(v3) = images.get(2)
    {
        let broken = Broken {
            client: &client,
            server: &server,
            image: v3,
            watch: &watch,
            limits: &limits,
        };
        roll_out_broken_v3(&broken, &members, &style, tty, fleet, args).await?;
    }
    let pids: Vec<(String, i32)> = fleet
        .lock()
        .map(|f| f.iter().map(|n| (n.name().to_owned(), n.pid1())).collect())
        .unwrap_or_default();
    inspect_hints(&paths, &kubeconfig, &members, &pids);
    if !args.no_wait {
        println!("\nThe fleet stays up while you look. Press Enter (or Ctrl-C) to clean up.");
        let mut line = String::new();
        let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
        let _ = tokio::io::AsyncBufReadExt::read_line(&mut stdin, &mut line).await;
    }
    Ok(())
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

/// On an existing cluster: fails if a Node or plan of the demo's node names, its rollout or
/// one of its releases already exists — the demo removes those at the end, so it must never
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
    if Api::<NodeRollout>::all(client.clone())
        .get_opt(ROLLOUT)
        .await?
        .is_some()
    {
        taken.push(format!("NodeRollout {ROLLOUT}"));
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
