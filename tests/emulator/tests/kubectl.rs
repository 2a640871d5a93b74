//! The real kubectl against the emulator: apply, get with printer columns, -o yaml, explain,
//! patch --subresource=status, wait, get -w, delete, server-side apply, cordon and drain.
//! kubectl must be on PATH (`.ci/run` installs Debian's kubernetes-client when it is not).

use inplace_api_emulator::{Emulator, EmulatorConfig, Handle, User};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

struct Kubectl {
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    cache: PathBuf,
    handle: Handle,
}

impl Kubectl {
    async fn start() -> Self {
        let handle = Emulator::start(EmulatorConfig::default()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        handle
            .write_kubeconfig(&kubeconfig, &User::admin())
            .unwrap();
        let cache = dir.path().join("cache");
        Kubectl {
            kubeconfig,
            cache,
            _dir: dir,
            handle,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self._dir.path())
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .kill_on_drop(true);
        c
    }

    /// Run to completion; panics with kubectl's stderr when it fails.
    async fn ok(&self, args: &[&str]) -> String {
        let out = tokio::time::timeout(Duration::from_secs(120), self.command(args).output())
            .await
            .expect("kubectl finished")
            .expect("kubectl runs (is it on PATH?)");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {stderr}\n{stdout}"
        );
        stdout
    }

    /// Run expecting failure; returns stderr.
    async fn fails(&self, args: &[&str]) -> String {
        let out = tokio::time::timeout(Duration::from_secs(120), self.command(args).output())
            .await
            .expect("kubectl finished")
            .expect("kubectl runs");
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    async fn with_crds_and_examples(&self) {
        self.ok(&["apply", "-f", path(&repo("packaging/kubernetes/crds"))])
            .await;
        self.ok(&["apply", "-f", path(&repo("packaging/kubernetes/examples"))])
            .await;
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn header(out: &str) -> Vec<String> {
    out.lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_shows_printer_columns() {
    let k = Kubectl::start().await;
    let out = k
        .ok(&["apply", "-f", path(&repo("packaging/kubernetes/crds"))])
        .await;
    assert!(
        out.contains(
            "customresourcedefinition.apiextensions.k8s.io/nodeupdateplans.inplace.dev created"
        ),
        "{out}"
    );
    let out = k
        .ok(&["apply", "-f", path(&repo("packaging/kubernetes/examples"))])
        .await;
    assert!(out.contains("created"), "{out}");
    let out = k.ok(&["get", "nodeupdateplans"]).await;
    assert_eq!(
        header(&out),
        [
            "NAME", "NODE", "DESIRED", "PHASE", "TARGET", "CURRENT", "PROGRESS", "AGE"
        ],
        "{out}"
    );
    assert_eq!(out.lines().count(), 2, "{out}");
    let wide = k.ok(&["get", "nup", "-o", "wide"]).await;
    assert!(
        header(&wide).ends_with(&["RELEASE".to_string(), "MESSAGE".to_string()]),
        "{wide}"
    );
    let rel = k.ok(&["get", "noderelease"]).await;
    assert_eq!(header(&rel)[0], "NAME");
    // Applying again is unchanged.
    let again = k
        .ok(&["apply", "-f", path(&repo("packaging/kubernetes/examples"))])
        .await;
    assert!(again.contains("unchanged"), "{again}");
    // Category: `kubectl get inplace` lists all three kinds.
    let all = k.ok(&["get", "inplace"]).await;
    assert!(
        all.contains("noderelease.inplace.dev/") && all.contains("nodeupdateplan.inplace.dev/"),
        "{all}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_yaml_and_explain() {
    let k = Kubectl::start().await;
    k.with_crds_and_examples().await;
    let name = k
        .ok(&["get", "nup", "-o", "jsonpath={.items[0].metadata.name}"])
        .await;
    let yaml = k.ok(&["get", "nup", &name, "-o", "yaml"]).await;
    assert!(
        yaml.contains("kind: NodeUpdatePlan")
            && yaml.contains("resourceVersion:")
            && yaml.contains("uid:"),
        "{yaml}"
    );
    assert!(yaml.contains("generation: 1"), "{yaml}");
    let explain = k.ok(&["explain", "nodeupdateplans.spec"]).await;
    assert!(
        explain.contains("KIND:       NodeUpdatePlan") || explain.contains("NodeUpdatePlan"),
        "{explain}"
    );
    assert!(
        explain.contains("desiredState") && explain.contains("artifacts"),
        "{explain}"
    );
    let explain = k.ok(&["explain", "nodereleases.spec.artifacts.type"]).await;
    assert!(explain.contains("Sysext"), "{explain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_patch_status_and_wait_for_condition() {
    let k = Kubectl::start().await;
    k.with_crds_and_examples().await;
    let name = k
        .ok(&["get", "nup", "-o", "jsonpath={.items[0].metadata.name}"])
        .await;
    let target = format!("nodeupdateplan/{name}");
    let waiter = k
        .command(&["wait", "--for=condition=Ready", &target, "--timeout=90s"])
        .output();
    let waiting = tokio::spawn(waiter);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = r#"{"status":{"phase":"Succeeded","targetRevision":"6c1f0a2e","currentRevision":"6c1f0a2e","conditions":[{"type":"Ready","status":"True","reason":"Committed","message":"running 6c1f0a2e","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#;
    k.ok(&[
        "patch",
        &target,
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    ])
    .await;
    let out = waiting.await.unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("condition met"));
    let row = k.ok(&["get", "nup", "-o", "wide"]).await;
    assert!(
        row.contains("Succeeded") && row.contains("running 6c1f0a2e"),
        "{row}"
    );
    // Spec through the status subresource is ignored, and generation is unchanged.
    k.ok(&[
        "patch",
        &target,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"spec":{"desiredState":"Staged"}}"#,
    ])
    .await;
    let gen_and_state = k
        .ok(&[
            "get",
            &target,
            "-o",
            "jsonpath={.metadata.generation} {.spec.desiredState}",
        ])
        .await;
    assert_eq!(gen_and_state, "1 Active");
    // Invalid status is rejected by the schema.
    let err = k
        .fails(&[
            "patch",
            &target,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Bogus"}}"#,
        ])
        .await;
    assert!(
        err.contains("Unsupported value") || err.contains("invalid"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_sees_a_later_change() {
    let k = Kubectl::start().await;
    k.with_crds_and_examples().await;
    let name = k
        .ok(&["get", "nup", "-o", "jsonpath={.items[0].metadata.name}"])
        .await;
    let mut child = k
        .command(&["get", "nup", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.starts_with("NAME"), "{first}");
    let row = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(row.starts_with(&name), "{row}");
    k.ok(&[
        "patch",
        &format!("nup/{name}"),
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Downloading"}}"#,
    ])
    .await;
    loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if line.contains("Downloading") {
            break;
        }
    }
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete_and_server_side_apply() {
    let k = Kubectl::start().await;
    k.ok(&["apply", "-f", path(&repo("packaging/kubernetes/crds"))])
        .await;
    let examples = repo("packaging/kubernetes/examples/nodeupdateplan.yaml");
    let out = k
        .ok(&[
            "apply",
            "--server-side",
            "--field-manager=ops",
            "-f",
            path(&examples),
        ])
        .await;
    assert!(out.contains("serverside-applied"), "{out}");
    let name = k
        .ok(&["get", "nup", "-o", "jsonpath={.items[0].metadata.name}"])
        .await;
    // A different manager changing an owned field conflicts unless forced.
    let edited = std::fs::read_to_string(&examples)
        .unwrap()
        .replace("desiredState: Active", "desiredState: Staged");
    let edited_path = k._dir.path().join("edited.yaml");
    std::fs::write(&edited_path, edited).unwrap();
    let err = k
        .fails(&[
            "apply",
            "--server-side",
            "--field-manager=other",
            "-f",
            path(&edited_path),
        ])
        .await;
    assert!(err.contains("conflict"), "{err}");
    k.ok(&[
        "apply",
        "--server-side",
        "--field-manager=other",
        "--force-conflicts",
        "-f",
        path(&edited_path),
    ])
    .await;
    let state = k
        .ok(&["get", "nup", &name, "-o", "jsonpath={.spec.desiredState}"])
        .await;
    assert_eq!(state, "Staged");
    let out = k.ok(&["delete", "nup", &name]).await;
    assert!(out.contains("deleted"), "{out}");
    let err = k.fails(&["get", "nup", &name]).await;
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
    assert!(
        k.handle
            .store()
            .list("inplace.dev", "nodeupdateplans")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_cordon_and_drain_use_patch_and_eviction() {
    let k = Kubectl::start().await;
    let manifest = r#"
apiVersion: v1
kind: Node
metadata: {name: worker-1}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: default, labels: {app: web}}
spec:
  nodeName: worker-1
  containers: [{name: c, image: registry.example/web:1}]
"#;
    let file = k._dir.path().join("node.yaml");
    std::fs::write(&file, manifest).unwrap();
    k.ok(&["apply", "-f", path(&file)]).await;
    let out = k.ok(&["get", "nodes"]).await;
    assert_eq!(
        header(&out),
        ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
        "{out}"
    );
    k.ok(&["cordon", "worker-1"]).await;
    let unsched = k
        .ok(&[
            "get",
            "node",
            "worker-1",
            "-o",
            "jsonpath={.spec.unschedulable}",
        ])
        .await;
    assert_eq!(unsched, "true");
    let out = k
        .ok(&["drain", "worker-1", "--force", "--timeout=60s"])
        .await;
    assert!(out.contains("evicted") || out.contains("drained"), "{out}");
    let pods = k.ok(&["get", "pods", "-o", "name"]).await;
    assert!(pods.trim().is_empty(), "{pods}");
    k.ok(&["uncordon", "worker-1"]).await;
}
