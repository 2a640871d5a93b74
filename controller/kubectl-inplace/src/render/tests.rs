#![allow(clippy::unwrap_used)]
use super::*;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

fn plan(name: &str, status: serde_json::Value) -> NodeUpdatePlan {
    serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan",
        "metadata": {"name": name, "labels": {"inplace.dev/rollout": "demo"}},
        "spec": {
            "nodeName": name, "revision": "abcdef0123456789", "release": "kubelet-v2",
            "desiredState": "Active",
            "artifacts": [{"name": "kubernetes", "type": "Sysext",
                "url": "http://127.0.0.1:1/v2/kubernetes-v2.raw",
                "sha256": "a".repeat(64), "size": 2097152}],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"units": ["kubelet.service"], "window": "5s", "timeout": "2m"},
        },
        "status": status,
    }))
    .unwrap()
}

fn rollout(status: serde_json::Value) -> NodeRollout {
    serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": "demo"},
        "spec": {"release": "kubelet-v2", "maxUnavailable": 1, "disruption": "Cordon"},
        "status": status,
    }))
    .unwrap()
}

#[test]
fn bars_and_sizes() {
    assert_eq!(bar(0, 0, 10), "[----------]   0%");
    assert_eq!(bar(5, 10, 10), "[#####-----]  50%");
    assert_eq!(bar(12, 10, 10), "[##########] 100%");
    assert_eq!(human_bytes(512), "512 B");
    assert_eq!(human_bytes(1536), "1.5 KiB");
    assert_eq!(human_bytes(3 * 1024 * 1024), "3.0 MiB");
    assert_eq!(
        human_duration(std::time::Duration::from_millis(4200)),
        "4.2s"
    );
    assert_eq!(human_duration(std::time::Duration::from_secs(65)), "1m05s");
}

#[test]
fn downloading_node_shows_bytes_and_bar() {
    let p = plan(
        "node-1",
        json!({"phase": "Downloading", "targetRevision": "abcdef0123456789",
               "artifacts": [{"name": "kubernetes", "bytesDone": 1048576, "bytesTotal": 2097152}],
               "conditions": [{"type": "Ready", "status": "False", "reason": "Downloading",
                 "message": "kubernetes 50%", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    );
    let line = plan_line(&p, 6, &Style::plain());
    assert_eq!(
        line,
        "  node-1  Downloading  [##########----------]  50%    1.0 MiB / 2.0 MiB    Downloading: kubernetes 50%"
    );
}

#[test]
fn a_plan_whose_revision_the_agent_has_not_seen_is_pending() {
    let p = plan(
        "node-1",
        json!({"phase": "Succeeded", "targetRevision": "0000", "currentRevision": "0000"}),
    );
    assert_eq!(effective_phase(&p), Phase::Pending);
    let line = plan_line(&p, 6, &Style::plain());
    assert!(line.contains("Pending"), "{line}");
    assert!(
        line.contains("waiting for the agent to pick up revision abcdef01"),
        "{line}"
    );
    let done = plan(
        "node-2",
        json!({"phase": "Succeeded", "targetRevision": "abcdef0123456789", "currentRevision": "abcdef0123456789"}),
    );
    assert_eq!(effective_phase(&done), Phase::Succeeded);
}

#[test]
fn a_degraded_node_that_runs_the_revision_is_failed_not_succeeded() {
    // A rollback failed; the committed revision is the plan's. The node needs a person.
    let p = plan(
        "node-1",
        json!({"phase": "Failed", "targetRevision": "abcdef0123456789", "currentRevision": "abcdef0123456789",
               "conditions": [{"type": "Degraded", "status": "True", "reason": "RollbackFailed",
                 "message": "needs a person", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    );
    assert_eq!(effective_phase(&p), Phase::Failed);
}

#[test]
fn a_report_for_an_older_generation_of_the_plan_is_pending() {
    let mut p = plan(
        "node-1",
        json!({"phase": "Failed", "targetRevision": "abcdef0123456789", "observedGeneration": 1}),
    );
    p.metadata.generation = Some(2);
    assert_eq!(effective_phase(&p), Phase::Pending);
    p.metadata.generation = Some(1);
    assert_eq!(effective_phase(&p), Phase::Failed);
}

#[test]
fn rollout_view_has_a_bar_and_one_line_per_owned_node() {
    let plans = vec![
        plan(
            "node-2",
            json!({"phase": "Verifying", "targetRevision": "abcdef0123456789",
            "conditions": [{"type": "Ready", "status": "False", "reason": "Verifying",
              "message": "kubelet.service healthy for 2s of 5s", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
        ),
        plan(
            "node-1",
            json!({"phase": "Succeeded", "targetRevision": "abcdef0123456789", "currentRevision": "abcdef0123456789"}),
        ),
    ];
    let r = rollout(json!({"revision": "abcdef0123456789",
        "nodes": {"total": 2, "succeeded": 1, "updating": 1, "staged": 0, "pending": 0, "failed": 0}}));
    let lines = rollout_lines(&r, &plans, &Style::plain());
    assert_eq!(
        lines[0],
        "NodeRollout demo → release kubelet-v2 (revision abcdef01), maxUnavailable 1, disruption Cordon"
    );
    assert!(
        lines[1].contains("[##########----------]  50%  1/2 nodes succeeded"),
        "{}",
        lines[1]
    );
    assert!(lines[2].contains("node-1  Succeeded"), "{lines:?}");
    assert!(lines[3].contains("node-2  Verifying"), "{lines:?}");
    assert!(
        lines[3].contains("kubelet.service healthy for 2s of 5s"),
        "{lines:?}"
    );
    assert!(lines.iter().all(|l| !l.contains('\x1b')));
    let mut moved = r.clone();
    moved.metadata.generation = Some(2);
    moved.status.as_mut().unwrap().observed_generation = Some(1);
    let stale = rollout_lines(&moved, &plans, &Style::plain());
    assert!(
        stale[1].contains("1/2 nodes succeeded") && !stale[0].contains("revision"),
        "a status for an older generation is not shown: {stale:?}"
    );
    let coloured = rollout_lines(&r, &plans, &Style::for_terminal(true));
    assert!(coloured.iter().any(|l| l.contains("\x1b[32mSucceeded")));
}

/// A node passed over for its architecture (issue 39): the status says how many were
/// skipped and why, in the words of the rollout's `NodesUnsupported` condition.
#[test]
fn nodes_passed_over_for_their_architecture_are_counted_and_named() {
    let r = rollout(json!({"revision": "abcdef0123456789",
        "nodes": {"total": 2, "succeeded": 1, "updating": 0, "staged": 0, "pending": 0,
                  "failed": 0, "skipped": 1},
        "conditions": [{"type": "NodesUnsupported", "status": "True",
            "reason": "ArchitectureUnsupported",
            "message": "1 selected nodes passed over, the release has no build for their kubernetes.io/arch (release \"kubelet-v2\" is built for amd64): arm-1 (arm64); they keep the revision they run and are counted as skipped",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}));
    let lines = rollout_lines(&r, &[], &Style::plain());
    assert!(lines[1].ends_with(", failed 0, skipped 1"), "{lines:?}");
    assert_eq!(
        lines[2],
        "  NodesUnsupported=True ArchitectureUnsupported: 1 selected nodes passed over, the release has no build for their kubernetes.io/arch (release \"kubelet-v2\" is built for amd64): arm-1 (arm64); they keep the revision they run and are counted as skipped"
    );
}

#[test]
fn explain_a_rolled_back_plan() {
    let p = plan(
        "node-1",
        json!({"phase": "RolledBack", "targetRevision": "abcdef0123456789",
               "currentRevision": "1111111122222222",
               "failedRevisions": ["abcdef0123456789"], "attempts": 1,
               "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:30Z",
               "conditions": [{"type": "Ready", "status": "False", "reason": "RolledBack",
                 "message": "HealthCheckFailed: kubelet.service failed", "lastTransitionTime": "2026-01-01T00:00:30Z"}]}),
    );
    let now: Timestamp = "2026-01-01T00:01:30Z".parse().unwrap();
    let text = plan_explain(&p, now, &Style::plain()).join("\n");
    for want in [
        "NodeUpdatePlan node-1",
        "owner:         NodeRollout demo",
        "release:       kubelet-v2",
        "desired state: Active (swap, restart and verify)",
        "kubernetes (Sysext, 2.0 MiB, sha256 aaaaaaaa)",
        "health checks: unit kubelet.service (healthy for 5s, give up after 2m)",
        "phase:         RolledBack",
        "current:       1111111122222222",
        "denied revisions: abcdef0123456789",
        "Ready=False RolledBack: HealthCheckFailed: kubelet.service failed",
        "RolledBack means:",
        "finished:      2026-01-01T00:00:30Z (1m00s ago)",
        "next: The revision is denied on node-1",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn explain_names_the_node_checks() {
    let mut p = plan("node-1", json!(null));
    p.spec.content.kubernetes_version = Some("v1.31.2".into());
    p.spec.content.health_checks.node_kubelet_version = true;
    p.spec.content.health_checks.node_ready = true;
    let now: Timestamp = "2026-01-01T00:01:30Z".parse().unwrap();
    let text = plan_explain(&p, now, &Style::plain()).join("\n");
    let want = "health checks: unit kubelet.service, Node kubeletVersion, Node Ready (healthy for 5s, give up after 2m)";
    assert!(text.contains(want), "missing {want:?} in\n{text}");
}

#[test]
fn slots_used_by_others_are_one_line() {
    let r = rollout(json!({"revision": "abcdef0123456789",
        "nodes": {"total": 3, "succeeded": 0, "updating": 0, "staged": 1, "pending": 0, "failed": 0},
        "foreignDisruptions": [{"node": "worker-4", "why": "cordoned"},
                               {"node": "worker-9", "why": "NotReady (Ready=Unknown)"}]}));
    let lines = rollout_lines(&r, &[], &Style::plain());
    assert!(
        lines.contains(
            &"  2 slots used by others: worker-4 cordoned, worker-9 NotReady (Ready=Unknown)"
                .to_owned()
        ),
        "{lines:?}"
    );
}
