//! The Helm chart (packaging/helm/inplace) checked by the real `helm` (built from its Go
//! module, tests/tools): `helm lint`; `helm template` renders, object by object, what
//! `kubectl kustomize` renders from packaging/kubernetes (and, with `capi.enabled`, from the
//! capi overlay too), so the two install paths cannot drift; neither names an image anyone
//! could publish (the manifests a placeholder, the chart nothing until `image.repository` is
//! set); and `helm install` on the real
//! kube-apiserver, then the controller started with the args and environment of the chart's
//! Deployment as the chart's ServiceAccount, until it is ready and reconciles a NodeRollout.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use inplace_proto::NodeUpdatePlan;
use inplace_tests::test_api::{TestApi, packaging};
use inplace_tests::tools::{KillOnDrop, run_ok, tool};
use kube::Api;
use serde_json::{Value, json};

use support::{
    CONTROLLER_GROUPS, CONTROLLER_USER, create_node, create_release, create_rollout, eventually,
    rollout_when,
};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/helm/inplace")
}

fn helm(args: &[&str]) -> String {
    run_ok(Command::new(tool("helm").unwrap()).args(args).arg(chart()))
}

/// The objects of a multi-document YAML stream by (kind, namespace, name).
fn objects(yaml: &str) -> BTreeMap<String, Value> {
    let mut objects = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value: Value = serde::Deserialize::deserialize(doc).unwrap();
        if value.is_null() {
            continue;
        }
        let key = format!(
            "{}/{}/{}",
            value["kind"].as_str().unwrap(),
            value["metadata"]["namespace"].as_str().unwrap_or(""),
            value["metadata"]["name"].as_str().unwrap()
        );
        assert!(objects.insert(key.clone(), value).is_none(), "{key} twice");
    }
    objects
}

fn kustomize(dirs: &[&str]) -> BTreeMap<String, Value> {
    let kubectl = inplace_tests::apiserver::kubectl().unwrap();
    let mut all = BTreeMap::new();
    for dir in dirs {
        let rendered = run_ok(Command::new(&kubectl).arg("kustomize").arg(packaging(dir)));
        all.extend(objects(&rendered));
    }
    // Helm creates the release's namespace (`--create-namespace`) and owns no Namespace
    // object, so that one object is kustomize's alone.
    all.retain(|key, _| !key.starts_with("Namespace/"));
    all
}

/// Every number as a float: kustomize re-serialises the CRDs' `minimum: 1.0` as `1`, Helm
/// passes the file through; JSON (and so the API server) holds one value for both.
fn numbers_as_floats(value: Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64()),
        Value::Array(items) => Value::Array(items.into_iter().map(numbers_as_floats).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, numbers_as_floats(v)))
                .collect(),
        ),
        other => other,
    }
}

/// Where two values first differ: a JSON path and both values there.
fn first_difference(a: &Value, b: &Value, path: String) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) if x.keys().eq(y.keys()) => x
            .iter()
            .find(|(k, v)| y[k.as_str()] != **v)
            .map(|(k, v)| first_difference(v, &y[k.as_str()], format!("{path}.{k}")))
            .unwrap_or_default(),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .position(|(v, w)| v != w)
            .map(|i| first_difference(&x[i], &y[i], format!("{path}[{i}]")))
            .unwrap_or_default(),
        _ => format!("{path}: helm {a}, kustomize {b}"),
    }
}

fn assert_same_objects(helm: BTreeMap<String, Value>, kustomize: BTreeMap<String, Value>) {
    let helm_keys: Vec<&String> = helm.keys().collect();
    let kustomize_keys: Vec<&String> = kustomize.keys().collect();
    assert_eq!(helm_keys, kustomize_keys, "the same objects");
    for (key, object) in &kustomize {
        let (helm, kustomize) = (
            numbers_as_floats(helm[key].clone()),
            numbers_as_floats(object.clone()),
        );
        assert!(
            helm == kustomize,
            "{key}: helm and kustomize differ at {}",
            first_difference(&helm, &kustomize, String::new())
        );
    }
}

/// The image the shipped manifests name: a registry that never resolves (`.invalid`,
/// RFC 6761), for an `images:` entry of the installer's overlay to replace; this project
/// publishes no image, and a real-looking default would be pulled from whoever owns it.
const PLACEHOLDER_IMAGE: &str = concat!(
    "your-registry.invalid/inplace-controller:v",
    env!("CARGO_PKG_VERSION")
);

/// Every container image of the Deployments in `objects`, by object.
fn deployment_images(objects: &BTreeMap<String, Value>) -> Vec<(String, String)> {
    let mut images = Vec::new();
    for (key, object) in objects.iter().filter(|(k, _)| k.starts_with("Deployment/")) {
        for container in object["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            images.push((key.clone(), container["image"].as_str().unwrap().to_owned()));
        }
    }
    images
}

/// The shipped kustomize manifests name the placeholder, not an image someone might
/// publish (at 920d0d9 they named `ghcr.io/inplace-dev/inplace-controller:v0.1.0`, a
/// namespace this project does not own).
#[test]
fn the_shipped_manifests_name_a_placeholder_image_an_overlay_must_replace() {
    let images = deployment_images(&kustomize(&["", "capi"]));
    assert_eq!(images.len(), 2, "{images:?}");
    for (deployment, image) in images {
        assert_eq!(image, PLACEHOLDER_IMAGE, "{deployment}");
    }
}

/// The chart has no default image repository: rendering without one fails, naming the
/// value (at 920d0d9 it rendered `ghcr.io/inplace-dev/inplace-controller`).
#[test]
fn helm_refuses_to_render_without_an_image_repository() {
    let output = Command::new(tool("helm").unwrap())
        .args(["template", "inplace"])
        .arg(chart())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "rendered without image.repository"
    );
    assert!(stderr.contains("image.repository is required"), "{stderr}");
}

/// `--set image.repository=` the placeholder's repository: the one value without a default,
/// set as the manifests set it.
fn placeholder_repository() -> String {
    let repository = PLACEHOLDER_IMAGE.rsplit_once(':').unwrap().0;
    format!("image.repository={repository}")
}

#[test]
fn helm_lint_passes_for_the_defaults_and_each_capi_certificate_source() {
    let image = placeholder_repository();
    for values in [
        "",
        ",capi.enabled=true",
        ",capi.enabled=true,capi.tls.certManager=false,capi.tls.secretName=my-tls",
    ] {
        helm(&["lint", "--strict", "--set", &format!("{image}{values}")]);
    }
}

#[test]
fn helm_template_renders_what_kustomize_renders() {
    let image = placeholder_repository();
    let rendered = helm(&[
        "template",
        "inplace",
        "--namespace",
        "inplace-system",
        "--include-crds",
        "--set",
        &image,
    ]);
    assert_same_objects(objects(&rendered), kustomize(&[""]));

    let rendered = helm(&[
        "template",
        "inplace",
        "--namespace",
        "inplace-system",
        "--include-crds",
        "--set",
        &image,
        "--set",
        "capi.enabled=true",
    ]);
    assert_same_objects(objects(&rendered), kustomize(&["", "capi"]));
}

#[test]
fn chart_values_reach_the_deployments() {
    let rendered = objects(&helm(&[
        "template",
        "inplace",
        "--namespace",
        "ops",
        "--set",
        "image.repository=registry.example/inplace,image.tag=v9,controller.leaderElection=false",
        "--set",
        "controller.nodeEvents=false,controller.metrics.port=9090,capi.enabled=true",
        "--set",
        "capi.tls.certManager=false,capi.tls.secretName=mine,capi.drain=true,capi.drainTimeout=3m,capi.drainOnTimeout=Force",
    ]));
    let controller = &rendered["Deployment/ops/inplace-controller"]["spec"];
    assert_eq!(
        controller["replicas"], 1,
        "one replica without leader election"
    );
    let container = &controller["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.example/inplace:v9");
    assert_eq!(
        container["args"],
        json!([
            "run",
            "--metrics-addr=0.0.0.0:9090",
            "--no-leader-election",
            "--no-node-events"
        ])
    );
    let capi = &rendered["Deployment/ops/inplace-capi"]["spec"]["template"]["spec"];
    assert_eq!(capi["volumes"][0]["secret"]["secretName"], "mine");
    let args = capi["containers"][0]["args"].as_array().unwrap();
    assert!(args.contains(&json!("--drain")) && args.contains(&json!("--drain-timeout=3m")));
    assert!(args.contains(&json!("--drain-on-timeout=Force")));
    assert!(!rendered.keys().any(|k| k.starts_with("Certificate/")));
    assert_eq!(
        rendered["ExtensionConfig//inplace"]["metadata"]["annotations"]["runtime.cluster.x-k8s.io/inject-ca-from-secret"],
        "ops/mine"
    );
    assert_eq!(
        rendered["ClusterRoleBinding//inplace-controller"]["subjects"][0]["namespace"],
        "ops"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_on_the_real_server_runs_the_controller_from_the_rendered_args() {
    let api = TestApi::start().await.unwrap();
    let TestApi::Real(server) = &api else {
        panic!("helm install needs the real server")
    };
    let admin = server.admin_kubeconfig();
    let kubeconfig = ["--kubeconfig", admin.to_str().unwrap()];
    let install = [
        &[
            "install",
            "inplace",
            "--namespace",
            "inplace-system",
            "--create-namespace",
            "--set",
            "image.repository=registry.example/inplace-controller",
        ][..],
        &kubeconfig,
    ]
    .concat();
    let mut command = Command::new(tool("helm").unwrap());
    command.args(&install).arg(chart());
    run_ok(&mut command);
    let client = api.client().await.unwrap();

    // The Deployment as the server stores it: its container's args and environment.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "inplace-system");
    let deployment = deployments.get("inplace-controller").await.unwrap();
    let container = &deployment.spec.unwrap().template.spec.unwrap().containers[0];
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // The pod's port is the chart's; on this shared machine the test listens on a free one.
    let args: Vec<String> = container
        .args
        .clone()
        .unwrap()
        .into_iter()
        .map(|arg| match arg.strip_prefix("--metrics-addr=") {
            Some(_) => format!("--metrics-addr={metrics}"),
            None => arg,
        })
        .collect();
    assert_eq!(args[0], "run");
    // The environment the kubelet would fill in from the field references.
    let pod_fields = [
        ("metadata.name", "inplace-controller-0"),
        ("metadata.namespace", "inplace-system"),
    ];
    let mut env = vec![];
    for var in container.env.clone().unwrap() {
        let path = var.value_from.unwrap().field_ref.unwrap().field_path;
        let value = pod_fields.iter().find(|(p, _)| *p == path).unwrap().1;
        env.push((var.name, value));
    }

    // As the chart's ServiceAccount: only what the chart's RBAC grants works.
    let identity = server.dir().join("chart-controller.kubeconfig");
    server
        .write_kubeconfig(&identity, CONTROLLER_USER, &CONTROLLER_GROUPS)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_inplace-controller"))
        .args(&args)
        .envs(env)
        .env("KUBECONFIG", &identity)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _controller = KillOnDrop(child);
    eventually("/readyz answers 200", || async {
        let answer = http_get(metrics, "/readyz").await?;
        answer.lines().next()?.contains(" 200 ").then_some(())
    })
    .await;

    create_node(&client, "worker-1", &[]).await;
    create_release(&client, "k8s-1-31-2", "v1.31.2").await;
    create_rollout(&client, "all", json!({"release": "k8s-1-31-2"})).await;
    rollout_when(&client, "all", "status observed", |r| {
        r.status.as_ref().is_some_and(|s| s.nodes.total == 1)
    })
    .await;
    let plans: Api<NodeUpdatePlan> = Api::all(client.clone());
    let plan = eventually("the node's plan", || async {
        plans.get("worker-1").await.ok()
    })
    .await;
    assert_eq!(plan.spec.release.as_deref(), Some("k8s-1-31-2"));
    // The Lease of leader election lives in the release's namespace.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client, "inplace-system");
    assert!(
        !leases
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    Some(answer)
}
