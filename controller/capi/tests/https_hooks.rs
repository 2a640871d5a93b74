//! The hook server over real HTTPS: discovery, CanUpdateMachine / CanUpdateMachineSet with
//! requests shaped like Cluster API's, malformed requests, and certificate reload.

use crate::common;

use base64::Engine as _;
use common::*;
use inplace_capi::NoDrain;
use serde_json::{Value, json};
use std::sync::Arc;

fn decode_patch(patch: &Value) -> Value {
    assert_eq!(patch["patchType"], "JSONPatch", "{patch}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch["patch"].as_str().unwrap())
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn discovery_announces_the_three_in_place_hooks() {
    let bed = Bed::start().await;
    let (status, answer) = bed
        .post(
            &format!("{HOOKS}/discovery"),
            &json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(answer["kind"], "DiscoveryResponse");
    assert_eq!(answer["status"], "Success");
    let hooks: Vec<(&str, &str)> = answer["handlers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["name"].as_str().unwrap(),
                h["requestHook"]["hook"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        hooks,
        [
            ("can-update-machine", "CanUpdateMachine"),
            ("can-update-machineset", "CanUpdateMachineSet"),
            ("update-machine", "UpdateMachine")
        ]
    );
    assert_eq!(answer["handlers"][2]["timeoutSeconds"], 30);
    bed.stop().await;
}

#[tokio::test]
async fn a_version_bump_is_claimed_with_a_patch_for_spec_version_only() {
    let bed = Bed::start().await;
    let infra = update_machine_object("infrastructureMachine");
    let request = can_update_machine_request(
        &machine("v1.31.1", Some("node-1")),
        &machine("v1.31.2", Some("node-1")),
        &infra,
        &infra,
    );
    let (status, answer) = bed
        .post(
            &format!("{HOOKS}/canupdatemachine/can-update-machine"),
            &request,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(answer["kind"], "CanUpdateMachineResponse");
    assert_eq!(answer["status"], "Success", "{answer}");
    assert_eq!(
        decode_patch(&answer["machinePatch"]),
        json!([{"op": "replace", "path": "/spec/version", "value": "v1.31.2"}])
    );
    assert!(
        answer.get("infrastructureMachinePatch").is_none(),
        "{answer}"
    );
    assert!(answer.get("bootstrapConfigPatch").is_none(), "{answer}");
    // Applied to the current Machine the patch gives the desired spec, as Cluster API checks.
    let patch: json_patch::Patch =
        serde_json::from_value(decode_patch(&answer["machinePatch"])).unwrap();
    let mut patched = request["current"]["machine"].clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    assert_eq!(patched["spec"], request["desired"]["machine"]["spec"]);
    bed.stop().await;
}

#[tokio::test]
async fn an_unrelated_change_is_not_claimed() {
    let bed = Bed::start().await;
    let infra = update_machine_object("infrastructureMachine");
    let mut bigger = infra.clone();
    bigger["spec"]["memoryMiB"] = json!(16384);
    let request = can_update_machine_request(
        &machine("v1.31.1", Some("node-1")),
        &machine("v1.31.1", Some("node-1")),
        &infra,
        &bigger,
    );
    let (status, answer) = bed
        .post(
            &format!("{HOOKS}/canupdatemachine/can-update-machine"),
            &request,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(answer["status"], "Success");
    assert!(answer.get("machinePatch").is_none(), "{answer}");
    assert!(
        answer.get("infrastructureMachinePatch").is_none(),
        "{answer}"
    );
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("infrastructureMachine spec.memoryMiB"),
        "{answer}"
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_mixed_change_claims_only_the_version() {
    let bed = Bed::start().await;
    let infra = update_machine_object("infrastructureMachine");
    let mut bigger = infra.clone();
    bigger["spec"]["memoryMiB"] = json!(16384);
    let request = can_update_machine_request(
        &machine("v1.31.1", Some("node-1")),
        &machine("v1.31.2", Some("node-1")),
        &infra,
        &bigger,
    );
    let (_, answer) = bed
        .post(
            &format!("{HOOKS}/canupdatemachine/can-update-machine"),
            &request,
        )
        .await;
    assert_eq!(answer["status"], "Success");
    assert_eq!(
        decode_patch(&answer["machinePatch"]),
        json!([{"op": "replace", "path": "/spec/version", "value": "v1.31.2"}])
    );
    assert!(
        answer.get("infrastructureMachinePatch").is_none(),
        "{answer}"
    );
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.contains("claimed machine spec.version"),
        "{message}"
    );
    assert!(message.contains("memoryMiB"), "{message}");
    bed.stop().await;
}

#[tokio::test]
async fn a_version_without_a_release_is_not_claimed() {
    let bed = Bed::start().await;
    let infra = update_machine_object("infrastructureMachine");
    let request = can_update_machine_request(
        &machine("v1.31.1", Some("node-1")),
        &machine("v1.32.0", Some("node-1")),
        &infra,
        &infra,
    );
    let (_, answer) = bed
        .post(
            &format!("{HOOKS}/canupdatemachine/can-update-machine"),
            &request,
        )
        .await;
    assert_eq!(answer["status"], "Success");
    assert!(answer.get("machinePatch").is_none(), "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("no NodeRelease with kubernetesVersion v1.32.0"),
        "{answer}"
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_version_bump_for_a_cluster_that_cannot_take_plans_is_not_claimed() {
    let bed = Bed::start_with(Topology::Separate, false, Arc::new(NoDrain), 30).await;
    // c6's kubeconfig points at a cluster without the NodeUpdatePlan CRD (the management
    // cluster); c9 has no kubeconfig Secret at all.
    put_kubeconfig_secret(
        &bed.management_client,
        "c6",
        &admin_kubeconfig_yaml(&bed.management),
    )
    .await;
    for cluster in ["c6", "c9"] {
        create_cluster(&bed.management_client, cluster).await;
    }
    let infra = update_machine_object("infrastructureMachine");
    for (cluster, expected) in [
        (
            "c6",
            "workload cluster tenant-a/c6 has no NodeUpdatePlan CRD",
        ),
        (
            "c9",
            "Secret tenant-a/c9-kubeconfig (the kubeconfig of Cluster c9) does not exist",
        ),
    ] {
        let mut current = machine("v1.31.1", Some("node-1"));
        current["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!(cluster);
        current["spec"]["clusterName"] = json!(cluster);
        let mut desired = current.clone();
        desired["spec"]["version"] = json!("v1.31.2");
        let request = can_update_machine_request(&current, &desired, &infra, &infra);
        let (status, answer) = bed
            .post(
                &format!("{HOOKS}/canupdatemachine/can-update-machine"),
                &request,
            )
            .await;
        assert_eq!(status, 200);
        assert_eq!(answer["status"], "Success", "{answer}");
        assert!(answer.get("machinePatch").is_none(), "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(expected),
            "{answer}"
        );
    }
    bed.stop().await;
}

/// Anyone who reaches the extension can name any namespace and cluster in a CanUpdate*
/// request: a Secret named like a kubeconfig where no Cluster exists is never read (here it
/// points at a listener that would see the extension connect), and nothing is claimed.
#[tokio::test]
async fn a_claim_for_a_cluster_that_does_not_exist_reads_no_secret() {
    let bed = Bed::start().await;
    // Counts (and drops) every connection, so that a client that reaches it fails fast.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let mut planted: serde_yaml::Value =
        serde_yaml::from_str(&refused_kubeconfig_yaml(&bed.workload)).unwrap();
    for cluster in planted["clusters"].as_sequence_mut().unwrap() {
        cluster["cluster"] = serde_yaml::from_str(&format!("{{server: '{server}'}}")).unwrap();
    }
    put_kubeconfig_secret(
        &bed.management_client,
        "c5",
        &serde_yaml::to_string(&planted).unwrap(),
    )
    .await;
    let infra = update_machine_object("infrastructureMachine");
    let mut current = machine("v1.31.1", Some("node-1"));
    current["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!("c5");
    current["spec"]["clusterName"] = json!("c5");
    let mut desired = current.clone();
    desired["spec"]["version"] = json!("v1.31.2");
    let (status, answer) = bed
        .post(
            &format!("{HOOKS}/canupdatemachine/can-update-machine"),
            &can_update_machine_request(&current, &desired, &infra, &infra),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        connections.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the extension used the planted kubeconfig: {answer}"
    );
    assert!(answer.get("machinePatch").is_none(), "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("Cluster tenant-a/c5 does not exist in the management cluster"),
        "{answer}"
    );
    bed.stop().await;
}

#[tokio::test]
async fn a_machine_set_template_version_bump_is_claimed() {
    let bed = Bed::start().await;
    let mut current = machine_set_object("machineSet");
    current["spec"]["template"]["spec"]["version"] = json!("v1.31.1");
    let mut desired = current.clone();
    desired["spec"]["template"]["spec"]["version"] = json!("v1.31.2");
    let request = json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "CanUpdateMachineSetRequest",
        "current": {"machineSet": current, "infrastructureMachineTemplate": machine_set_object("infrastructureMachineTemplate"),
                    "bootstrapConfigTemplate": machine_set_object("bootstrapConfigTemplate")},
        "desired": {"machineSet": desired, "infrastructureMachineTemplate": machine_set_object("infrastructureMachineTemplate"),
                    "bootstrapConfigTemplate": machine_set_object("bootstrapConfigTemplate")},
    });
    let (status, answer) = bed
        .post(
            &format!("{HOOKS}/canupdatemachineset/can-update-machineset"),
            &request,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(answer["kind"], "CanUpdateMachineSetResponse");
    assert_eq!(
        decode_patch(&answer["machineSetPatch"]),
        json!([{"op": "replace", "path": "/spec/template/spec/version", "value": "v1.31.2"}])
    );

    // Memory in the infrastructure template only: nothing claimed.
    let mut template = machine_set_object("infrastructureMachineTemplate");
    template["spec"]["template"]["spec"]["memoryMiB"] = json!(16384);
    let mut request = request;
    request["desired"]["machineSet"] = request["current"]["machineSet"].clone();
    request["desired"]["infrastructureMachineTemplate"] = template;
    let (_, answer) = bed
        .post(
            &format!("{HOOKS}/canupdatemachineset/can-update-machineset"),
            &request,
        )
        .await;
    assert!(answer.get("machineSetPatch").is_none(), "{answer}");
    assert!(
        answer.get("infrastructureMachineTemplatePatch").is_none(),
        "{answer}"
    );
    bed.stop().await;
}

#[tokio::test]
async fn malformed_json_gets_a_400_with_a_message() {
    let bed = Bed::start().await;
    for hook in [
        "discovery",
        "canupdatemachine/can-update-machine",
        "canupdatemachineset/can-update-machineset",
        "updatemachine/update-machine",
    ] {
        let response = bed
            .http
            .post(bed.url(&format!("{HOOKS}/{hook}")))
            .header("content-type", "application/json")
            .body("{\"desired\": {\"machine\": ")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 400, "{hook}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["status"], "Failure");
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .starts_with("malformed "),
            "{answer}"
        );
    }
    // Well-formed JSON without the objects: a Failure that says what is missing.
    for (hook, missing) in [
        (
            "canupdatemachine/can-update-machine",
            "current.machine and desired.machine",
        ),
        (
            "canupdatemachineset/can-update-machineset",
            "current.machineSet and desired.machineSet",
        ),
    ] {
        let (status, answer) = bed.post(&format!("{HOOKS}/{hook}"), &json!({})).await;
        assert_eq!(status, 200);
        assert_eq!(answer["status"], "Failure");
        assert!(
            answer["message"].as_str().unwrap().contains(missing),
            "{answer}"
        );
    }
    // Wrong types are malformed too, not a panic.
    let (status, answer) = bed
        .post(
            &format!("{HOOKS}/updatemachine/update-machine"),
            &json!({"desired": "not an object"}),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    bed.stop().await;
}

#[tokio::test]
async fn unknown_paths_and_methods_are_refused_and_healthz_answers() {
    let bed = Bed::start().await;
    let response = bed
        .http
        .post(bed.url(&format!("{HOOKS}/beforeclustercreate/x")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
    let response = bed
        .http
        .get(bed.url(&format!("{HOOKS}/discovery")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 405);
    let response = bed.http.get(bed.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    bed.stop().await;
}

#[tokio::test]
async fn a_changed_certificate_is_served_on_the_next_handshake() {
    let bed = Bed::start().await;
    let (new_cert, new_key) = self_signed("inplace-capi rotated");
    let trusts_new_only = https_client(&new_cert);
    let healthz = bed.url("/healthz");
    assert!(
        trusts_new_only.get(&healthz).send().await.is_err(),
        "the new certificate is not served yet"
    );
    // cert-manager (through the kubelet) swaps the files; write-then-rename here.
    for (path, text) in [(&bed.key_file, &new_key), (&bed.cert_file, &new_cert)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    let response = trusts_new_only.get(&healthz).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        bed.http.get(&healthz).send().await.is_err(),
        "the old certificate is gone"
    );

    // A broken pair keeps the last good one serving.
    std::fs::write(&bed.cert_file, "not a certificate").unwrap();
    let response = trusts_new_only.get(&healthz).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    bed.stop().await;
}

#[tokio::test]
async fn the_entry_point_checks_its_config_serves_and_stops() {
    install_crypto_provider();
    let management = inplace_tests::test_api::TestApi::start().await.unwrap();
    let client = management.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed("entry point");
    std::fs::write(dir.path().join("tls.crt"), &cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), &key).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = inplace_capi::Config::new(
        format!("127.0.0.1:{port}").parse().unwrap(),
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
    );

    let mut draining = config.clone();
    draining.drain = true;
    draining.drain_timeout = std::time::Duration::ZERO;
    let error = inplace_capi::run(draining, client.clone(), async {})
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "Config", "{error}");

    let mut no_cert = config.clone();
    no_cert.cert_file = dir.path().join("missing.crt");
    let error = inplace_capi::run(no_cert, client.clone(), async {})
        .await
        .unwrap_err();
    assert_eq!(error.kind(), "Tls", "{error}");
    assert!(error.to_string().contains("missing.crt"), "{error}");

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(inplace_capi::run(config, client, async {
        let _ = stopped.await;
    }));
    let http = https_client(&cert);
    let url = format!("https://localhost:{port}{HOOKS}/discovery");
    let mut answer = None;
    for _ in 0..50 {
        if let Ok(response) = http.post(&url).json(&json!({})).send().await {
            answer = Some(response.json::<Value>().await.unwrap());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(answer.unwrap()["kind"], "DiscoveryResponse");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
