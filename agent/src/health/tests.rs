//! The Node checks: what each `Ready` status and each kubelet version makes of a sample,
//! one Node read per sample for both, and what a failed window says — also of a unit that
//! crash-loops while the Node is wrong.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use inplace_proto::Reason;

use super::{NodeReport, Plan, Probes, ReadyCondition, verify};
use crate::systemd::{ExtensionClass, SystemdError, SystemdManager, UnitState};

const VERSION: &str = "v1.31.2";

/// The API server's answers, one per read, in order; the last one repeats.
struct ScriptedNode {
    answers: Mutex<VecDeque<Result<NodeReport, String>>>,
    reads: Mutex<usize>,
}

impl ScriptedNode {
    fn new(answers: impl IntoIterator<Item = Result<NodeReport, String>>) -> Self {
        ScriptedNode {
            answers: Mutex::new(answers.into_iter().collect()),
            reads: Mutex::new(0),
        }
    }

    fn reads(&self) -> usize {
        *self.reads.lock().unwrap()
    }
}

#[async_trait]
impl Probes for ScriptedNode {
    async fn http_ok(&self, _url: &str) -> Result<(), String> {
        Ok(())
    }

    async fn node_status(&self) -> Result<NodeReport, String> {
        *self.reads.lock().unwrap() += 1;
        let mut answers = self.answers.lock().unwrap();
        if answers.len() > 1 {
            answers.pop_front().unwrap()
        } else {
            answers.front().cloned().expect("a scripted answer")
        }
    }
}

/// One service's states, one per read, in order; the last one repeats. Without any, every
/// unit is one systemd has not loaded (never active): a node without a kubelet unit.
#[derive(Default)]
struct ScriptedUnit {
    states: Mutex<VecDeque<UnitState>>,
}

impl ScriptedUnit {
    /// The kubelet's unit, running since `started` (the wall clock).
    fn kubelet_started(started: SystemTime) -> Self {
        let micros = started.duration_since(UNIX_EPOCH).unwrap().as_micros();
        let state = UnitState {
            active_state: "active".into(),
            sub_state: "running".into(),
            n_restarts: Some(0),
            active_enter_monotonic: 1,
            active_enter_realtime: u64::try_from(micros).unwrap(),
            invocation_id: "1".repeat(32),
        };
        ScriptedUnit {
            states: Mutex::new([state].into()),
        }
    }
}

#[async_trait]
impl SystemdManager for ScriptedUnit {
    async fn restart_unit(&self, unit: &str) -> Result<(), SystemdError> {
        unreachable!("restart {unit}")
    }
    async fn refresh_extensions(&self, _class: ExtensionClass) -> Result<(), SystemdError> {
        unreachable!("refresh")
    }
    async fn version(&self) -> Result<u32, SystemdError> {
        unreachable!("version")
    }
    async fn unmerge_extensions(&self, _class: ExtensionClass) -> Result<(), SystemdError> {
        unreachable!("unmerge")
    }
    async fn daemon_reload(&self) -> Result<(), SystemdError> {
        unreachable!("daemon-reload")
    }
    async fn chown(
        &self,
        paths: &[std::path::PathBuf],
        _: u32,
        _: u32,
    ) -> Result<(), SystemdError> {
        unreachable!("chown {paths:?}")
    }
    async fn unit_state(&self, _unit: &str) -> Result<UnitState, SystemdError> {
        let mut states = self.states.lock().unwrap();
        if states.len() > 1 {
            Ok(states.pop_front().unwrap())
        } else {
            Ok(states.front().cloned().unwrap_or(UnitState {
                active_state: "inactive".into(),
                sub_state: "dead".into(),
                ..UnitState::default()
            }))
        }
    }
}

fn node(version: Option<&str>, ready: Option<(&str, &str, &str)>) -> Result<NodeReport, String> {
    Ok(NodeReport {
        kubelet_version: version.map(str::to_owned),
        ready: ready.map(|(status, reason, message)| ReadyCondition {
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_heartbeat: None,
        }),
    })
}

fn ready() -> Result<NodeReport, String> {
    node(
        Some(VERSION),
        Some(("True", "KubeletReady", "kubelet is posting ready status")),
    )
}

/// A 10 s window within 30 s, sampled every second.
fn plan(kubelet_version: Option<&'static str>, node_ready: bool) -> Plan<'static> {
    Plan {
        units: &[],
        http: Vec::new(),
        kubelet_version,
        node_ready,
        window: Duration::from_secs(10),
        timeout: Duration::from_secs(30),
        interval: Duration::from_secs(1),
    }
}

/// Runs the checks on a paused clock, on a node without a kubelet unit; the failure's
/// message, or `None` when they passed.
async fn run(plan: &Plan<'_>, probes: &ScriptedNode) -> Option<String> {
    run_beside(plan, &ScriptedUnit::default(), probes).await
}

/// [`run`] with the units of `systemd`.
async fn run_beside(
    plan: &Plan<'_>,
    systemd: &ScriptedUnit,
    probes: &ScriptedNode,
) -> Option<String> {
    let progress = |_line: String| {};
    match verify(plan, systemd, probes, &progress).await {
        Ok(()) => None,
        Err(failure) => {
            assert_eq!(failure.reason, Reason::HealthCheckFailed);
            Some(failure.message)
        }
    }
}

#[tokio::test(start_paused = true)]
async fn node_ready_true_passes() {
    let probes = ScriptedNode::new([ready()]);
    assert_eq!(run(&plan(None, true), &probes).await, None);
}

/// Every Node the checks never pass against, and the end of the failure's message: the last
/// sample's problem.
#[tokio::test(start_paused = true)]
async fn a_node_that_is_not_ready_says_why() {
    let not_ready = |status: &str, reason: &str, message: &str| {
        node(Some(VERSION), Some((status, reason, message)))
    };
    let network = "container runtime network not ready: NetworkReady=false";
    let forbidden = "nodes \"worker-1\" is forbidden: node 'worker-1' cannot read 'worker-1'";
    let cases = [
        (
            "False",
            plan(None, true),
            not_ready("False", "KubeletNotReady", network),
            format!("the Node is not Ready (False, KubeletNotReady: {network})"),
        ),
        (
            "Unknown",
            plan(None, true),
            not_ready(
                "Unknown",
                "NodeStatusUnknown",
                "Kubelet stopped posting node status.",
            ),
            "the Node is not Ready (Unknown, NodeStatusUnknown: Kubelet stopped posting node status.)"
                .into(),
        ),
        (
            "no reason or message",
            plan(None, true),
            not_ready("False", "", ""),
            "the Node is not Ready (False)".into(),
        ),
        (
            "no Ready condition",
            plan(None, true),
            node(Some(VERSION), None),
            "the Node has no Ready condition".into(),
        ),
        (
            "API error",
            plan(None, true),
            Err(forbidden.to_owned()),
            format!("cannot read the Node: {forbidden}"),
        ),
        (
            "the wrong kubelet, not Ready: the version is named first",
            plan(Some(VERSION), true),
            node(Some("v1.31.1"), Some(("False", "KubeletNotReady", "starting"))),
            "the node reports kubelet v1.31.1, expected v1.31.2".into(),
        ),
        (
            "the new kubelet reported its version, not yet Ready",
            plan(Some(VERSION), true),
            not_ready("False", "KubeletNotReady", "starting"),
            "the Node is not Ready (False, KubeletNotReady: starting)".into(),
        ),
    ];
    for (case, plan, answer, want) in cases {
        let probes = ScriptedNode::new([answer]);
        let message = run(&plan, &probes).await.expect(case);
        assert!(
            message.starts_with("not healthy for a whole window"),
            "{case}: {message}"
        );
        assert!(
            message.ends_with(&want),
            "{case}: {message}\nwanted the end {want:?}"
        );
    }
}

/// A Ready that drops during the window starts the window again: it must hold throughout.
#[tokio::test(start_paused = true)]
async fn node_ready_must_hold_for_the_whole_window() {
    let not_ready = node(
        Some(VERSION),
        Some(("False", "KubeletNotReady", "PLEG is not healthy")),
    );
    // Ready for 5 samples, not Ready for one, then Ready: passes 10 s after the drop.
    let script = std::iter::repeat_n(ready(), 5)
        .chain([not_ready])
        .chain([ready()]);
    let probes = ScriptedNode::new(script);
    let start = tokio::time::Instant::now();
    assert_eq!(run(&plan(None, true), &probes).await, None);
    assert!(
        start.elapsed() >= Duration::from_secs(16),
        "passed after {:?}, across the drop",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn node_checks_read_the_node_once_per_sample() {
    let probes = ScriptedNode::new([ready()]);
    assert_eq!(run(&plan(Some(VERSION), true), &probes).await, None);
    // 11 samples, one a second, make the 10 s window: one read each, not two.
    assert_eq!(probes.reads(), 11);
}

#[tokio::test(start_paused = true)]
async fn without_node_checks_the_node_is_not_read() {
    let probes = ScriptedNode::new([Err("must not be read".to_owned())]);
    assert_eq!(run(&plan(None, false), &probes).await, None);
    assert_eq!(probes.reads(), 0);
}

/// The version check alone ignores Ready, as before nodeReady.
#[tokio::test(start_paused = true)]
async fn the_kubelet_version_alone_ignores_ready() {
    let probes = ScriptedNode::new([node(
        Some(VERSION),
        Some(("False", "KubeletNotReady", "starting")),
    )]);
    assert_eq!(run(&plan(Some(VERSION), false), &probes).await, None);
}

/// nodeReady alone does not look at the kubelet version.
#[tokio::test(start_paused = true)]
async fn node_ready_alone_ignores_the_kubelet_version() {
    let probes = ScriptedNode::new([node(
        None,
        Some(("True", "KubeletReady", "kubelet is posting ready status")),
    )]);
    assert_eq!(run(&plan(None, true), &probes).await, None);
}

#[test]
fn node_report_of_a_node_object() {
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "worker-1"},
        "status": {
            "nodeInfo": {"kubeletVersion": VERSION, "architecture": "amd64", "bootID": "",
                "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
                "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                 "message": "container runtime network not ready",
                 "lastHeartbeatTime": "2026-11-30T03:40:05Z"},
            ],
        },
    }))
    .unwrap();
    assert_eq!(
        NodeReport::of(node),
        NodeReport {
            kubelet_version: Some(VERSION.into()),
            ready: Some(ReadyCondition {
                status: "False".into(),
                reason: "KubeletNotReady".into(),
                message: "container runtime network not ready".into(),
                last_heartbeat: Some(UNIX_EPOCH + Duration::from_secs(1_796_010_005)),
            }),
        }
    );
    let bare: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "worker-1"}})).unwrap();
    assert_eq!(NodeReport::of(bare), NodeReport::default());
}

/// A kubelet whose new flags it refuses, under `Restart=always` and `RestartSec=1`: up for a
/// moment each second, so any sample may find it `active` on a new invocation (no restart seen
/// within the window) while the Node still reports the old kubelet. The failure must name the
/// unit's restarts, whichever problem the last sample saw. Before, the message ended with the
/// kubelet version alone (kube_rollouts' broken-kubelet test failed on this in CI).
#[tokio::test(start_paused = true)]
async fn a_crash_looping_unit_is_named_whatever_the_last_sample_saw() {
    let state = |active: &str, sub: &str, restarts: u32| UnitState {
        active_state: active.into(),
        sub_state: sub.into(),
        n_restarts: Some(restarts),
        active_enter_monotonic: u64::from(restarts),
        active_enter_realtime: 0,
        invocation_id: format!("{restarts:032x}"),
    };
    // Down and up in turns, 14 restarts in all (0 to 14); the last reads find it up.
    let loop_states = (1..=14).flat_map(|n| {
        [
            state("activating", "auto-restart", n - 1),
            state("active", "running", n),
        ]
    });
    let systemd = ScriptedUnit {
        states: Mutex::new(loop_states.collect()),
    };
    let units = ["kubelet.service".to_owned()];
    let plan = Plan {
        units: &units,
        ..plan(Some(VERSION), true)
    };
    let probes = ScriptedNode::new([node(
        Some("v1.31.1"),
        Some(("True", "KubeletReady", "kubelet is posting ready status")),
    )]);
    let progress = |_line: String| {};
    let failure = verify(&plan, &systemd, &probes, &progress)
        .await
        .expect_err("the old kubelet never passes");
    assert_eq!(failure.reason, Reason::HealthCheckFailed);
    assert!(
        failure.message.ends_with(
            "the node reports kubelet v1.31.1, expected v1.31.2; \
             kubelet.service restarted 14 times meanwhile"
        ),
        "{}",
        failure.message
    );
}

/// 2026-11-30T03:40:03.250Z, when the kubelet of the tests below started.
fn kubelet_start() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(1_796_010_003_250)
}

/// A Ready Node on [`VERSION`] whose status the kubelet posted at `heartbeat` (seconds since
/// the epoch).
fn ready_posted_at(heartbeat: u64) -> Result<NodeReport, String> {
    let mut report = ready()?;
    if let Some(ready) = report.ready.as_mut() {
        ready.last_heartbeat = Some(UNIX_EPOCH + Duration::from_secs(heartbeat));
    }
    Ok(report)
}

/// A kubelet restarted into flags it refuses, at the same version: the Node still shows the
/// status the kubelet before it posted, `Ready` on the expected version, until the node
/// lifecycle controller notices, 40 s or more later. Before, a plan with the Node checks
/// alone passed its window on that status and committed the broken kubelet (the demo's
/// broken release did, in a fresh clone's run of 348079f).
#[tokio::test(start_paused = true)]
async fn a_status_posted_before_the_kubelet_started_is_not_counted() {
    let systemd = ScriptedUnit::kubelet_started(kubelet_start());
    for (case, plan) in [
        ("both Node checks", plan(Some(VERSION), true)),
        ("the version alone", plan(Some(VERSION), false)),
        ("Ready alone", plan(None, true)),
    ] {
        let probes = ScriptedNode::new([ready_posted_at(1_796_010_002)]);
        let message = run_beside(&plan, &systemd, &probes).await.expect(case);
        assert!(
            message.ends_with(
                "the Node's status was posted at 2026-11-30T03:40:02Z (its Ready heartbeat), \
                 before kubelet.service started at 2026-11-30T03:40:03.250Z: waiting for the \
                 running kubelet to post its own"
            ),
            "{case}: {message}"
        );
    }
    let no_heartbeat = ScriptedNode::new([ready()]);
    let message = run_beside(&plan(None, true), &systemd, &no_heartbeat).await;
    assert!(message.is_some_and(|m| m.ends_with(
        "the Node's Ready condition has no heartbeat to show it was posted after \
             kubelet.service started at 2026-11-30T03:40:03.250Z"
    )),);
}

/// The heartbeat has whole seconds: one stamped with the second the kubelet started in
/// counts, for the kubelet may post nothing more for minutes (the crash matrix's real
/// kubelet posted within 0.9 s of its start and then for longer than its 60 s timeout).
#[tokio::test(start_paused = true)]
async fn the_running_kubelets_own_status_counts_from_the_second_it_started_in() {
    let systemd = ScriptedUnit::kubelet_started(kubelet_start());
    let before = std::iter::repeat_n(ready_posted_at(1_796_010_002), 4);
    let probes = ScriptedNode::new(before.chain([ready_posted_at(1_796_010_003)]));
    let start = tokio::time::Instant::now();
    assert_eq!(
        run_beside(&plan(Some(VERSION), true), &systemd, &probes).await,
        None
    );
    assert!(
        start.elapsed() >= Duration::from_secs(14),
        "the window began with the fifth sample: passed after {:?}",
        start.elapsed()
    );
}
