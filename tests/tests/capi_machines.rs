//! Cluster API's own controllers drive the in-place update: a MachineDeployment of Machines on
//! real-kubelet nodes (the bed's providers map each Machine to a booted node), and a user's
//! `kubectl patch` of its version. Cluster API's MachineDeployment, MachineSet and Machine
//! controllers ask the extension (`CanUpdateMachineSet`), move the Machines to the new
//! MachineSet and call `UpdateMachine` until it is done; the agents swap the kubelets. The
//! Machines are the same ones, on the same Nodes, and the workload's containers never stop.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use inplace_tests::capi::bed::CapiBed;
use inplace_tests::capi::deployment::{self, DeploymentBed, Release, deployment};
use inplace_tests::capi::machines::{MachineWatch, condition, identities};
use inplace_tests::capi::walkthrough;
use inplace_tests::kube_node::KubeCluster;
use inplace_tests::kube_node::workload::{RunningContainer, check_pods_kept, run_workload};
use kube::api::DynamicObject;
use serde_json::Value;

/// Nodes (and Machines) of the MachineDeployment of the user's path.
const NODES: usize = 3;

/// [`deployment::wait_for`], failing the test.
async fn wait_for<F, Fut>(what: &str, bed: &CapiBed, cluster: &KubeCluster, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    deployment::wait_for(what, bed, cluster, check)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Cluster API's Machines as the API server has them.
async fn machines(cluster: &KubeCluster) -> Vec<DynamicObject> {
    deployment::machines(cluster).await.unwrap()
}

/// A running MachineDeployment over the bed's nodes, with the Deployment `web` on them.
struct Fixture {
    cluster: KubeCluster,
    bed: CapiBed,
    nodes: usize,
    /// Machine name → (UID, Node) once provisioned.
    machines: BTreeMap<String, (String, String)>,
    containers: BTreeMap<String, RunningContainer>,
    _work: tempfile::TempDir,
}

impl Fixture {
    /// `nodes` real nodes on kubelet v1.36.1, Cluster API with the extension, `release` for
    /// v1.36.3, the MachineDeployment of `nodes` Machines provisioned onto them, and `web`.
    async fn start(prefix: &str, nodes: usize, release: Release) -> Fixture {
        let work = tempfile::tempdir().unwrap();
        let DeploymentBed {
            cluster,
            bed,
            machines,
            ..
        } = DeploymentBed::start(work.path(), prefix, nodes, release, &|step| {
            eprintln!("bed: {step}")
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        let on: BTreeSet<&str> = machines.values().map(|(_, n)| n.as_str()).collect();
        let bed_nodes: BTreeSet<&str> = cluster.nodes.iter().map(|n| n.name()).collect();
        assert_eq!(on, bed_nodes, "one Machine per node of the bed");
        let containers = run_workload(&cluster).await.unwrap();
        eprintln!(
            "{}",
            cluster.kubectl(&["get", "machines", "-o", "wide"]).unwrap()
        );
        Fixture {
            cluster,
            bed,
            nodes,
            machines,
            containers,
            _work: work,
        }
    }

    /// What a user types: the MachineDeployment's version to v1.36.3.
    fn bump_version(&self) {
        patch_deployment(
            &self.cluster,
            r#"{"spec":{"template":{"spec":{"version":"v1.36.3"}}}}"#,
        );
    }

    /// The same Machines (names, UIDs) on the same Nodes as when provisioned.
    async fn assert_same_machines(&self) {
        let now = identities(&machines(&self.cluster).await, self.nodes);
        assert_eq!(
            Some(&self.machines),
            now.as_ref(),
            "the same Machines (names, UIDs) on the same Nodes, none created"
        );
    }
}

/// The walk-through's block after `heading`, run as written on the bed; its output.
async fn walk_through(cluster: &KubeCluster, heading: &'static str) -> String {
    let kubeconfig = cluster.api.admin_kubeconfig();
    tokio::task::spawn_blocking(move || walkthrough::run(&kubeconfig, heading))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{heading}: {e:#}"))
}

/// `kubectl patch machinedeployment workers --type=merge -p PATCH`.
fn patch_deployment(cluster: &KubeCluster, patch: &str) {
    cluster
        .kubectl(&[
            "patch",
            "machinedeployment",
            "workers",
            "--type=merge",
            "-p",
            patch,
        ])
        .unwrap();
}

/// A MachineHealthCheck on the MachineDeployment's Machines with the timeouts users set
/// (Cluster API's own examples use 300 s for a Node not `Ready`).
const HEALTH_CHECK: &str = "apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineHealthCheck
metadata: {name: workers, namespace: default}
spec:
  clusterName: bed
  selector:
    matchLabels: {pool: workers}
  checks:
    nodeStartupTimeoutSeconds: 600
    unhealthyNodeConditions:
    - {type: Ready, status: Unknown, timeoutSeconds: 300}
    - {type: Ready, status: \"False\", timeoutSeconds: 300}
";

/// The MachineHealthCheck `workers` expects every Machine and finds each healthy.
fn health_check_sees_all_healthy(cluster: &KubeCluster) -> Result<(), String> {
    let text = cluster
        .kubectl(&["get", "machinehealthcheck", "workers", "-o", "json"])
        .map_err(|e| e.to_string())?;
    let check: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let status = &check["status"];
    let all = serde_json::json!(NODES);
    if status["expectedMachines"] == all && status["currentHealthy"] == all {
        Ok(())
    } else {
        Err(format!("MachineHealthCheck status {status}"))
    }
}

/// Each NodeUpdatePlan's name and generation (what the extension writes), and the Nodes
/// cordoned: what an update in place would touch.
fn touched(cluster: &KubeCluster) -> (String, String) {
    let plans = cluster
        .kubectl(&[
            "get",
            "nodeupdateplans",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.metadata.generation} {end}",
        ])
        .unwrap();
    let cordoned = cluster
        .kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[*].spec.unschedulable}",
        ])
        .unwrap();
    (plans, cordoned)
}

/// A change the extension cannot make in place, after the version bump: the
/// MachineDeployment moves to an infrastructure template with another `image`, with
/// `maxSurge: 1, maxUnavailable: 0` so that Cluster API replaces Machines by creating one
/// first. The extension does not claim it (its log says why), Cluster API creates a new
/// Machine, the bed has no free node for it, and the rollout waits: the old Machines, their
/// plans and Nodes are not touched.
async fn an_unclaimed_change_waits_for_a_new_machine(f: &Fixture) {
    let (cluster, bed) = (&f.cluster, &f.bed);
    let before = touched(cluster);
    cluster
        .apply(
            "image-b",
            "apiVersion: infrastructure.bed.inplace.dev/v1alpha1
kind: BedMachineTemplate
metadata: {name: workers-image-b, namespace: default}
spec:
  template:
    spec: {image: b}
",
        )
        .unwrap();
    patch_deployment(
        cluster,
        r#"{"spec":{"rollout":{"strategy":{"rollingUpdate":{"maxSurge":1,"maxUnavailable":0}}},"template":{"spec":{"infrastructureRef":{"name":"workers-image-b"}}}}}"#,
    );
    wait_for("a new Machine waiting for a node", bed, cluster, || async {
        let log = bed.extension.log();
        if !log.contains("not claimed (cannot be done in place)") {
            return Err("the extension was not asked about the new template".to_owned());
        }
        let all = machines(cluster).await;
        let new: Vec<&DynamicObject> = all
            .iter()
            .filter(|m| {
                !f.machines
                    .contains_key(m.metadata.name.as_deref().unwrap_or(""))
            })
            .collect();
        let waiting = new.iter().any(|m| {
            condition(&m.data, "InfrastructureReady").is_some_and(|(s, _, _)| s == "False")
        });
        if new.len() == 1 && waiting {
            Ok(())
        } else {
            Err(format!(
                "{} new Machines, none waiting for its infrastructure",
                new.len()
            ))
        }
    })
    .await;
    let log = bed.extension.log();
    let answer = log
        .lines()
        .rfind(|l| l.contains("CanUpdateMachineSet") && l.contains("not claimed"))
        .unwrap();
    eprintln!("the extension's answer: {answer}");
    assert!(
        answer.contains("image"),
        "the answer names the field: {answer}"
    );
    eprintln!(
        "{}",
        cluster
            .kubectl(&["get", "machines,bedmachines", "-o", "wide"])
            .unwrap()
    );
    let deployment = deployment(cluster).unwrap();
    let rolling = condition(&deployment, "RollingOut");
    eprintln!("MachineDeployment RollingOut: {rolling:?}");
    assert!(
        rolling.is_some_and(|(s, _, _)| s == "True"),
        "{}",
        deployment["status"]
    );
    let (old, new): (Vec<DynamicObject>, Vec<DynamicObject>) =
        machines(cluster).await.into_iter().partition(|m| {
            f.machines
                .contains_key(m.metadata.name.as_deref().unwrap_or(""))
        });
    assert_eq!(new.len(), 1, "one new Machine");
    assert_eq!(
        identities(&old, NODES).as_ref(),
        Some(&f.machines),
        "the old Machines stay on their Nodes"
    );
    assert_eq!(
        before,
        touched(cluster),
        "no plan written, no Node cordoned"
    );
}

/// The first Machine whose `Updating` condition has the reason `InPlaceUpdateFailed`, with the
/// condition's status.
fn failed_update(machines: &[DynamicObject]) -> Option<(String, String)> {
    machines.iter().find_map(|machine| {
        let (status, reason, message) = condition(&machine.data, "Updating")?;
        if reason != "InPlaceUpdateFailed" {
            return None;
        }
        assert_eq!(
            message,
            "UpdateMachine hook failed: please check controller logs for errors"
        );
        Some((machine.metadata.name.clone()?, status))
    })
}

/// The user's path: a MachineDeployment of three Machines on real nodes at kubelet v1.36.1,
/// a Deployment with a PodDisruptionBudget on them, and `kubectl patch` of the
/// MachineDeployment's version to v1.36.3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_deployment_version_bump_updates_its_real_nodes_in_place() {
    let f = Fixture::start("capi", NODES, Release::Working).await;
    let (cluster, bed) = (&f.cluster, &f.bed);
    cluster.apply("health-check", HEALTH_CHECK).unwrap();
    wait_for("the MachineHealthCheck's view", bed, cluster, || async {
        health_check_sees_all_healthy(cluster)
    })
    .await;
    // Two Machines may be unavailable at once: Cluster API updates two in place together.
    patch_deployment(
        cluster,
        r#"{"spec":{"rollout":{"strategy":{"rollingUpdate":{"maxUnavailable":2}}}}}"#,
    );
    // docs/usage/cluster-api.md's walk-through as written: register the extension (the bed
    // applied the same file already: the user's apply changes nothing and discovery holds),
    // then the version bump and its wait.
    let handlers = walk_through(cluster, walkthrough::REGISTER).await;
    assert!(handlers.contains("update-machine.inplace"), "{handlers}");
    let watch = MachineWatch::start(cluster.client().await.unwrap());
    let started = Instant::now();
    let shown = walk_through(cluster, walkthrough::BUMP).await;
    eprintln!("the walk-through's version bump showed:\n{shown}");
    // What the page's wait promises, checked here from the objects themselves.
    wait_for("the rollout to v1.36.3", bed, cluster, || {
        deployment::updated(cluster, "v1.36.3", NODES)
    })
    .await;
    eprintln!(
        "{NODES} Machines updated in place {:.0} s after the patch",
        started.elapsed().as_secs_f64()
    );
    eprintln!(
        "{}",
        cluster.kubectl(&["get", "machines", "-o", "wide"]).unwrap()
    );
    f.assert_same_machines().await;
    let seen = watch.seen();
    let uids: BTreeSet<String> = f.machines.values().map(|(uid, _)| uid.clone()).collect();
    assert_eq!(
        seen.uids, uids,
        "no Machine created (nor deleted) during the rollout"
    );
    eprintln!("Updating messages seen: {:#?}", seen.updating);
    eprintln!(
        "most Machines Updating at once: {}; longest spell not Ready per Node: {:?}",
        seen.most_updating, seen.longest_not_ready
    );
    assert!(
        seen.most_updating <= 2,
        "maxUnavailable 2 bounds the Machines updated at once: {}",
        seen.most_updating
    );
    // The kubelet restarts stayed far below the health check's timeout: nothing remediated.
    health_check_sees_all_healthy(cluster).unwrap();
    assert!(
        seen.updating
            .iter()
            .any(|m| m.starts_with("In-place update in progress: node ")),
        "the extension's progress in the Machines' Updating condition: {:?}",
        seen.updating
    );
    check_pods_kept(cluster, &f.containers, "v1.36.3")
        .await
        .unwrap();
    drop(watch);
    an_unclaimed_change_waits_for_a_new_machine(&f).await;
}

/// A broken release (its kubelet refuses its flags) through Cluster API: the agent rolls the
/// node back, the extension answers `Failure`, and Cluster API shows the failed in-place
/// update on the Machine and a rollout that does not complete; the node is back on v1.36.1
/// with its Pods' containers, and no Machine is replaced. Two nodes (the first failure is
/// what is shown; a third node would only repeat it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_release_fails_the_in_place_update_and_capi_shows_it() {
    let f = Fixture::start("capifail", 2, Release::Broken).await;
    let (cluster, bed) = (&f.cluster, &f.bed);
    f.bump_version();
    wait_for(
        "a Machine's failed in-place update",
        bed,
        cluster,
        || async {
            failed_update(&machines(cluster).await)
                .map(|_| ())
                .ok_or_else(|| "no Machine with Updating reason InPlaceUpdateFailed".to_owned())
        },
    )
    .await;
    // Cluster API keeps the update in progress (it does not roll back) and names only the hook.
    let (failed, status) = failed_update(&machines(cluster).await).unwrap();
    assert_eq!(status, "True", "Updating of {failed}");
    let described = cluster.kubectl(&["describe", "machine", &failed]).unwrap();
    eprintln!("{described}");
    let node = &f.machines[&failed].1;
    let plan = cluster
        .kubectl(&[
            "get",
            "nodeupdateplan",
            node,
            "-o",
            "jsonpath={.status.phase}",
        ])
        .unwrap();
    assert_eq!(plan, "RolledBack", "the agent put {node} back");
    let deployment = deployment(cluster).unwrap();
    eprintln!("MachineDeployment status: {}", deployment["status"]);
    let rolling = condition(&deployment, "RollingOut");
    assert!(
        rolling.as_ref().is_some_and(|(s, _, _)| s == "True"),
        "the rollout is not complete: {rolling:?}"
    );
    assert_ne!(
        deployment["status"]["upToDateReplicas"],
        serde_json::json!(2),
        "{}",
        deployment["status"]
    );
    // The extension's reason reaches Cluster API's log (its condition names only the hook).
    let log = bed.manager.log();
    assert!(
        log.contains(&format!(
            "node {node} rolled back from kubelet-v1.36.3-refuses-to-start"
        )),
        "{}",
        bed.diagnostics()
    );
    f.assert_same_machines().await;
    check_pods_kept(cluster, &f.containers, "v1.36.1")
        .await
        .unwrap();
}
