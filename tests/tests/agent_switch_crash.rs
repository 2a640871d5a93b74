//! The agent switch's power-loss table (docs/design/agent-self-update.md, "Power loss at
//! every step") as crash-matrix cases with real processes: one systemd 252 node running the
//! agent from its own sysext image against the real kube-apiserver, two agent versions built
//! with the `failpoints` feature (agent/src/failpoints.rs), switching from one to the other
//! in turn, so that each case starts from the committed state the previous one left.
//!
//! A case arms one named point and orders the switch; the process that passes the point
//! SIGKILLs itself there. Then either systemd restarts it (a kill: `RestartSec=1s` here), or
//! the whole node loses power at that moment (the unit is kept from restarting until the
//! point fired, then every process of the node is killed and `/run` lost, and the node boots
//! again from the same root: the table's "at boot" column). The guard's own point
//! (`guard.relinked`) is read from the state directory; the guard cases order an agent that
//! exits 1 at start, so the guard must restore the previous one.
//!
//! After each case the invariant: the plan `Succeeded` on the new version, or `RolledBack`
//! on the old one with the revision denied; exactly one agent process, and it runs the
//! version the link, the journal and the status name; no `pending.json`, `restoring.json`
//! or `rolled-back.json` left; the kubelet never restarted (within the boot); the point
//! really fired (its file is gone, which only a matching `hit` does).
//!
//! Needs root, systemd-nspawn, debootstrap and squashfs-tools.

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use inplace_proto::{NodeUpdatePlan, Phase};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::nspawn::{Node, NodeOptions};

use inplace_tests::agent_images::{
    Behaviour, ReleaseKey, agent_binary_at, agent_image, sha256_hex,
};
use support::packaging::{PATIENCE, api_for_agents};
use support::switch_node::{install_agent, kubelet_start, order, wait_phase};

const SELF_UPDATE: &str = "/var/lib/inplace/self-update";
/// The guard's deadline for the new agent, in seconds.
const CONFIRM_TIMEOUT: u64 = 20;
const DROP_INS: &str = "/etc/systemd/system/inplace-agent.service.d";

/// How a case stops the process at its point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL; systemd restarts the agent (or the path unit the guard).
    Kill,
    /// SIGKILL, then the node's power cut before anything restarts, and the node booted
    /// again after `down`.
    PowerCut { down: Duration },
}

/// The power-loss table's rows, in the order they run. Each names the point, the fault and
/// whether the ordered agent works (else the guard must restore the running one).
const CASES: &[(&str, Fault, bool)] = &[
    // The guard's row first: killed after it re-pointed the link, run again by its path
    // unit from restoring.json.
    ("guard.relinked", Fault::Kill, false),
    ("switch.begin", Fault::Kill, true),
    ("switch.armed", Fault::Kill, true),
    ("switch.relinked", Fault::Kill, true),
    ("switch.proved", Fault::Kill, true),
    ("switch.disarmed", Fault::Kill, true),
    ("switch.committed", Fault::Kill, true),
    // Row 1: lost after the journal, before pending.json.
    ("switch.begin", CUT, true),
    // Row 2: lost after pending.json, before the link swap (the guard starts at boot too).
    ("switch.armed", CUT, true),
    // Row 3: lost after the link swap: the new agent merged at boot confirms.
    ("switch.relinked", CUT, true),
    // Row 7a: lost after pending.json's removal, before the journal commit.
    ("switch.disarmed", CUT, true),
];
const CUT: Fault = Fault::PowerCut {
    down: Duration::from_secs(1),
};

struct Bed {
    node: Node,
    plans: kube::Api<NodeUpdatePlan>,
    server: ArtifactServer,
    key: ReleaseKey,
    out: tempfile::TempDir,
    /// The two working versions and their images; `running` indexes the one that runs.
    agents: [(String, PathBuf); 2],
    running: usize,
    /// The kubelet's main process start (within the current boot).
    kubelet: String,
    cases: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_power_loss_table_ends_on_one_agent() {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");
    let base = env!("CARGO_PKG_VERSION");
    let out = tempfile::tempdir().unwrap();
    let agents = [1, 2].map(|n| {
        let version = format!("{base}-crash.{n}");
        let dir = out.path().join(format!("crash-{n}"));
        let binary = agent_binary_at(&version).unwrap();
        let image = agent_image(Behaviour::Works, &binary, &version, &dir, "").unwrap();
        (version, image)
    });
    let (test_api, plans) = api_for_agents().await;
    let server = ArtifactServer::start().await.unwrap();
    let key = ReleaseKey::generate().unwrap();
    let node = Node::boot(&Node::unique_name("switchcrash"), NodeOptions::default())
        .await
        .expect("node boots");
    install_agent(
        &node,
        &test_api,
        &key,
        &server.url("/"),
        &agents[0].1,
        CONFIRM_TIMEOUT,
        // The two versions switch back and forth: every other switch is to a lower one.
        true,
    )
    .await;
    node.write_file(
        format!("{DROP_INS}/50-crash-matrix.conf"),
        b"[Service]\nRestartSec=1s\n",
        0o644,
    )
    .await
    .unwrap();
    node.sh_ok("systemctl daemon-reload").await.unwrap();
    let kubelet = kubelet_start(&node).await;
    let mut bed = Bed {
        node,
        plans,
        server,
        key,
        out,
        agents,
        running: 0,
        kubelet,
        cases: 0,
    };

    for &(point, fault, works) in CASES {
        let started = Instant::now();
        bed.case(point, fault, works).await;
        eprintln!(
            "switchcrash: {point} {fault:?} (new agent works: {works}) took {:?}",
            started.elapsed()
        );
    }
    bed.the_guard_grants_its_deadline_after_a_power_loss().await;
    eprintln!("switchcrash: {} cases", bed.cases);
    bed.node.poweroff().await.unwrap();
}

impl Bed {
    /// One case: arm `point`, order a switch (to the other working version, or to an agent
    /// that exits 1 when `!works`), stop the process there by `fault`, and check the
    /// invariant once the plan settled.
    async fn case(&mut self, point: &str, fault: Fault, works: bool) {
        self.cases += 1;
        let label = format!("case {} ({point}, {fault:?})", self.cases);
        let failpoints = failpoint_file(point);
        if let Fault::PowerCut { .. } = fault {
            self.node
                .hold_restarts("inplace-agent.service", true)
                .await
                .unwrap();
        }
        self.node
            .write_file(&failpoints, format!("{point}\n").as_bytes(), 0o600)
            .await
            .unwrap();
        let (revision, next) = self
            .order_switch(works, &format!("case-{}", self.cases))
            .await;
        if let Fault::PowerCut { down } = fault {
            if let Err(e) = self
                .node
                .wait_fired(&failpoints, "inplace-agent.service", PATIENCE)
                .await
            {
                panic!("{label}: {e}");
            }
            self.node
                .hold_restarts("inplace-agent.service", false)
                .await
                .unwrap();
            self.node
                .power_cut_and_boot(down)
                .await
                .expect("boots again");
            self.kubelet = kubelet_start(&self.node).await;
        }
        let phase = if works {
            Phase::Succeeded
        } else {
            Phase::RolledBack
        };
        let status = wait_phase(&self.plans, &self.node, &revision, phase).await;
        if works {
            self.running = next;
        }
        self.check_invariant(&revision, &status, &label).await;
        assert!(
            !self.node.exists(&failpoints).await.unwrap(),
            "{label}: the point never fired"
        );
    }

    /// Writes the plan for the other working version (`works`) or for an agent that exits
    /// 1 at start; returns the revision and the index of the version ordered.
    async fn order_switch(&self, works: bool, case: &str) -> (String, usize) {
        let next = 1 - self.running;
        let broken;
        let (image, version) = if works {
            (&self.agents[next].1, self.agents[next].0.as_str())
        } else {
            let version = format!("{}-exits", self.agents[self.running].0);
            let dir = self.out.path().join(case);
            let script = PathBuf::from("/bin/false"); // unused: the image carries a script
            broken = (
                agent_image(Behaviour::ExitsAtStart, &script, &version, &dir, "").unwrap(),
                version,
            );
            (&broken.0, broken.1.as_str())
        };
        let revision = order(
            &self.plans,
            &self.node,
            &self.server,
            &self.key,
            (image, version),
            case,
        )
        .await;
        (revision, next)
    }

    /// The plan settled: one agent runs, the version of `self.running`, which the link,
    /// the journal and the status agree on; the guard's files are gone; the kubelet runs
    /// on.
    async fn check_invariant(
        &self,
        revision: &str,
        status: &inplace_proto::NodeUpdatePlanStatus,
        label: &str,
    ) {
        let (version, image) = &self.agents[self.running];
        let node = &self.node;
        self.wait_guard_done(label).await;
        assert_eq!(
            status.agent_version.as_deref(),
            Some(version.as_str()),
            "{label}: {status:?}"
        );
        let pids = node
            .sh_ok("grep -lx inplace-agent /proc/[0-9]*/comm || true")
            .await
            .unwrap();
        assert_eq!(pids.lines().count(), 1, "{label}: agent processes: {pids}");
        let running = node
            .sh_ok(
                "pid=$(systemctl show -p MainPID --value inplace-agent) && /proc/$pid/exe --version",
            )
            .await
            .unwrap();
        assert_eq!(
            running.trim(),
            format!("inplace-agent {version}"),
            "{label}: the running process"
        );
        let link = node
            .sh_ok("sha256sum \"$(readlink -f /etc/extensions/inplace-agent.raw)\"")
            .await
            .unwrap();
        let want = sha256_hex(&std::fs::read(image).unwrap());
        assert!(link.starts_with(&want), "{label}: the link: {link}");
        let journal: serde_json::Value = serde_json::from_slice(
            &node
                .read_file("/var/lib/inplace/journal.json")
                .await
                .unwrap(),
        )
        .unwrap();
        assert!(
            journal
                .get("inFlight")
                .is_none_or(serde_json::Value::is_null),
            "{label}: {journal}"
        );
        if status.phase == Some(Phase::Succeeded) {
            assert_eq!(
                journal["agent"]["version"],
                version.as_str(),
                "{label}: {journal}"
            );
            assert_eq!(journal["agent"]["revision"], revision, "{label}: {journal}");
            assert_eq!(status.current_revision.as_deref(), Some(revision));
        } else {
            // Still the build of the last confirmed switch (none before the first).
            let last = &journal["agent"]["version"];
            assert!(
                last.is_null() || last == version.as_str(),
                "{label}: {journal}"
            );
            assert!(
                status.failed_revisions.iter().any(|r| r == revision),
                "{label}: the revision is not denied: {status:?}"
            );
        }
        for file in ["pending.json", "restoring.json", "rolled-back.json"] {
            assert!(
                !node.exists(format!("{SELF_UPDATE}/{file}")).await.unwrap(),
                "{label}: {file} left"
            );
        }
        assert_eq!(
            kubelet_start(node).await,
            self.kubelet,
            "{label}: the kubelet was restarted"
        );
    }

    /// The guard's unit has nothing left to do (it looks every 5 s until it sees the
    /// switch confirmed).
    async fn wait_guard_done(&self, label: &str) {
        let deadline = Instant::now() + PATIENCE;
        while self
            .node
            .is_active("inplace-agent-guard.service")
            .await
            .unwrap()
        {
            assert!(Instant::now() < deadline, "{label}: the guard runs on");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// "After a reboot the guard grants at least confirm_timeout from its own start": the
    /// power goes right after the link swap to an agent that exits 1, and stays off past the
    /// deadline. At boot the guard must still wait `CONFIRM_TIMEOUT` before it claims the
    /// restore; then the previous agent reports RolledBack.
    async fn the_guard_grants_its_deadline_after_a_power_loss(&mut self) {
        let down = Duration::from_secs(CONFIRM_TIMEOUT + 5);
        self.case("switch.relinked", Fault::PowerCut { down }, false)
            .await;
        let log = self
            .node
            .sh_ok("journalctl -b -o short-unix -u inplace-agent-guard.service --no-pager")
            .await
            .unwrap();
        let at = |needle: &str| -> f64 {
            let line = log
                .lines()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no {needle:?} in the guard's log:\n{log}"));
            line.split_whitespace().next().unwrap().parse().unwrap()
        };
        let waited = at("claiming the restore") - at("Started");
        assert!(
            waited >= CONFIRM_TIMEOUT as f64 - 1.0,
            "the guard claimed the restore {waited} s after its start:\n{log}"
        );
    }
}

/// Where `point` is armed: the agent's next to its lock file (`/run/inplace`), the guard's
/// in its state directory (`/run` is read-only under its unit).
fn failpoint_file(point: &str) -> String {
    if point.starts_with("guard.") {
        format!("{SELF_UPDATE}/failpoints")
    } else {
        "/run/inplace/failpoints".to_owned()
    }
}
