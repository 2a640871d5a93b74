//! Crash matrix on a real systemd host (issue 7, item 1).
//!
//! One Debian node booted with systemd-nspawn runs the real agent binary under the
//! shipped, hardened unit (plus a drop-in `RestartSec=1s`, so a case does not wait the
//! shipped 10 s for each restart). The binary is this package's test build, which has the
//! `failpoints` feature (see `src/failpoints.rs`): writing a point's name to
//! `/run/inplace/failpoints` makes the agent SIGKILL itself when it passes that point.
//!
//! Each case starts from a committed, healthy revision, arms one point (or schedules a
//! SIGKILL from outside after a random delay), and applies a new revision: a healthy one
//! (update points) or one whose kubelet dies (rollback points). systemd restarts the agent
//! with the point disarmed (it fires once); the case waits for the final phase and checks
//! the invariant of faults.md on the host and in the status:
//! * the sysext link and the managed binary links point at complete files whose sha256 is
//!   the one of the expected revision (new after an update, old after a rollback); a
//!   binary the committed revision dropped (the `activate.remove` case leaves `crictl` out
//!   of its plan) has no link left; no
//!   `.inplace-new` temporaries; the staging directory is empty;
//! * the merged /usr is the healthy image and kubelet.service is active;
//! * the previous committed revision's image is still on disk;
//! * the status says `Succeeded` / `RolledBack` with the right `currentRevision`, and a
//!   revision that was rolled back was never reported `Succeeded`;
//! * the point really fired (the file is gone, systemd counted one more restart).
//!
//! CI (default): every named point once plus two random kills. Long mode:
//! `INPLACE_CRASH_MATRIX=long cargo nextest run -p inplace-agent --test crash_matrix`
//! runs every point three times and random kills until at least 100 crashes were injected
//! (`INPLACE_CRASH_MATRIX_MIN` overrides the 100).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use inplace_api_emulator::{AuthzMode, EmulatorConfig};
use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::sysext::{SysextBuilder, SysextImage};
use inplace_tests::test_api::TestApi;
use real_node::AgentNode;
use sha2::Digest;

mod real_node;

/// Points an update to a healthy revision passes.
const UPDATE_POINTS: &[&str] = &[
    "stage.begin",
    "stage.artifact",
    "stage.done",
    "activate.begin",
    "activate.swap",
    "activate.remove",
    "activate.sysext_refreshed",
    "activate.unit_restarted",
    "verify.begin",
    "verify.progress",
    "commit.before",
    "commit.saved",
];

/// Points a rollback passes (the new revision's kubelet dies).
const ROLLBACK_POINTS: &[&str] = &[
    "rollback.begin",
    "rollback.restore",
    "rollback.sysext_refreshed",
    "rollback.unit_restarted",
    "rollback.verify",
    "rollback.saved",
];

#[derive(Clone, Copy, Debug)]
enum Kill {
    Point(&'static str),
    /// SIGKILL from outside this long after the plan changed.
    After(Duration),
}

struct Bed {
    real: AgentNode,
    healthy: (Vec<u8>, String),
    broken: (Vec<u8>, String),
    /// The committed case tag and revision.
    committed: (String, String),
    /// Whether the committed revision links `/opt/bin/crictl`.
    committed_crictl: bool,
    /// Whether the next plan leaves `crictl` out (dropping it from the committed revision).
    without_crictl: bool,
    injected: usize,
    cases: usize,
}

async fn image(dir: &Path, tag: &str, healthy: bool) -> SysextImage {
    // The broken kubelet dies at once: one that lived 1 s raced the plan's 1 s health window
    // and, on a loaded machine, outlived it (reported Succeeded: an unhealthy revision that
    // was healthy for the whole window, which the agent rightly commits).
    let kubelet: &[u8] = if healthy {
        b"#!/bin/sh\nexec sleep infinity\n"
    } else {
        b"#!/bin/sh\nexit 1\n"
    };
    let flavor: &[u8] = if healthy { b"healthy\n" } else { b"broken\n" };
    SysextBuilder::new("kubernetes")
        .file("usr/bin/kubelet-sim", kubelet.to_vec(), 0o755)
        .file("usr/lib/kubelet-flavor", flavor.to_vec(), 0o644)
        .build(&dir.join(format!("kubernetes-{tag}.raw")))
        .await
        .expect("mksquashfs")
}

fn kubectl(tag: &str) -> Vec<u8> {
    format!("#!/bin/sh\necho kubectl-{tag}\n").into_bytes()
}

fn crictl(tag: &str) -> Vec<u8> {
    format!("#!/bin/sh\necho crictl-{tag}\n").into_bytes()
}

impl Bed {
    fn plan(&self, tag: &str, healthy: bool) -> NodeUpdatePlan {
        let (bytes, sha) = if healthy { &self.healthy } else { &self.broken };
        let server = &self.real.server;
        let mut artifacts = vec![
            serde_json::json!({"name": "kubernetes", "type": "Sysext",
                "url": server.url(&format!("/{tag}/kubernetes-{tag}.raw")),
                "sha256": sha, "size": bytes.len()}),
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
        self.real.plan(
            artifacts,
            serde_json::json!({"units": ["kubelet.service"], "window": "1s", "timeout": "60s"}),
        )
    }

    fn publish(&self, tag: &str, healthy: bool) {
        let bytes = if healthy {
            &self.healthy.0
        } else {
            &self.broken.0
        };
        self.real
            .server
            .put_bytes(&format!("/{tag}/kubernetes-{tag}.raw"), bytes.clone());
        self.real
            .server
            .put_bytes(&format!("/{tag}/kubectl"), kubectl(tag));
        self.real
            .server
            .put_bytes(&format!("/{tag}/crictl"), crictl(tag));
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

    /// The invariant of faults.md on the host and in the status, with `tag` / `revision`
    /// committed and `previous` still on disk.
    async fn check_invariant(&self, tag: &str, revision: &str, previous: &str, label: &str) {
        let node = &self.real.node;
        let link = node
            .exec_ok(&["readlink", "/etc/extensions/kubernetes.raw"])
            .await
            .unwrap();
        let expected = format!("/opt/extensions/kubernetes/kubernetes-{tag}.raw");
        assert_eq!(link.trim(), expected, "{label}: sysext link");
        let sum = node.exec_ok(&["sha256sum", &expected]).await.unwrap();
        assert!(
            sum.starts_with(&self.healthy.1),
            "{label}: sysext image is complete and verified: {sum}"
        );
        let bin = node
            .exec_ok(&["readlink", "/opt/bin/kubectl"])
            .await
            .unwrap();
        let bin_sum = node.exec_ok(&["sha256sum", bin.trim()]).await.unwrap();
        assert!(
            bin_sum.starts_with(&hex::encode(sha2::Sha256::digest(kubectl(tag)))),
            "{label}: kubectl link → {bin}: {bin_sum}"
        );
        assert_eq!(
            node.exec_ok(&["/opt/bin/kubectl"]).await.unwrap().trim(),
            format!("kubectl-{tag}"),
            "{label}"
        );
        let crictl_now = node
            .sh_ok(
                "if [ -L /opt/bin/crictl ] || [ -e /opt/bin/crictl ]; \
                 then /opt/bin/crictl || echo broken; else echo absent; fi",
            )
            .await
            .unwrap();
        let crictl_wanted = if self.committed_crictl {
            format!("crictl-{tag}")
        } else {
            "absent".to_owned()
        };
        assert_eq!(crictl_now.trim(), crictl_wanted, "{label}: /opt/bin/crictl");
        assert_eq!(
            node.exec_ok(&["cat", "/usr/lib/kubelet-flavor"])
                .await
                .unwrap()
                .trim(),
            "healthy",
            "{label}: the merged /usr is the committed image"
        );
        assert!(
            node.is_active("kubelet.service").await.unwrap(),
            "{label}: kubelet runs\n{}",
            self.real.diagnostics().await
        );
        if previous != tag {
            assert!(
                node.exists(format!(
                    "/opt/extensions/kubernetes/kubernetes-{previous}.raw"
                ))
                .await
                .unwrap(),
                "{label}: the previous revision ({previous}) is still on disk"
            );
        }
        let leftovers = node
            .sh_ok(
                "find /etc/extensions /opt/bin /opt/extensions -name '*.inplace-new*'; \
                 ls -A /var/lib/inplace/tmp 2>/dev/null || true",
            )
            .await
            .unwrap();
        assert!(
            leftovers.trim().is_empty(),
            "{label}: temporaries left: {leftovers}"
        );
        let status = self
            .real
            .api
            .get(node.name())
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(
            status.current_revision.as_deref(),
            Some(revision),
            "{label}: currentRevision"
        );
    }

    /// One case: from the committed revision to a new one, killed once on the way.
    async fn case(&mut self, kill: Kill, healthy: bool) {
        self.cases += 1;
        let tag = format!("c{}", self.cases);
        let label = format!("case {tag} ({kill:?}, healthy={healthy})");
        self.publish(&tag, healthy);
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
        // The point fired exactly when armed: the file is gone and systemd restarted the
        // agent. (A random kill may land after the final phase: it still must not harm.)
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
        self.injected += 1;
        self.real
            .node
            .wait_active("inplace-agent.service", Duration::from_secs(60))
            .await
            .unwrap();
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
        let status = self
            .real
            .api
            .get(self.real.node.name())
            .await
            .unwrap()
            .status
            .unwrap();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        let reason = if healthy { "Succeeded" } else { "RolledBack" };
        assert_eq!(ready.reason, reason, "{label}: {}", ready.message);
        eprintln!("{label}: ok");
    }
}

/// Boots the node against `test_api` with the shipped unit restarted after 1 s instead of
/// 10 s, and commits a first revision (no crash).
async fn boot(test_api: TestApi) -> Bed {
    let real = AgentNode::start_on(test_api, "crash", Some("[Service]\nRestartSec=1s\n")).await;
    // The kubelet stand-in: its binary comes from the kubernetes sysext.
    real.node
        .write_file(
            "/etc/systemd/system/kubelet.service",
            b"[Unit]\nDescription=kubelet stand-in from the kubernetes sysext\n[Service]\nExecStart=/usr/bin/kubelet-sim\nRestart=no\n",
            0o644,
        )
        .await
        .unwrap();
    let healthy = image(real.work.path(), "healthy", true).await;
    let broken = image(real.work.path(), "broken", false).await;
    let read = |img: &SysextImage| {
        let path = img.path.clone();
        let sha = img.sha256.clone();
        async move { (tokio::fs::read(&path).await.unwrap(), sha) }
    };
    let mut bed = Bed {
        real,
        healthy: read(&healthy).await,
        broken: read(&broken).await,
        committed: (String::new(), String::new()),
        committed_crictl: true,
        without_crictl: false,
        injected: 0,
        cases: 0,
    };
    let tag = "c0".to_owned();
    bed.publish(&tag, true);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_at_every_step_boundary_keeps_the_node_safe() {
    let long = std::env::var("INPLACE_CRASH_MATRIX").is_ok_and(|v| v == "long");
    let minimum: usize = std::env::var("INPLACE_CRASH_MATRIX_MIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut bed = boot(TestApi::start().await.expect("the API server starts")).await;
    let started = Instant::now();
    let rounds = if long { 3 } else { 1 };
    for _ in 0..rounds {
        for point in UPDATE_POINTS {
            bed.case(Kill::Point(point), true).await;
        }
        for point in ROLLBACK_POINTS {
            bed.case(Kill::Point(point), false).await;
        }
    }
    let randoms = if long {
        minimum.saturating_sub(bed.injected)
    } else {
        2
    };
    for i in 0..randoms {
        let delay = Duration::from_millis(rand::random_range(0..4000));
        bed.case(Kill::After(delay), i % 3 != 2).await;
    }
    eprintln!(
        "crash matrix: {} injected crashes ({} cases) in {:?}",
        bed.injected,
        bed.cases,
        started.elapsed()
    );
    if long {
        assert!(bed.injected >= minimum);
    }
    bed.real.node.poweroff().await.unwrap();
}

fn real_server(bed: &Bed) -> &inplace_tests::apiserver::ApiServer {
    bed.real.test_api.real().expect("the real server")
}

fn faults(bed: &Bed) -> &inplace_api_emulator::Faults {
    bed.real.test_api.emulator().expect("the emulator").faults()
}

/// A plan of `bed` whose health window is `window` (to land a kill in `Verifying`).
fn with_window(plan: NodeUpdatePlan, window: &str) -> NodeUpdatePlan {
    let mut value = serde_json::to_value(plan).unwrap();
    value["spec"]["healthChecks"]["window"] = window.into();
    serde_json::from_value(value).unwrap()
}

/// faults.md § Crashes: "API server unreachable for minutes ... keep the node safe from the
/// local journal ... report within seconds of recovery", with the real kube-apiserver
/// killed (SIGKILL) in the middle of an update (in its health window) and held down for a
/// minute: the node finishes the update from its journal alone, and once the server is back
/// (same port, etcd kept the data) the agent reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_killed_mid_update_on_a_real_node() {
    let mut bed = boot(TestApi::start().await.expect("the API server starts")).await;

    bed.cases += 1;
    let tag = format!("c{}", bed.cases);
    bed.publish(&tag, true);
    let plan = with_window(bed.plan(&tag, true), "10s");
    let revision = inplace_proto::revision_of(&plan.spec.content);
    bed.real.apply(&plan).await;
    bed.real
        .wait_final(Phase::Verifying, &revision, "verifying before the outage")
        .await;
    real_server(&bed).kill_apiserver().unwrap();
    let killed = Instant::now();
    eprintln!("kube-apiserver killed while the node verifies {revision}");

    // The node finishes the update from its journal while the API is gone.
    let expected = format!("/opt/extensions/kubernetes/kubernetes-{tag}.raw");
    let deadline = Instant::now() + real_node::PATIENCE;
    loop {
        let link = bed
            .real
            .node
            .exec_ok(&["readlink", "/etc/extensions/kubernetes.raw"])
            .await
            .unwrap();
        let journal: serde_json::Value = bed
            .real
            .node
            .read_file("/var/lib/inplace/journal.json")
            .await
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if link.trim() == expected
            && bed.real.node.is_active("kubelet.service").await.unwrap()
            && journal["committed"]["revision"].as_str() == Some(revision.as_str())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the update did not finish during the outage: link {link}\n{}",
            bed.real
                .node
                .journal("inplace-agent.service", 60)
                .await
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Down for a minute in all (standing for minutes): the status writer and the watch are
    // deep in their backoff when it returns.
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(killed.elapsed())).await;
    let still_down = bed.real.api.get(bed.real.node.name()).await;
    assert!(still_down.is_err(), "the server is down: {still_down:?}");
    real_server(&bed).resume().unwrap();
    let resumed = Instant::now();
    bed.real
        .wait_final(Phase::Succeeded, &revision, "after the outage")
        .await;
    // Reported, not asserted: the restart itself takes seconds to tens of seconds here.
    eprintln!(
        "status caught up {:?} after kube-apiserver was let up again",
        resumed.elapsed()
    );
    let previous = bed.committed.0.clone();
    bed.committed = (tag.clone(), revision.clone());
    bed.check_invariant(&tag, &revision, &previous, "outage")
        .await;
    bed.real.node.poweroff().await.unwrap();
}

/// faults.md § Crashes: "watch ends with 410 Gone; 409 on status write — relist, re-apply
/// status", on a real node. On the emulator: a real server answers 409 only to a write that
/// really raced another and 410 only after etcd compacted past the watch's resourceVersion,
/// so neither a storm of 409s nor a cut watch resumed into 410 can be made to happen at a
/// chosen moment there (`conflict_next_writes`, `gone_next_watches`, `cut_watches`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_storm_and_gone_watch_on_a_real_node() {
    let emulator = TestApi::start_emulator(EmulatorConfig {
        authz: AuthzMode::Rbac,
        ..EmulatorConfig::default()
    })
    .await
    .unwrap();
    let mut bed = boot(emulator).await;

    // A 409 storm on status writes, the watch cut and told 410 Gone: the next update is
    // seen (relist), applied and reported.
    faults(&bed).gone_next_watches(2);
    faults(&bed).cut_watches();
    bed.cases += 1;
    let tag = format!("c{}", bed.cases);
    bed.publish(&tag, true);
    let plan = bed.plan(&tag, true);
    let revision = inplace_proto::revision_of(&plan.spec.content);
    bed.real.apply(&plan).await;
    // The next 8 writes conflict (the agent's status writes; with backoff capped at 5 s
    // that is about 20 s of 409s).
    faults(&bed).conflict_next_writes(8);
    bed.real
        .wait_final(Phase::Succeeded, &revision, "after 409s and 410")
        .await;
    let previous = bed.committed.0.clone();
    bed.committed = (tag.clone(), revision.clone());
    bed.check_invariant(&tag, &revision, &previous, "409 storm")
        .await;
    bed.real.node.poweroff().await.unwrap();
}
