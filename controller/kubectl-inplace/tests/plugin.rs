//! `kubectl-inplace` against the real kube-apiserver (or the emulator with
//! `INPLACE_TEST_API=emulator`): the binary with a kubeconfig, as kubectl runs a plugin, and
//! `--watch` re-rendering on watch events.

use crate::support;

use std::path::Path;
use std::time::Duration;

use inplace_proto::{NodeRollout, NodeUpdatePlan};
use inplace_tests::test_api::{TestApi, packaging};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kubectl_inplace::render::Style;
use kubectl_inplace::{Watched, watch};
use serde_json::{Value, json};
use support::plugin;

const REV: &str = "abcdef0123456789abcdef0123456789";

async fn cluster() -> (TestApi, kube::Client) {
    let api = TestApi::start_shared().await.unwrap();
    api.apply_crd_dir(&packaging("crds")).await.unwrap();
    let client = api.client().await.unwrap();
    (api, client)
}

fn plan_json(name: &str) -> Value {
    json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan",
        "metadata": {"name": name, "labels": {"inplace.dev/rollout": "workers"}},
        "spec": {
            "nodeName": name, "revision": REV, "release": "kubelet-v2", "desiredState": "Active",
            "artifacts": [{"name": "kubernetes", "type": "Sysext",
                "url": "http://127.0.0.1:9/kubernetes/kubernetes-v2.raw",
                "sha256": "b".repeat(64), "size": 4194304}],
            "activation": {"restartUnits": ["kubelet.service"]},
            "healthChecks": {"units": ["kubelet.service"], "window": "5s", "timeout": "3m"},
        }
    })
}

async fn set_status(client: &kube::Client, name: &str, status: Value) {
    Api::<NodeUpdatePlan>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
}

fn ready(reason: &str, message: &str) -> Value {
    json!([{"type": "Ready", "status": "False", "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z"}])
}

async fn fleet(client: &kube::Client) {
    let rollout: NodeRollout = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": "workers"},
        "spec": {"release": "kubelet-v2", "maxUnavailable": 1, "disruption": "Cordon"},
    }))
    .unwrap();
    let rollouts = Api::<NodeRollout>::all(client.clone());
    rollouts
        .create(&PostParams::default(), &rollout)
        .await
        .unwrap();
    rollouts
        .patch_status(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"revision": REV,
                "nodes": {"total": 2, "succeeded": 0, "updating": 1, "staged": 0, "pending": 1, "failed": 0}}})),
        )
        .await
        .unwrap();
    let plans = Api::<NodeUpdatePlan>::all(client.clone());
    for name in ["node-a", "node-b"] {
        let plan: NodeUpdatePlan = serde_json::from_value(plan_json(name)).unwrap();
        plans.create(&PostParams::default(), &plan).await.unwrap();
    }
    set_status(
        client,
        "node-a",
        json!({"phase": "Downloading", "targetRevision": REV,
               "artifacts": [{"name": "kubernetes", "bytesDone": 1048576, "bytesTotal": 4194304}],
               "conditions": ready("Downloading", "kubernetes: 1.0 MiB of 4.0 MiB")}),
    )
    .await;
    set_status(
        client,
        "node-b",
        json!({"phase": "RolledBack", "targetRevision": REV, "currentRevision": "1234567890abcdef",
               "failedRevisions": [REV], "attempts": 1,
               "conditions": ready("RolledBack", "HealthCheckFailed: kubelet.service restarted during the window")}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_plan_through_the_binary() {
    let (api, client) = cluster().await;
    fleet(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let (api, path) = (&api, dir.path().to_owned());

    let (ok, out, err) = tokio::task::block_in_place(|| plugin(api, &path, &["status"]));
    assert!(ok, "{err}");
    assert!(out.contains("NodeRollout workers → release kubelet-v2 (revision abcdef01), maxUnavailable 1, disruption Cordon"), "{out}");
    assert!(
        out.contains("rollout [--------------------]   0%  0/2 nodes succeeded"),
        "{out}"
    );
    assert!(
        out.contains("node-a  Downloading  [#####---------------]  25%"),
        "{out}"
    );
    assert!(out.contains("node-b  RolledBack"), "{out}");
    assert!(
        out.contains("HealthCheckFailed: kubelet.service restarted"),
        "{out}"
    );
    assert!(
        !out.contains('\x1b'),
        "no colours when stdout is not a terminal"
    );

    let (ok, out, err) = tokio::task::block_in_place(|| plugin(api, &path, &["status", "workers"]));
    assert!(ok, "{err}");
    assert!(out.contains("node-a"), "{out}");
    let (ok, _, err) = tokio::task::block_in_place(|| plugin(api, &path, &["status", "nope"]));
    assert!(!ok);
    assert!(err.contains("NodeRollout nope not found"), "{err}");

    let (ok, out, err) = tokio::task::block_in_place(|| plugin(api, &path, &["plan", "node-b"]));
    assert!(ok, "{err}");
    for want in [
        "NodeUpdatePlan node-b",
        "owner:         NodeRollout workers",
        "release:       kubelet-v2",
        "phase:         RolledBack",
        "current:       1234567890abcdef",
        "denied revisions: abcdef0123456789abcdef0123456789",
        "RolledBack means:",
        "next: The revision is denied on node-b",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    let (ok, _, err) = tokio::task::block_in_place(|| plugin(api, &path, &["plan", "ghost"]));
    assert!(!ok);
    assert!(err.contains("node ghost has no NodeUpdatePlan"), "{err}");
}

async fn wait_for(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<String>>,
    want: &str,
) -> Vec<String> {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let frame = rx.recv().await.unwrap();
            if frame.iter().any(|l| l.contains(want)) {
                return frame;
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no frame with {want:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_on_changes() {
    let (_api, client) = cluster().await;
    fleet(&client).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<String>>();
    let watcher_client = client.clone();
    let task = tokio::spawn(async move {
        watch(
            &watcher_client,
            Watched::Status(Some("workers".into())),
            Style::plain(),
            move |frame| tx.send(frame).is_ok(),
        )
        .await
    });
    wait_for(&mut rx, "node-a  Downloading").await;
    set_status(
        &client,
        "node-a",
        json!({"phase": "Succeeded", "targetRevision": REV, "currentRevision": REV,
               "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded",
                 "message": "running abcdef01", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    )
    .await;
    let frame = wait_for(&mut rx, "node-a  Succeeded").await;
    assert!(
        frame
            .iter()
            .any(|l| l.contains("Succeeded: running abcdef01")),
        "{frame:?}"
    );
    task.abort();
}

/// The first row's value under `column` in kubectl's table: kubectl aligns each column to
/// its header and leaves empty cells blank, so cells are cut at the headers' offsets.
fn cell<'t>(table: &'t str, column: &str) -> &'t str {
    let mut lines = table.lines();
    let (header, row) = (lines.next().unwrap(), lines.next().unwrap());
    let start = header
        .find(&format!("{column} "))
        .or_else(|| {
            header
                .ends_with(column)
                .then(|| header.len() - column.len())
        })
        .unwrap_or_else(|| panic!("no column {column} in\n{table}"));
    let end = header[start..]
        .find(|c: char| c.is_whitespace())
        .map(|n| start + n)
        .and_then(|n| {
            header[n..]
                .find(|c: char| !c.is_whitespace())
                .map(|m| n + m)
        })
        .unwrap_or(row.len());
    row.get(start..end.min(row.len())).unwrap_or("").trim()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_patch_the_rollout() {
    let (api, client) = cluster().await;
    fleet(&client).await;
    let dir = tempfile::tempdir().unwrap();
    let (api, path) = (&api, dir.path().to_owned());
    let rollouts = Api::<NodeRollout>::all(client.clone());
    assert!(!rollouts.get("workers").await.unwrap().spec.paused);
    // One node staged and one skipped, so the Staged and Skipped columns show counts the
    // controller would write.
    rollouts
        .patch_status(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodes": {"staged": 1, "pending": 0, "skipped": 1}}})),
        )
        .await
        .unwrap();

    let (ok, out, err) = tokio::task::block_in_place(|| plugin(api, &path, &["pause", "workers"]));
    assert!(ok, "{err}");
    assert!(out.contains("NodeRollout workers paused"), "{out}");
    let after = rollouts.get("workers").await.unwrap();
    assert!(after.spec.paused);
    assert_eq!(
        after.spec.release, "kubelet-v2",
        "the rest of the spec is untouched"
    );
    assert!(
        after
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|f| f.manager.as_deref() == Some("kubectl-inplace")),
        "the patch is recorded under the plugin's field manager"
    );

    if let Some(real) = api.real() {
        // The columns as a person sees them, through kubectl of the server's release.
        let table = real.run_kubectl(&["get", "noderollouts"]).unwrap();
        assert_eq!(cell(&table, "PAUSED"), "true", "{table}");
        assert_eq!(cell(&table, "STAGED"), "1", "{table}");
        assert_eq!(cell(&table, "SKIPPED"), "1", "{table}");
        assert_eq!(cell(&table, "NODES"), "2", "{table}");
    }

    let (ok, out, err) = tokio::task::block_in_place(|| plugin(api, &path, &["resume", "workers"]));
    assert!(ok, "{err}");
    assert!(out.contains("NodeRollout workers resumed"), "{out}");
    assert!(!rollouts.get("workers").await.unwrap().spec.paused);
    if let Some(real) = api.real() {
        let table = real.run_kubectl(&["get", "noderollouts"]).unwrap();
        assert_eq!(cell(&table, "PAUSED"), "false", "{table}");
    }

    for verb in ["pause", "resume"] {
        let (ok, _, err) = tokio::task::block_in_place(|| plugin(api, &path, &[verb, "nope"]));
        assert!(!ok, "{verb} of a missing rollout fails");
        assert!(err.contains("NodeRollout nope not found"), "{verb}: {err}");
    }
}

/// The node steering commands of docs/usage/standalone-rollouts.md § 4 (docs are test
/// input): each `kubectl inplace VERB worker-7` line, with the raw `kubectl annotate` line
/// marked "the same, raw" that follows it. The retry token the raw form takes from the shell
/// (`"$(date +%s)"`) is filled in here as the shell would.
fn documented_steering() -> Vec<(Vec<String>, Vec<String>)> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/usage/standalone-rollouts.md"),
    )
    .unwrap();
    let words = |line: &str| -> Vec<String> {
        let command = line.split(" #").next().unwrap_or(line);
        command
            .split_whitespace()
            .skip(1)
            .map(str::to_owned)
            .collect()
    };
    let lines: Vec<&str> = doc.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0].starts_with("kubectl inplace ") && w[0].ends_with(" worker-7"))
        .map(|w| {
            assert!(
                w[1].contains("# the same, raw"),
                "no raw form after {:?}",
                w[0]
            );
            (
                words(w[0]),
                words(&w[1].replace("\"$(date +%s)\"", RAW_TOKEN)),
            )
        })
        .collect()
}

/// The token the documented raw retry gets from `date +%s` in this test.
const RAW_TOKEN: &str = "1795672800";

fn steering_annotations(meta: &impl kube::Resource) -> Vec<(String, String)> {
    meta.meta()
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("inplace.dev/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_verbs_annotate_as_the_documented_raw_commands_do() {
    use k8s_openapi::api::core::v1::Node;
    let (api, client) = cluster().await;
    let Some(real) = api.real() else {
        return; // the raw forms need the release's kubectl
    };
    let nodes = Api::<Node>::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-7"}}))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let documented = documented_steering();
    let verbs: Vec<&str> = documented.iter().map(|(p, _)| p[1].as_str()).collect();
    assert_eq!(verbs, ["hold", "release", "skip", "retry"]);
    for (plugin_form, raw_form) in &documented {
        if plugin_form[1] == "retry" {
            retry_sets_a_new_token_on_the_plan(&api, &client, dir.path(), raw_form).await;
            continue;
        }
        let args: Vec<&str> = plugin_form[1..].iter().map(String::as_str).collect();
        let (ok, out, err) = tokio::task::block_in_place(|| plugin(&api, dir.path(), &args));
        assert!(ok, "{args:?}: {err}");
        assert!(out.contains("node worker-7"), "{out}");
        let by_plugin = steering_annotations(&nodes.get("worker-7").await.unwrap());
        // Back to no steering, then the raw form must give the same annotations.
        nodes
            .patch(
                "worker-7",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations":
                    {"inplace.dev/hold": null, "inplace.dev/skip": null}}})),
            )
            .await
            .unwrap();
        let raw: Vec<&str> = raw_form.iter().map(String::as_str).collect();
        real.run_kubectl(&raw).unwrap();
        let by_raw = steering_annotations(&nodes.get("worker-7").await.unwrap());
        assert_eq!(by_plugin, by_raw, "{args:?} and {raw:?}");
        let want = match plugin_form[1].as_str() {
            "hold" => vec![("inplace.dev/hold".to_owned(), "true".to_owned())],
            "skip" => vec![("inplace.dev/skip".to_owned(), "true".to_owned())],
            _ => vec![],
        };
        assert_eq!(by_plugin, want, "{args:?}");
    }
    let (ok, _, err) =
        tokio::task::block_in_place(|| plugin(&api, dir.path(), &["hold", "no-such-node"]));
    assert!(!ok && err.contains("node no-such-node not found"), "{err}");
}

/// `kubectl inplace retry worker-7` and its raw form each leave a token in the plan's
/// `inplace.dev/retry`, a new one each time; a node without a plan is an error.
async fn retry_sets_a_new_token_on_the_plan(
    api: &TestApi,
    client: &kube::Client,
    dir: &Path,
    raw_form: &[String],
) {
    let plans = Api::<NodeUpdatePlan>::all(client.clone());
    let plan: NodeUpdatePlan = serde_json::from_value(plan_json("worker-7")).unwrap();
    plans.create(&PostParams::default(), &plan).await.unwrap();
    let token = |plan: &NodeUpdatePlan| {
        steering_annotations(plan)
            .into_iter()
            .find(|(k, _)| k == "inplace.dev/retry")
            .map(|(_, v)| v)
    };
    let mut seen = Vec::new();
    for _ in 0..2 {
        let (ok, out, err) =
            tokio::task::block_in_place(|| plugin(api, dir, &["retry", "worker-7"]));
        assert!(ok, "{err}");
        assert!(out.contains("node worker-7: retry"), "{out}");
        let now = token(&plans.get("worker-7").await.unwrap()).expect("a token");
        assert!(
            !seen.contains(&now),
            "a new token each time: {now} after {seen:?}"
        );
        seen.push(now);
    }
    let raw: Vec<&str> = raw_form.iter().map(String::as_str).collect();
    api.real().unwrap().run_kubectl(&raw).unwrap();
    assert_eq!(
        token(&plans.get("worker-7").await.unwrap()).as_deref(),
        Some(RAW_TOKEN),
        "{raw:?}"
    );
    let (ok, _, err) = tokio::task::block_in_place(|| plugin(api, dir, &["retry", "no-such-node"]));
    assert!(
        !ok && err.contains("node no-such-node has no NodeUpdatePlan"),
        "{err}"
    );
}

#[test]
fn status_shows_windows_the_next_opening_and_held_and_skipped_nodes() {
    let rollout: NodeRollout = serde_json::from_value(json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
        "metadata": {"name": "workers", "generation": 2},
        "spec": {"release": "kubelet-v2", "maxUnavailable": 1, "paused": true,
            "maintenanceWindows": [{"days": ["Monday", "Tuesday"], "start": "22:00",
                                    "duration": "6h", "timeZone": "Europe/Berlin"}]},
        "status": {"observedGeneration": 2, "revision": REV,
            "nodes": {"total": 4, "pending": 0, "staged": 2, "updating": 0, "succeeded": 1,
                      "failed": 0, "skipped": 1},
            "nextWindowOpensAt": "2027-01-18T21:00:00Z",
            "heldNodes": ["node-a"], "skippedNodes": ["node-c"],
            "conditions": [{"type": "Progressing", "status": "False", "reason": "SomeGateBlocks",
                            "message": "a gate the plugin has never heard of",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    }))
    .unwrap();
    let lines = kubectl_inplace::status_lines(&[rollout], &[], None, &Style::plain())
        .unwrap()
        .join("\n");
    for want in [
        "PAUSED",
        "skipped 1",
        "windows: Mon,Tue 22:00 for 6h Europe/Berlin — closed, next opens 2027-01-18T21:00:00Z",
        "Progressing=False SomeGateBlocks: a gate the plugin has never heard of",
        "held: node-a",
        "skipped: node-c",
    ] {
        assert!(lines.contains(want), "{want:?} in\n{lines}");
    }
}
