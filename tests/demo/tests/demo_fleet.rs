//! `make demo` proven by `make test`: the demo binary, non-interactive, on 3 real Kubernetes
//! nodes (the real kubelet from its sysext image, containerd, a Pod on each) with the real
//! agent (installed from its sysext image) and controller, end to end, with `--broken-v3` and
//! `--agent-update`. v2 is held by a maintenance window opening about a minute later until
//! every node has staged it; then the demo opens the window. The demo itself fails unless every node's plan ends Succeeded on v2 and
//! every Node is Ready on v2, every Pod kept its container, no more than `maxUnavailable` (1)
//! nodes were ever activating or cordoned at once (watched on every plan and Node event), and
//! the broken kubelet rolls back on exactly one node and halts the rollout with the others
//! untouched on v2; then the agent updates itself to v2 on every node, and a v3 agent that
//! exits 1 at start is restored by the first node's guard (`RolledBack`,
//! `AgentNotConfirmed`) and halts that rollout with the other nodes never activated, the
//! kubelets never restarted (issue 23's three-node `maxFailures: 0` halt on real nodes,
//! sharing this test's node boot). This test also checks what it printed. Needs root,
//! systemd-nspawn, debootstrap and squashfs-tools.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The demo binary, with the programs it installs and runs built beside it; its directory.
fn demo_and_bin_dir() -> (PathBuf, PathBuf) {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");
    let demo = PathBuf::from(env!("CARGO_BIN_EXE_inplace-demo"));
    let bin_dir = demo.parent().unwrap().to_owned();
    // The programs the demo installs and runs: built with the workspace under `make test`,
    // so this is a quick no-op there.
    inplace_tests::workspace_build::workspace_bin("inplace-agent").expect("the workspace builds");
    (demo, bin_dir)
}

/// The demo with `--name-prefix prefix`, `--bin-dir` and `--work-dir work`.
fn demo_command(demo: &Path, bin_dir: &Path, prefix: &str, work: &Path) -> Command {
    let mut command = Command::new(demo);
    command
        .args(["--name-prefix", prefix])
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--work-dir")
        .arg(work);
    command
}

/// Fails unless `stdout` contains each of `wants`.
fn assert_printed(stdout: &str, wants: &[&str]) {
    for want in wants {
        assert!(stdout.contains(want), "missing {want:?} in\n{stdout}");
    }
}

/// Runs the demo `command`; its standard output and error, once it succeeded.
fn succeeded(command: &mut Command) -> (String, String) {
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the demo failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    (stdout, stderr)
}

/// The text of the section `title` prints, up to the next step or the hints.
fn section<'a>(stdout: &'a str, title: &str) -> &'a str {
    let after = stdout
        .split(&format!("\n{title}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no {title:?} section in\n{stdout}"));
    let end = ["\n==> ", "\nLook around"]
        .iter()
        .filter_map(|e| after.find(e))
        .min()
        .unwrap_or(after.len());
    &after[..end]
}

/// The section's rows for the demo's nodes.
fn node_rows<'a>(section: &'a str, prefix: &str) -> Vec<&'a str> {
    section
        .lines()
        .filter(|l| l.trim_start().starts_with(&format!("{prefix}-")))
        .collect()
}

/// The section's Halted line names the failed node.
fn assert_the_halt_names(section: &str, failed_node: &str) {
    let halted = section
        .lines()
        .find(|l| l.contains("rollout Halted=True TooManyFailures"))
        .unwrap_or_else(|| panic!("no Halted line in\n{section}"));
    assert!(
        halted.contains(&format!("{failed_node} (")),
        "the halt names {failed_node}: {halted}"
    );
}

#[test]
fn the_demo_rolls_v2_out_one_node_at_a_time_and_halts_a_broken_v3_and_a_broken_agent() {
    let (demo, bin_dir) = demo_and_bin_dir();
    // Agent v2 for --agent-update, built by the builder the agent-update suites share.
    let agent_v2 = inplace_tests::agent_images::next_version(env!("CARGO_PKG_VERSION"), 2);
    inplace_tests::agent_images::agent_binary_at(&agent_v2).expect("agent v2 builds");
    let agent_bin_dir = inplace_tests::agent_images::agent_bin_dir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let prefix = format!("demot{}", std::process::id());
    let (stdout, _) = succeeded(
        demo_command(&demo, &bin_dir, &prefix, work.path())
            .args(["--nodes", "3", "--broken-v3", "--agent-update", "--no-wait"])
            .arg("--agent-bin-dir")
            .arg(&agent_bin_dir)
            .args(["--download-seconds", "2", "--health-window", "3"]),
    );
    // What the demo printed, for `--no-capture` runs (the figures: times per step).
    println!("{stdout}");
    assert_printed(
        &stdout,
        &[
            "Nodes Ready on kubelet v1.36.1",
            "$ kubectl get nodes",
            "every Pod kept its container through the update:",
            // The maintenance window holds v2, as `kubectl inplace status` shows, then opens.
            "held outside its maintenance window",
            "closed, next opens",
            "the window opens at",
            "Summary",
            "export KUBECONFIG=",
            "kubectl inplace status",
            "cleaning up",
        ],
    );
    // The demo opens the window once every node is staged, rather than wait; on a slow
    // machine the window may open by itself first.
    assert!(
        stdout.contains("every node staged v1.36.3; rather than wait until")
            || stdout.contains("while the nodes were still staging v1.36.3"),
        "{stdout}"
    );
    // Exactly one: never two nodes activating (or cordoned) at once, and the rollout did
    // activate nodes. Printed after v2 and again after v3; the agent's rollouts (which do not
    // cordon) after the broken agent.
    assert_eq!(
        stdout
            .matches("max nodes activating at once: 1 (maxUnavailable 1); max cordoned at once: 1")
            .count(),
        2,
        "{stdout}"
    );
    assert_eq!(
        stdout
            .matches("max nodes activating at once: 1 (maxUnavailable 1); max cordoned at once: 0")
            .count(),
        1,
        "{stdout}"
    );
    for n in 1..=3 {
        let node = format!("{prefix}-{n}");
        let summary = stdout.split("\nSummary\n").nth(1).unwrap_or_default();
        let row = summary
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{node} ")))
            .unwrap_or_else(|| panic!("no summary row for {node} in\n{stdout}"));
        assert!(
            row.contains("/opt/extensions/kubernetes/kubernetes-v1.36.3-"),
            "{node} links v2: {row}"
        );
        assert!(
            stdout.contains(&format!("{node}  Succeeded")),
            "{node} shown Succeeded:\n{stdout}"
        );
        assert!(
            !std::path::Path::new("/var/tmp/inplace-testbed/nodes")
                .join(&node)
                .exists(),
            "{node} removed"
        );
    }
    // `kubectl get nodes` before (every Node on v1) and after (every Node on v2), and each of
    // the 3 Pods kept its container through the update and through the broken release.
    let listings: Vec<&str> = stdout.split("$ kubectl get nodes\n").skip(1).collect();
    assert_eq!(listings.len(), 2, "{stdout}");
    for (listing, version) in listings.iter().zip(["v1.36.1", "v1.36.3"]) {
        let rows: Vec<&str> = listing
            .lines()
            .take_while(|l| l.starts_with("      "))
            .filter(|l| l.contains(&prefix))
            .collect();
        assert_eq!(rows.len(), 3, "{listing}");
        assert!(
            rows.iter()
                .all(|r| r.contains(" Ready ") && r.contains(version)),
            "{listing}"
        );
    }
    assert_eq!(stdout.matches(": kept\n").count(), 6, "{stdout}");
    // The broken v3: one node rolled back to v2, the rollout halted naming it and its reason,
    // the other two never activated and still on v2 (the demo checked kubelets and links).
    let broken = section(&stdout, "Broken release");
    let rows = node_rows(broken, &prefix);
    assert_eq!(rows.len(), 3, "{broken}");
    let rolled_back: Vec<&&str> = rows.iter().filter(|r| r.contains("RolledBack")).collect();
    assert_eq!(rolled_back.len(), 1, "{broken}");
    assert!(
        rolled_back[0].contains("the Node is Ready on v1.36.3 again"),
        "{broken}"
    );
    let failed_node = rolled_back[0].split_whitespace().next().unwrap();
    assert_eq!(
        rows.iter()
            .filter(|r| r.contains("Staged, never activated; the Node is Ready on v1.36.3"))
            .count(),
        2,
        "{broken}"
    );
    assert_the_halt_names(broken, failed_node);
    // The agent updated itself on every node, the kubelet never restarted (the demo compared
    // each kubelet's ExecMainStartTimestampMonotonic before and after).
    let updated = section(&stdout, "Agent update");
    let rows = node_rows(updated, &prefix);
    assert_eq!(rows.len(), 3, "{updated}");
    for row in &rows {
        assert!(
            row.contains(&format!(
                "Succeeded  agent {agent_v2}; the kubelet never restarted"
            )),
            "{updated}"
        );
    }
    // The broken agent: the first node's guard restored v2 and its plan ended RolledBack
    // (AgentNotConfirmed), the rollout halted naming it, the other two never activated and
    // still on agent v2.
    assert!(
        stdout.contains("  agent update and broken agent: "),
        "{stdout}"
    );
    let broken = section(&stdout, "Broken agent");
    let rows = node_rows(broken, &prefix);
    assert_eq!(rows.len(), 3, "{broken}");
    let rolled_back: Vec<&&str> = rows
        .iter()
        .filter(|r| {
            r.contains(&format!(
                "RolledBack  AgentNotConfirmed; the guard restored agent {agent_v2}"
            ))
        })
        .collect();
    assert_eq!(rolled_back.len(), 1, "{broken}");
    let failed_node = rolled_back[0].split_whitespace().next().unwrap();
    assert_eq!(
        rows.iter()
            .filter(|r| r.contains(&format!("Staged, never activated; agent {agent_v2}")))
            .count(),
        2,
        "{broken}"
    );
    assert!(
        rows.iter()
            .all(|r| r.ends_with("the kubelet never restarted")),
        "{broken}"
    );
    assert_the_halt_names(broken, failed_node);
    // Not a TTY: progress is logged as lines, no escape sequences.
    assert!(!stdout.contains('\x1b'), "{stdout}");
}

/// `make demo KUBECONFIG=...`: against an existing cluster (a real kube-apiserver this test
/// starts) the demo installs what it needs, gives each node an identity that can act only as
/// that node (a ServiceAccount allowed to impersonate `system:node:NAME`), rolls v2 out, and
/// removes every object of its own at the end.
#[test]
fn the_demo_runs_against_an_existing_cluster_and_removes_its_objects() {
    let (demo, bin_dir) = demo_and_bin_dir();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let work = tempfile::tempdir().unwrap();
    // A cluster that runs Pods: with the scheduler and the workload controllers.
    let server = runtime
        .block_on(inplace_tests::apiserver::ApiServer::start_for_kubelets(
            &work.path().join("existing"),
        ))
        .expect("the API server starts");
    let prefix = format!("demoe{}", std::process::id());
    let (stdout, stderr) = succeeded(
        demo_command(&demo, &bin_dir, &prefix, work.path())
            .args(["--nodes", "2", "--no-wait"])
            .args(["--download-seconds", "1", "--health-window", "2"])
            .arg("--kubeconfig")
            .arg(server.admin_kubeconfig()),
    );
    assert!(stdout.contains("using the cluster of"), "{stdout}");
    assert!(
        stdout.contains("max nodes activating at once: 1 (maxUnavailable 1)"),
        "{stdout}"
    );
    assert!(
        !stderr.contains("removing the demo's objects"),
        "cleanup failed: {stderr}"
    );
    let left = server
        .run_kubectl(&[
            "get",
            "nodes,nodeupdateplans,nodereleases,noderollouts,clusterroles,clusterrolebindings",
            "-l",
            "inplace.dev/demo=true",
            "-o",
            "name",
        ])
        .unwrap();
    assert_eq!(left.trim(), "", "labelled objects left");
    let left = server
        .run_kubectl(&["get", "nodes,nodeupdateplans,noderollouts", "-o", "name"])
        .unwrap();
    assert_eq!(
        left.trim(),
        "",
        "the demo's nodes, plans and rollout are gone"
    );
    let accounts = server
        .run_kubectl(&[
            "get",
            "serviceaccounts",
            "-n",
            "inplace-system",
            "-o",
            "name",
        ])
        .unwrap();
    assert!(!accounts.contains("inplace-demo-"), "{accounts}");
    // What stays installed: the CRDs and the shipped RBAC.
    server
        .run_kubectl(&["get", "crd", "nodeupdateplans.inplace.dev"])
        .unwrap();
    server
        .run_kubectl(&["get", "clusterrole", "inplace-agent", "inplace-controller"])
        .unwrap();
}

/// `make demo DEMO_ARGS=--cluster-api`: Cluster API's own controllers (its core manager built
/// by `make capi`, the extension registered by the shipped ExtensionConfig, the bed's
/// infrastructure provider) update a MachineDeployment's Machines in place after a version
/// bump. The demo itself fails unless the Machines kept their names, UIDs and Nodes with none
/// created, every Node is Ready on v1.36.3, the MachineDeployment rolled out and every Pod
/// kept its container; this test checks what it printed: the hooks Cluster API called, the
/// Machines before and after, the Nodes on the new kubelet. Two nodes: a third would only
/// repeat the second's update (one Machine at a time).
#[test]
fn the_cluster_api_demo_updates_the_machine_deployment_in_place() {
    let (demo, bin_dir) = demo_and_bin_dir();
    let work = tempfile::tempdir().unwrap();
    let prefix = format!("democ{}", std::process::id());
    let (stdout, _) = succeeded(demo_command(&demo, &bin_dir, &prefix, work.path()).args([
        "--cluster-api",
        "--nodes",
        "2",
        "--no-wait",
    ]));
    println!("{stdout}");
    assert_printed(
        &stdout,
        &[
            "(CanUpdateMachineSet); it answered:",
            "Cluster API called UpdateMachine; the extension answered:",
            "is being updated in place: In-place update in progress: node ",
            "its kubelet now reports v1.36.3 (was v1.36.1)",
            "the MachineDeployment rolled out at v1.36.3",
            "no Machine was created or deleted",
            "every Pod kept its container through the update:",
            "export KUBECONFIG=",
            "kubectl get cluster,machinedeployments,machinesets,machines -o wide",
            "cleaning up",
        ],
    );
    assert_eq!(
        stdout
            .matches(": the same Machine, kubelet v1.36.1 -> v1.36.3")
            .count(),
        2,
        "{stdout}"
    );
    assert_eq!(stdout.matches(": kept\n").count(), 2, "{stdout}");
    // `kubectl get machines -o wide` before (v1.36.1) and after (v1.36.3): the same names.
    let listings: Vec<Vec<&str>> = stdout
        .split("$ kubectl get machines -o wide\n")
        .skip(1)
        .map(|l| {
            l.lines()
                .take_while(|l| l.starts_with("      "))
                .skip(1)
                .collect()
        })
        .collect();
    assert_eq!(listings.len(), 2, "{stdout}");
    let names = |rows: &[&str]| -> Vec<String> {
        rows.iter()
            .map(|r| r.split_whitespace().next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&listings[0]), names(&listings[1]), "{stdout}");
    assert_eq!(listings[0].len(), 2, "{stdout}");
    for (rows, version) in listings.iter().zip(["v1.36.1", "v1.36.3"]) {
        assert!(rows.iter().all(|r| r.contains(version)), "{rows:#?}");
    }
    // `kubectl get nodes` after: both nodes Ready on the new kubelet.
    let nodes = stdout.split("$ kubectl get nodes\n").nth(1).unwrap();
    let rows: Vec<&str> = nodes
        .lines()
        .take_while(|l| l.starts_with("      "))
        .filter(|l| l.contains(&prefix))
        .collect();
    assert_eq!(rows.len(), 2, "{nodes}");
    assert!(
        rows.iter()
            .all(|r| r.contains(" Ready ") && r.contains("v1.36.3")),
        "{nodes}"
    );
    // The version bump docs/usage/quickstart.md shows is the one the demo ran.
    let bump = stdout
        .lines()
        .find_map(|l| {
            l.trim_start()
                .strip_prefix("$ kubectl patch machinedeployment")
        })
        .unwrap_or_else(|| panic!("no kubectl patch in\n{stdout}"));
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/usage/quickstart.md"),
    )
    .unwrap();
    assert!(
        page.contains(&format!("kubectl patch machinedeployment{bump}")),
        "quickstart.md shows the bump the demo ran: kubectl patch machinedeployment{bump}"
    );
    assert!(!stdout.contains('\x1b'), "{stdout}");
}
