//! The crash matrix's node and its invariant (`crash_matrix.rs` says what the cases are).
//!
//! Every revision is a `kubernetes` extension with the kubelet: the healthy or the broken
//! base image plus a file naming the case at the image's root, outside the merged `/usr`
//! (appended by mksquashfs without packing the kubelet again), so that every case's image has a sha256 of its own. On a real Kubernetes
//! node ([`Kubelet::Real`]) the healthy base is the real kubelet and the broken one the same
//! kubelet with a flag it refuses; on the stand-in ([`Kubelet::StandIn`]) a script that
//! sleeps or exits.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::artifact_server::Artifact;
use inplace_tests::kube_node::workload::RunningContainer;
use inplace_tests::kube_node::{self, KubeletImage};
use inplace_tests::sysext::{SysextBuilder, SysextImage};
use inplace_tests::test_api::TestApi;
use sha2::Digest;

use crate::real_node::AgentNode;

mod invariant;
mod reboot;

pub use reboot::Cut;

/// The kubelet release of the real node (the patch release the kubelet suites start from).
const KUBELET_RELEASE: &str = "v1.36.1";

/// Where each revision's image names its case (at the image's root: not merged).
const TAG_FILE: &str = "inplace-crash-tag";

/// What the stand-in's image says it is (`healthy` or `broken`), in the merged `/usr`.
const STAND_IN_FLAVOR: &str = "usr/lib/kubelet-flavor";

/// How a case kills the agent.
#[derive(Clone, Copy, Debug)]
pub enum Kill {
    Point(&'static str),
    /// SIGKILL from outside this long after the plan changed.
    After(Duration),
}

/// What the node's kubelet is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kubelet {
    /// The real kubelet with containerd and a Pod, on the real control plane.
    Real,
    /// `usr/bin/kubelet-sim` (sleeps, or exits 1 when broken) under a unit of the test's: for
    /// the emulator, which a real kubelet cannot register with.
    StandIn,
}

pub struct Bed {
    pub real: AgentNode,
    kubelet: Kubelet,
    /// The Pod's container as it ran before the first case (real kubelet only).
    pod: Option<BTreeMap<String, RunningContainer>>,
    /// The images every revision's is made from: (healthy, broken).
    bases: (SysextImage, SysextImage),
    _bases_dir: tempfile::TempDir,
    /// Every published revision's image, by case tag.
    images: BTreeMap<String, SysextImage>,
    /// The committed case tag and revision.
    pub committed: (String, String),
    /// Whether the committed revision links `/opt/bin/crictl`.
    committed_crictl: bool,
    /// Whether the next plan leaves `crictl` out (dropping it from the committed revision).
    without_crictl: bool,
    pub injected: usize,
    pub cases: usize,
}

fn kubectl(tag: &str) -> Vec<u8> {
    format!("#!/bin/sh\necho kubectl-{tag}\n").into_bytes()
}

fn crictl(tag: &str) -> Vec<u8> {
    format!("#!/bin/sh\necho crictl-{tag}\n").into_bytes()
}

impl Bed {
    /// The image of case `tag`.
    async fn image(&self, tag: &str, healthy: bool) -> SysextImage {
        let base = if healthy {
            &self.bases.0
        } else {
            &self.bases.1
        };
        let out = self.real.work.path().join(format!("kubernetes-{tag}.raw"));
        base.with_root_file(TAG_FILE, tag.as_bytes(), &out)
            .await
            .expect("mksquashfs")
    }

    /// The plan of case `tag` (published first).
    pub fn plan(&self, tag: &str, healthy: bool) -> NodeUpdatePlan {
        let image = &self.images[tag];
        let server = &self.real.server;
        let mut artifacts = vec![
            serde_json::json!({"name": "kubernetes", "type": "Sysext",
                "url": server.url(&format!("/{tag}/kubernetes-{tag}.raw")),
                "sha256": image.sha256, "size": image.size}),
            serde_json::json!({"name": "kubectl", "type": "Binary",
                "url": server.url(&format!("/{tag}/kubectl")),
                "sha256": hex::encode(sha2::Sha256::digest(kubectl(tag))),
                "path": "/opt/bin/kubectl"}),
        ];
        if !self.without_crictl {
            artifacts.push(serde_json::json!({"name": "crictl", "type": "Binary",
                "url": server.url(&format!("/{tag}/crictl")),
                "sha256": hex::encode(sha2::Sha256::digest(crictl(tag))),
                "path": "/opt/bin/crictl"}));
        }
        let checks = match self.kubelet {
            Kubelet::Real => self.real.kubelet_checks(healthy),
            Kubelet::StandIn => {
                serde_json::json!({"units": ["kubelet.service"], "window": "1s", "timeout": "60s"})
            }
        };
        self.real.plan(artifacts, checks)
    }

    /// Packs and serves the artifacts of case `tag`.
    pub async fn publish(&mut self, tag: &str, healthy: bool) {
        let image = self.image(tag, healthy).await;
        let server = &self.real.server;
        server.put(
            &format!("/{tag}/kubernetes-{tag}.raw"),
            Artifact::file(&image.path).unwrap(),
        );
        server.put_bytes(&format!("/{tag}/kubectl"), kubectl(tag));
        server.put_bytes(&format!("/{tag}/crictl"), crictl(tag));
        self.images.insert(tag.to_owned(), image);
    }

    async fn restarts(&self) -> u64 {
        let out = self
            .real
            .node
            .systemctl(&[
                "show",
                "-p",
                "NRestarts",
                "--value",
                "inplace-agent.service",
            ])
            .await
            .unwrap();
        out.trim().parse().unwrap_or(0)
    }

    /// One case: from the committed revision to a new one, killed once on the way.
    pub async fn case(&mut self, kill: Kill, healthy: bool) {
        self.cases += 1;
        let tag = format!("c{}", self.cases);
        let label = format!("case {tag} ({kill:?}, healthy={healthy})");
        self.publish(&tag, healthy).await;
        self.without_crictl = matches!(kill, Kill::Point("activate.remove"));
        let plan = self.plan(&tag, healthy);
        let revision = inplace_proto::revision_of(&plan.spec.content);
        let restarts = self.restarts().await;
        if let Kill::Point(point) = kill {
            self.real
                .node
                .write_file("/run/inplace/failpoints", point.as_bytes(), 0o644)
                .await
                .unwrap();
        }
        self.real.apply(&plan).await;
        if let Kill::After(delay) = kill {
            tokio::time::sleep(delay).await;
            self.real
                .node
                .systemctl(&["kill", "--signal=SIGKILL", "inplace-agent.service"])
                .await
                .unwrap();
        }
        let want = if healthy {
            Phase::Succeeded
        } else {
            Phase::RolledBack
        };
        self.real.wait_final(want, &revision, &label).await;
        self.wait_restarted(restarts, &label).await;
        self.injected += 1;
        // After a random kill, let the restarted agent settle on the final state.
        self.real.wait_final(want, &revision, &label).await;
        let previous = self.committed.clone();
        if healthy {
            self.committed = (tag.clone(), revision.clone());
            self.committed_crictl = !self.without_crictl;
        }
        let (ctag, crev) = self.committed.clone();
        self.check_invariant(&ctag, &crev, &previous.0, &label)
            .await;
        let (reason, message) = self.real.ready().await;
        let wanted = if healthy { "Succeeded" } else { "RolledBack" };
        assert_eq!(reason, wanted, "{label}: {message}");
        eprintln!("{label}: ok");
    }

    /// The point fired exactly when armed: the file is gone and systemd restarted the agent
    /// (a random kill may land after the final phase: it still must not harm).
    async fn wait_restarted(&self, restarts: u64, label: &str) {
        assert!(
            !self
                .real
                .node
                .exists("/run/inplace/failpoints")
                .await
                .unwrap(),
            "{label}: the failpoint was never passed\n{}",
            self.real.diagnostics().await
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.restarts().await <= restarts {
            assert!(
                Instant::now() < deadline,
                "{label}: systemd did not restart the agent"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.real
            .node
            .wait_active("inplace-agent.service", Duration::from_secs(60))
            .await
            .unwrap();
    }
}

/// The base images of `kubelet`: (healthy, broken), packed into `dir`.
async fn base_images(kubelet: Kubelet, dir: &Path) -> (SysextImage, SysextImage) {
    match kubelet {
        Kubelet::Real => {
            let pack = |variant| kube_node::kubelet_sysext(KUBELET_RELEASE, variant, dir);
            let healthy = pack(KubeletImage::Working).await;
            let broken = pack(KubeletImage::RefusesToStart).await;
            (
                healthy.expect("the kubelet is built and packed"),
                broken.expect("the kubelet is built and packed"),
            )
        }
        // The broken stand-in dies at once: one that lived 1 s raced the plan's 1 s health
        // window and, on a loaded machine, outlived it (reported Succeeded: an unhealthy
        // revision that was healthy for the whole window, which the agent rightly commits).
        Kubelet::StandIn => {
            let pack = async |kubelet: &[u8], flavor: &str| {
                SysextBuilder::new("kubernetes")
                    .file("usr/bin/kubelet-sim", kubelet.to_vec(), 0o755)
                    .file(STAND_IN_FLAVOR, format!("{flavor}\n").into_bytes(), 0o644)
                    .build(&dir.join(format!("kubernetes-{flavor}.raw")))
                    .await
                    .expect("mksquashfs")
            };
            let healthy = pack(b"#!/bin/sh\nexec sleep infinity\n", "healthy").await;
            (healthy, pack(b"#!/bin/sh\nexit 1\n", "broken").await)
        }
    }
}

/// Boots the node with the shipped unit restarted after 1 s instead of 10 s, starts the Pod
/// on a real kubelet, and commits a first revision (no crash). `Kubelet::StandIn` runs on
/// `stand_in_api` (the emulator, for its faults); a real kubelet has its own control plane.
pub async fn boot(kubelet: Kubelet, stand_in_api: Option<TestApi>) -> Bed {
    const DROP_IN: Option<&str> = Some("[Service]\nRestartSec=1s\n");
    let bases_dir = tempfile::tempdir().unwrap();
    let bases = base_images(kubelet, bases_dir.path()).await;
    let (real, pod) = match kubelet {
        Kubelet::Real => {
            let real =
                AgentNode::start_on_kube_node("crash", DROP_IN, KUBELET_RELEASE, &bases.0).await;
            let pod = real.run_pod().await;
            (real, Some(pod))
        }
        Kubelet::StandIn => {
            let api = stand_in_api.expect("the API for the stand-in");
            let real = AgentNode::start_on(api, "crash", DROP_IN).await;
            // Its binary comes from the kubernetes sysext.
            real.node
                .write_file(
                    "/etc/systemd/system/kubelet.service",
                    b"[Unit]\nDescription=kubelet stand-in from the kubernetes sysext\n[Service]\nExecStart=/usr/bin/kubelet-sim\nRestart=no\n",
                    0o644,
                )
                .await
                .unwrap();
            (real, None)
        }
    };
    let mut bed = Bed {
        real,
        kubelet,
        pod,
        bases,
        _bases_dir: bases_dir,
        images: BTreeMap::new(),
        committed: (String::new(), String::new()),
        committed_crictl: true,
        without_crictl: false,
        injected: 0,
        cases: 0,
    };
    let tag = "c0".to_owned();
    bed.publish(&tag, true).await;
    let plan = bed.plan(&tag, true);
    let revision = inplace_proto::revision_of(&plan.spec.content);
    bed.real.apply(&plan).await;
    bed.real
        .wait_final(Phase::Succeeded, &revision, "first install")
        .await;
    bed.committed = (tag.clone(), revision.clone());
    bed.check_invariant(&tag, &revision, &tag, "first install")
        .await;
    bed
}
