//! Cluster API's core controller manager (its release's own binary, built from the pinned
//! module) runs against the bed's real kube-apiserver with its CRDs and webhooks as a
//! release installs them: the API server calls its mutating, validating and conversion
//! webhooks over TLS with a certificate from the bed's CA, and it stops cleanly.

// Test code: a failed setup step should fail the test loudly.

use inplace_tests::apiserver::ApiServer;
use inplace_tests::capi::extension::{self, CapiExtension};
use inplace_tests::capi::manager::CapiManager;

const MACHINE: &str = r#"{
  "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
  "metadata": {"name": "m1", "namespace": "default"},
  "spec": {
    "clusterName": "c1", "version": "1.36.1",
    "bootstrap": {"dataSecretName": "m1-bootstrap"},
    "infrastructureRef": {"apiGroup": "infrastructure.example.dev", "kind": "BedMachine", "name": "m1"}
  }
}"#;

// No object references: converting one needs no provider's CRD (a Machine's does).
const HEALTH_CHECK: &str = r#"{
  "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
  "metadata": {"name": "h1", "namespace": "default"},
  "spec": {
    "clusterName": "c1", "selector": {"matchLabels": {"pool": "a"}},
    "checks": {"nodeStartupTimeoutSeconds": 600}
  }
}"#;

const CLUSTER_WITH_TOPOLOGY: &str = r#"{
  "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
  "metadata": {"name": "c2", "namespace": "default"},
  "spec": {"topology": {"classRef": {"name": "some-class"}, "version": "v1.36.1"}}
}"#;

fn apply(
    server: &ApiServer,
    dir: &std::path::Path,
    name: &str,
    text: &str,
) -> anyhow::Result<String> {
    let file = dir.join(name);
    std::fs::write(&file, text).unwrap();
    server.run_kubectl(&["create", "-f", file.to_str().unwrap()])
}

#[tokio::test]
async fn capi_manager_serves_its_webhooks_and_stops_cleanly() {
    let server = ApiServer::start()
        .await
        .expect("the real API server starts");
    let manager = CapiManager::start(&server)
        .await
        .expect("Cluster API's manager starts with its CRDs and webhooks");
    let dir = tempfile::tempdir().unwrap();

    // Mutating webhook (Machine defaulting): the version gets its "v", the cluster label is set.
    apply(&server, dir.path(), "machine.json", MACHINE).expect("a valid Machine is created");
    let version = server
        .run_kubectl(&[
            "get",
            "machines.v1beta2.cluster.x-k8s.io",
            "m1",
            "-o",
            "jsonpath={.spec.version} {.metadata.labels.cluster\\.x-k8s\\.io/cluster-name}",
        ])
        .unwrap();
    assert_eq!(
        version,
        "v1.36.1 c1",
        "defaulted by CAPI's webhook:\n{}",
        manager.log_tail()
    );

    // Conversion webhook: v1beta1 has the startup timeout as a duration, v1beta2 seconds.
    apply(&server, dir.path(), "check.json", HEALTH_CHECK).expect("a valid health check");
    let v1beta1 = server
        .run_kubectl(&[
            "get",
            "machinehealthchecks.v1beta1.cluster.x-k8s.io",
            "h1",
            "-o",
            "jsonpath={.spec.nodeStartupTimeout}",
        ])
        .unwrap();
    assert_eq!(
        v1beta1,
        "10m0s",
        "converted by CAPI's webhook:\n{}",
        manager.log_tail()
    );

    // Validating webhook: a topology is refused while the ClusterTopology gate is off.
    let refused = apply(&server, dir.path(), "cluster.json", CLUSTER_WITH_TOPOLOGY)
        .expect_err("CAPI's webhook refuses a Cluster topology with ClusterTopology off");
    assert!(
        format!("{refused:#}").contains("ClusterTopology feature flag"),
        "{refused:#}"
    );

    let status = manager
        .stop()
        .await
        .expect("the manager stops after SIGTERM");
    assert!(status.success(), "capi-manager exited {status}");
    // Its webhooks went with it: CAPI's kinds are still served (not defaulted any more).
    let plain = MACHINE.replace("\"m1\"", "\"m2\"");
    apply(&server, dir.path(), "machine2.json", &plain)
        .expect("no webhook left behind that fails closed");
}

/// The extension registered as docs/usage/cluster-api.md registers it (the packaged
/// ExtensionConfig, its CA bundle injected from the Secret): Cluster API's Runtime SDK client
/// reaches it by its Service name over TLS and discovers its three handlers.
#[tokio::test]
async fn capi_discovers_the_extension_from_the_packaged_extension_config() {
    let server = ApiServer::start()
        .await
        .expect("the real API server starts");
    let address = extension::service_address();
    let manager = CapiManager::start_with(&server, &[(extension::SERVICE_HOST, address)])
        .await
        .expect("Cluster API's manager starts");
    let extension = CapiExtension::start(&server, address)
        .await
        .expect("the extension starts and its ExtensionConfig is applied");

    let discovered = server.run_kubectl(&[
        "wait",
        "extensionconfig/inplace",
        "--for=condition=Discovered",
        "--timeout=180s",
    ]);
    let status = server
        .run_kubectl(&["get", "extensionconfig", "inplace", "-o", "json"])
        .unwrap();
    assert!(
        discovered.is_ok(),
        "{discovered:?}\n{status}\n--- capi-manager\n{}\n--- extension\n{}",
        manager.log_tail(),
        extension.log()
    );
    let config: serde_json::Value = serde_json::from_str(&status).unwrap();
    let ca = String::from_utf8(server.ca_pem().unwrap()).unwrap();
    let injected = config["spec"]["clientConfig"]["caBundle"]
        .as_str()
        .unwrap_or_default();
    let injected = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, injected)
        .unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(&injected),
        ca,
        "CAPI injected the Secret's ca.crt"
    );
    let mut handlers: Vec<&str> = config["status"]["handlers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    handlers.sort_unstable();
    assert_eq!(
        handlers,
        [
            "can-update-machine.inplace",
            "can-update-machineset.inplace",
            "update-machine.inplace"
        ]
    );
    manager.stop().await.unwrap();
}
