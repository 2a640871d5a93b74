//! UpdateMachine end to end: Cluster API-shaped requests over HTTPS, a management and a
//! workload cluster (a real kube-apiserver holding both, [`Topology::SelfHosted`]; the
//! emulator as the workload where a case injects faults), the kubeconfig Secret, and a
//! simulated agent writing plan status.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use common::*;
use inplace_capi::{DrainStatus, Drainer};
use inplace_proto::DesiredState;
use serde_json::{Value, json};

fn in_progress(answer: &Value) -> bool {
    answer["status"] == "Success" && answer["retryAfterSeconds"].as_i64().unwrap() > 0
}

fn done(answer: &Value) -> bool {
    answer["status"] == "Success" && answer["retryAfterSeconds"] == 0
}

fn message(answer: &Value) -> &str {
    answer["message"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_version_bump_is_completed_and_twenty_polls_stay_idempotent() {
    let bed = Bed::start().await;
    let agent = sim_agents(&bed).await;
    let desired = machine("v1.31.2", Some("node-1"));

    let mut messages = Vec::new();
    let mut finished_at = None;
    for call in 0..20 {
        let answer = bed.update_machine(&desired).await;
        assert!(
            in_progress(&answer) || done(&answer),
            "call {call}: {answer}"
        );
        if done(&answer) && finished_at.is_none() {
            finished_at = Some(call);
        }
        if finished_at.is_some() {
            assert!(done(&answer), "call {call} after completion: {answer}");
        }
        messages.push(message(&answer).to_owned());
        // One plan, written once: repeated calls create no work.
        assert_eq!(bed.plan_count().await, 1);
        let plan = bed.plans().get("node-1").await.unwrap();
        assert_eq!(plan.metadata.generation, Some(1), "call {call}");
        // Half of the calls see no progress on the node at all.
        if call % 2 == 0 {
            agent.step().await.unwrap();
        }
    }
    let finished_at = finished_at.expect("the update completed within 20 calls");
    assert!(finished_at > 3, "{messages:?}");

    // The messages said what the node was doing, in order.
    let position = |needle: &str| {
        messages
            .iter()
            .position(|m| m.contains(needle))
            .unwrap_or_else(|| panic!("no message with {needle:?} in {messages:?}"))
    };
    let downloading = position("node node-1: Downloading 50% (46.5 MiB of 93.0 MiB)");
    let verifying = position("node node-1: Verifying kubelet.service 12s/30s");
    let runs = position("node node-1 runs kubernetes-v1.31.2");
    assert!(downloading < verifying && verifying < runs, "{messages:?}");

    // The plan: the release's content for the node, Active, owned by the Node.
    let plan = bed.plans().get("node-1").await.unwrap();
    assert_eq!(plan.spec.release.as_deref(), Some("kubernetes-v1.31.2"));
    assert_eq!(plan.spec.desired_state, DesiredState::Active);
    assert_eq!(
        plan.spec.content.kubernetes_version.as_deref(),
        Some("v1.31.2")
    );
    let owner = &plan.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", "node-1")
    );
    let managers: Vec<_> = plan
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(managers.iter().any(|m| m == "inplace-capi"), "{managers:?}");
    assert_eq!(
        plan.metadata.annotations.as_ref().unwrap()["inplace.dev/capi-machine"],
        "tenant-a/workers-7d9f8-x2k4p"
    );

    // Much later, Cluster API asks again: still done, nothing written.
    let version_before = plan.metadata.resource_version.clone();
    let answer = bed.update_machine(&desired).await;
    assert!(done(&answer), "{answer}");
    let plan = bed.plans().get("node-1").await.unwrap();
    assert_eq!(plan.metadata.resource_version, version_before);
    bed.stop().await;
}

#[tokio::test]
async fn the_cluster_api_sequence_claim_then_update_to_done() {
    let bed = Bed::start().await;
    let agent = sim_agents(&bed).await;
    let current = machine("v1.31.1", Some("node-2"));
    let desired = machine("v1.31.2", Some("node-2"));
    let infra = update_machine_object("infrastructureMachine");

    // 1. The MachineDeployment/KCP controller asks; the version is claimed.
    let (_, claim) = bed
        .post(
            &format!("{HOOKS}/canupdatemachine/can-update-machine"),
            &can_update_machine_request(&current, &desired, &infra, &infra),
        )
        .await;
    let patch = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        claim["machinePatch"]["patch"].as_str().unwrap(),
    )
    .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    // 2. Cluster API applies the claim to the current Machine and finds it covers the change.
    let mut updated = current.clone();
    json_patch::patch(&mut updated, &patch).unwrap();
    assert_eq!(updated["spec"], desired["spec"]);

    // 3. The Machine controller calls UpdateMachine until done.
    let mut answers = Vec::new();
    loop {
        let answer = bed.update_machine(&updated).await;
        answers.push(message(&answer).to_owned());
        if done(&answer) {
            break;
        }
        assert!(in_progress(&answer) && answers.len() < 12, "{answers:?}");
        agent.step().await.unwrap();
    }
    assert_eq!(
        answers.last().unwrap(),
        &format!(
            "node node-2 runs kubernetes-v1.31.2 (revision {})",
            bed.plans()
                .get("node-2")
                .await
                .unwrap()
                .spec
                .revision
                .unwrap()
        )
    );
    bed.stop().await;
}

#[tokio::test]
async fn repeated_calls_without_progress_change_nothing() {
    let bed = Bed::start().await;
    let desired = machine("v1.31.2", Some("node-2"));
    let first = bed.update_machine(&desired).await;
    assert!(in_progress(&first), "{first}");
    assert!(
        message(&first).contains("waiting for the inplace agent"),
        "{first}"
    );
    let version = bed
        .plans()
        .get("node-2")
        .await
        .unwrap()
        .metadata
        .resource_version;
    for _ in 0..5 {
        assert_eq!(bed.update_machine(&desired).await, first);
    }
    assert_eq!(
        bed.plans()
            .get("node-2")
            .await
            .unwrap()
            .metadata
            .resource_version,
        version
    );
    assert_eq!(bed.plan_count().await, 1);
    bed.stop().await;
}

#[tokio::test]
async fn a_failing_node_answers_failure_with_the_reason() {
    let bed = Bed::start().await;
    let agent = sim_agents(&bed).await;
    let desired = machine("v1.31.2", Some("fail-node"));
    let mut last = Value::Null;
    for _ in 0..10 {
        last = bed.update_machine(&desired).await;
        if last["status"] == "Failure" {
            break;
        }
        agent.step().await.unwrap();
    }
    assert_eq!(last["status"], "Failure", "{last}");
    assert_eq!(
        message(&last),
        "node fail-node rolled back from kubernetes-v1.31.2 to revision rev-old: HealthCheckFailed: kubelet.service failed its health check (exited with status 1); rolled back"
    );
    // Asked again, the same failure (no new attempt is started by the extension).
    let again = bed.update_machine(&desired).await;
    assert_eq!(again, last);
    assert_eq!(
        bed.plans()
            .get("fail-node")
            .await
            .unwrap()
            .metadata
            .generation,
        Some(1)
    );
    bed.stop().await;
}

#[tokio::test]
async fn missing_kubeconfig_nodes_and_versions_give_clear_failures() {
    let bed = Bed::start().await;

    create_cluster(&bed.management_client, "c9").await;
    let mut other_cluster = machine("v1.31.2", Some("node-1"));
    other_cluster["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!("c9");
    let answer = bed.update_machine(&other_cluster).await;
    assert_eq!(answer["status"], "Failure");
    assert!(
        message(&answer).contains(
            "Secret tenant-a/c9-kubeconfig (the kubeconfig of Cluster c9) does not exist"
        ),
        "{answer}"
    );

    // A Machine whose node has not joined (the stored Machine has no nodeRef; Cluster
    // API's request never carries one).
    let mut not_joined = machine("v1.31.2", None);
    not_joined["metadata"]["name"] = json!("not-joined");
    let answer = bed.update_machine(&not_joined).await;
    assert_eq!(answer["status"], "Failure");
    assert!(
        message(&answer).contains("has no status.nodeRef.name"),
        "{answer}"
    );

    let answer = bed
        .update_machine(&machine("v1.40.0", Some("node-1")))
        .await;
    assert_eq!(answer["status"], "Failure");
    assert!(
        message(&answer)
            .contains("no NodeRelease with kubernetesVersion v1.40.0 in the management cluster"),
        "{answer}"
    );

    let answer = bed
        .update_machine(&machine("v1.31.2", Some("node-gone")))
        .await;
    assert_eq!(answer["status"], "Failure");
    assert!(message(&answer).contains("node node-gone"), "{answer}");

    let mut unlabelled = machine("v1.31.2", Some("node-1"));
    unlabelled["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("labels");
    unlabelled["spec"]
        .as_object_mut()
        .unwrap()
        .remove("clusterName");
    // (Cluster API's Machine CRD requires spec.clusterName: only a forged request lacks both.)
    let answer = bed.post_update_machine(&unlabelled).await;
    assert_eq!(answer["status"], "Failure");
    assert!(
        message(&answer).contains("cluster.x-k8s.io/cluster-name"),
        "{answer}"
    );

    let (status, answer) = bed
        .post(
            &format!("{HOOKS}/updatemachine/update-machine"),
            &json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "UpdateMachineRequest"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(answer["status"], "Failure");
    assert!(message(&answer).contains("no desired.machine"), "{answer}");

    // A broken kubeconfig is named too.
    put_kubeconfig_secret(&bed.management_client, "c8", "this: is: not a kubeconfig").await;
    create_cluster(&bed.management_client, "c8").await;
    let mut broken = machine("v1.31.2", Some("node-1"));
    broken["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!("c8");
    let answer = bed.update_machine(&broken).await;
    assert_eq!(answer["status"], "Failure");
    assert!(
        message(&answer).contains("Secret tenant-a/c8-kubeconfig"),
        "{answer}"
    );

    assert_eq!(
        bed.plan_count().await,
        0,
        "no plan was written for any of these"
    );
    bed.stop().await;
}

#[tokio::test]
async fn an_unreachable_workload_cluster_is_retried_not_failed() {
    let bed = Bed::start().await;
    put_kubeconfig_secret(
        &bed.management_client,
        "c7",
        "apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster:\n    server: http://127.0.0.1:9\ncontexts:\n- name: x\n  context:\n    cluster: x\n    user: x\ncurrent-context: x\nusers:\n- name: x\n  user:\n    token: t\n",
    )
    .await;
    create_cluster(&bed.management_client, "c7").await;
    let mut unreachable = machine("v1.31.2", Some("node-1"));
    unreachable["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!("c7");
    let answer = bed.update_machine(&unreachable).await;
    assert!(in_progress(&answer), "{answer}");
    assert!(
        message(&answer).contains("retrying after a transient error"),
        "{answer}"
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_failing_or_slow_workload_api_gives_a_retry_not_a_failure() {
    // Announced timeout 4 s: the extension answers within 1 s whatever the clusters do.
    // The workload cluster is the emulator: an outage and a slow answer on demand are faults
    // only it injects.
    let workload = inplace_tests::test_api::TestApi::start_emulator(Default::default())
        .await
        .unwrap();
    let bed = Bed::start_on(workload, false, Arc::new(inplace_capi::NoDrain), 4).await;
    let faults = bed.workload.emulator().unwrap().faults();
    let desired = machine("v1.31.2", Some("node-1"));

    faults.outage(
        std::time::Duration::from_secs(60),
        inplace_api_emulator::OutageKind::Unavailable,
    );
    let answer = bed.update_machine(&desired).await;
    assert!(in_progress(&answer), "{answer}");
    assert!(message(&answer).contains("retrying"), "{answer}");
    faults.end_outage();

    faults.latency(std::time::Duration::from_secs(3));
    let started = std::time::Instant::now();
    let answer = bed.update_machine(&desired).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "answered in time"
    );
    assert!(in_progress(&answer), "{answer}");
    assert!(
        message(&answer).contains("did not answer within 1s"),
        "{answer}"
    );
    faults.latency(std::time::Duration::ZERO);

    let answer = bed.update_machine(&desired).await;
    assert!(
        message(&answer).contains("waiting for the inplace agent"),
        "{answer}"
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_rotated_kubeconfig_secret_rebuilds_the_cached_client() {
    let bed = Bed::start().await;
    let desired = machine("v1.31.2", Some("node-1"));
    let good = bed.update_machine(&desired).await;
    assert!(in_progress(&good), "{good}");

    // Rotated to a credential the workload cluster refuses: the new Secret is used (the
    // cached client is not), and a refused credential is retried, not failed.
    let refused = refused_kubeconfig_yaml(&bed.workload);
    put_kubeconfig_secret(&bed.management_client, CLUSTER, &refused).await;
    let answer = bed.update_machine(&desired).await;
    assert!(in_progress(&answer), "{answer}");
    assert!(
        message(&answer).contains("retrying after a transient error"),
        "{answer}"
    );
    assert!(message(&answer).contains("401"), "{answer}");

    // Rotated back: answers as before.
    let working = admin_kubeconfig_yaml(&bed.workload);
    put_kubeconfig_secret(&bed.management_client, CLUSTER, &working).await;
    assert_eq!(bed.update_machine(&desired).await, good);
    bed.stop().await;
}

/// A drainer that needs `rounds` calls per node before the node counts as drained, and
/// records the plan's desired state whenever it is called.
struct SlowDrainer {
    rounds: usize,
    calls: AtomicUsize,
    uncordons: AtomicUsize,
    seen_active_while_draining: AtomicUsize,
}

#[async_trait]
impl Drainer for SlowDrainer {
    async fn drain(&self, workload: &kube::Client, node: &str) -> DrainStatus {
        let plans: kube::Api<inplace_proto::NodeUpdatePlan> = kube::Api::all(workload.clone());
        if plans.get(node).await.unwrap().spec.desired_state == DesiredState::Active {
            self.seen_active_while_draining
                .fetch_add(1, Ordering::SeqCst);
        }
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if call >= self.rounds {
            DrainStatus::Drained
        } else {
            DrainStatus::InProgress(format!("2 pods left (round {call})"))
        }
    }

    async fn uncordon(
        &self,
        _workload: &kube::Client,
        _node: &str,
    ) -> Result<(), inplace_capi::DrainError> {
        self.uncordons.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test]
async fn with_drain_the_plan_stays_staged_until_the_node_is_drained() {
    let drainer = Arc::new(SlowDrainer {
        rounds: 3,
        calls: AtomicUsize::new(0),
        uncordons: AtomicUsize::new(0),
        seen_active_while_draining: AtomicUsize::new(0),
    });
    let bed = Bed::start_with(Topology::SelfHosted, true, drainer.clone(), 30).await;
    let agent = sim_agents(&bed).await;
    let desired = machine("v1.31.2", Some("node-1"));

    let mut messages = Vec::new();
    for _ in 0..25 {
        let answer = bed.update_machine(&desired).await;
        messages.push(message(&answer).to_owned());
        if done(&answer) {
            break;
        }
        assert!(in_progress(&answer), "{answer}");
        let plan = bed.plans().get("node-1").await.unwrap();
        if drainer.calls.load(Ordering::SeqCst) < 3 {
            assert_eq!(
                plan.spec.desired_state,
                DesiredState::Staged,
                "{messages:?}"
            );
        }
        agent.step().await.unwrap();
    }
    assert!(
        messages.last().unwrap().contains("runs kubernetes-v1.31.2"),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("Staged kubernetes-v1.31.2; draining: 2 pods left")),
        "{messages:?}"
    );
    assert_eq!(
        drainer.calls.load(Ordering::SeqCst),
        3,
        "drained once, then never again"
    );
    assert_eq!(drainer.seen_active_while_draining.load(Ordering::SeqCst), 0);
    assert_eq!(drainer.uncordons.load(Ordering::SeqCst), 1);
    let plan = bed.plans().get("node-1").await.unwrap();
    assert_eq!(plan.spec.desired_state, DesiredState::Active);
    assert_eq!(
        plan.metadata.generation,
        Some(2),
        "Staged, then Active: two spec writes"
    );
    bed.stop().await;
}

#[tokio::test]
async fn with_drain_a_rolled_back_node_is_uncordoned_and_fails() {
    let drainer = Arc::new(SlowDrainer {
        rounds: 1,
        calls: AtomicUsize::new(0),
        uncordons: AtomicUsize::new(0),
        seen_active_while_draining: AtomicUsize::new(0),
    });
    let bed = Bed::start_with(Topology::SelfHosted, true, drainer.clone(), 30).await;
    let agent = sim_agents(&bed).await;
    let desired = machine("v1.31.2", Some("fail-node"));
    let mut last = Value::Null;
    for _ in 0..15 {
        last = bed.update_machine(&desired).await;
        if last["status"] == "Failure" {
            break;
        }
        agent.step().await.unwrap();
    }
    assert_eq!(last["status"], "Failure", "{last}");
    assert!(message(&last).contains("HealthCheckFailed"), "{last}");
    assert_eq!(drainer.calls.load(Ordering::SeqCst), 1);
    assert!(drainer.uncordons.load(Ordering::SeqCst) >= 1);
    bed.stop().await;
}

/// Anyone who can reach the extension can send a request: it acts only on a Machine the
/// management cluster holds, that Cluster API is updating in place, and that wants what the
/// request says. Each forged request is refused, naming why, with nothing written to the
/// workload cluster. (Each was acted on: the Machine was taken from the request body.)
#[tokio::test]
async fn forged_requests_are_refused_and_write_nothing() {
    let bed = Bed::start().await;
    let desired = machine("v1.31.2", Some("node-1"));

    // No such Machine in the management cluster.
    let answer = bed.post_update_machine(&desired).await;
    assert_eq!(answer["status"], "Failure", "{answer}");
    assert!(
        message(&answer).contains("does not exist in the management cluster"),
        "{answer}"
    );

    // Stored, but Cluster API is not updating it in place.
    let mut unmarked = desired.clone();
    unmarked["metadata"]["annotations"] = json!({});
    bed.store_machine(&unmarked).await;
    let answer = bed.post_update_machine(&desired).await;
    assert_eq!(answer["status"], "Failure", "{answer}");
    assert!(
        message(&answer).contains("Cluster API is not updating it in place"),
        "{answer}"
    );

    // Marked, but it wants another version than the request.
    bed.store_machine(&machine("v1.31.1", Some("node-1"))).await;
    let answer = bed.post_update_machine(&desired).await;
    assert_eq!(answer["status"], "Failure", "{answer}");
    assert!(
        message(&answer).contains("asks for spec.version v1.31.2, the Machine has v1.31.1"),
        "{answer}"
    );

    // A request for another node than the Machine's.
    bed.store_machine(&desired).await;
    let answer = bed
        .post_update_machine(&machine("v1.31.2", Some("node-2")))
        .await;
    assert_eq!(answer["status"], "Failure", "{answer}");
    assert!(
        message(&answer).contains("asks for status.nodeRef.name node-2, the Machine has node-1"),
        "{answer}"
    );

    // A Machine of a Cluster that does not exist.
    let mut orphan = desired.clone();
    orphan["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!("c404");
    bed.store_machine(&orphan).await;
    let answer = bed.post_update_machine(&orphan).await;
    assert_eq!(answer["status"], "Failure", "{answer}");
    assert!(
        message(&answer).contains("its Cluster c404 does not exist"),
        "{answer}"
    );

    assert_eq!(
        bed.plan_count().await,
        0,
        "nothing was written to the workload cluster"
    );
    bed.stop().await;
}
