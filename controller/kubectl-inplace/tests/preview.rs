//! `kubectl inplace preview -f rollout.yaml` against the real kube-apiserver: the nodes a
//! rollout selects in activation order and waves (control plane first and alone, slots,
//! topology groups), held, skipped and others' nodes, a closed window, the skew guard's
//! verdict and each node's download — with nothing written (every object's
//! resourceVersion unchanged, no plan, no rollout) and nothing downloaded (the artifact's
//! server is never connected to). docs/usage/standalone-rollouts.md § Previewing a rollout
//! runs as written.

use crate::support;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;

use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan};
use inplace_tests::fixtures::ReleaseFixture;
use inplace_tests::test_api::{TestApi, packaging};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::plugin;

const PAGE: &str = "../../docs/usage/standalone-rollouts.md";
/// The release the documented rollout names.
const RELEASE: &str = "kubernetes-v1.36.3";

async fn create<K>(client: &kube::Client, body: Value)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(body).unwrap();
    Api::<K>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// A Ready node with `labels`, `annotations`, cordoned or not, its kubelet at `kubelet`.
async fn node(
    client: &kube::Client,
    name: &str,
    labels: Value,
    annotations: Value,
    cordoned: bool,
) {
    create::<Node>(
        client,
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"unschedulable": cordoned},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "nodeInfo": {"kubeletVersion": "v1.36.1"},
            },
        }),
    )
    .await;
}

fn release(name: &str, kubernetes: &str, artifact_url: &str) -> Value {
    ReleaseFixture::kubelet(name, kubernetes, kubernetes)
        .kubernetes_sysext(
            &format!("{artifact_url}/kubernetes-{kubernetes}.raw"),
            &"4f0c".repeat(16),
            Some(4194304),
        )
        .json()
}

/// Every object's name and resourceVersion: what a write would change.
async fn versions(client: &kube::Client) -> BTreeMap<String, String> {
    let mut all = BTreeMap::new();
    let mut add = |kind: &str, items: Vec<(Option<String>, Option<String>)>| {
        for (name, version) in items {
            all.insert(
                format!("{kind}/{}", name.unwrap_or_default()),
                version.unwrap_or_default(),
            );
        }
    };
    let lp = Default::default();
    let meta = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        (m.name.clone(), m.resource_version.clone())
    };
    let nodes = Api::<Node>::all(client.clone()).list(&lp).await.unwrap();
    add("Node", nodes.iter().map(|o| meta(&o.metadata)).collect());
    let plans = Api::<NodeUpdatePlan>::all(client.clone())
        .list(&lp)
        .await
        .unwrap();
    add("Plan", plans.iter().map(|o| meta(&o.metadata)).collect());
    let rollouts = Api::<NodeRollout>::all(client.clone())
        .list(&lp)
        .await
        .unwrap();
    add(
        "Rollout",
        rollouts.iter().map(|o| meta(&o.metadata)).collect(),
    );
    let releases = Api::<NodeRelease>::all(client.clone())
        .list(&lp)
        .await
        .unwrap();
    add(
        "Release",
        releases.iter().map(|o| meta(&o.metadata)).collect(),
    );
    all
}

/// The table row of `node`, split into its cells.
fn row<'a>(out: &'a str, node: &str) -> Vec<&'a str> {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(node))
        .unwrap_or_else(|| panic!("no row for {node} in:\n{out}"))
        .split_whitespace()
        .collect()
}

/// A fleet of eight nodes in two zones: a control-plane node, one held, one skipped, and
/// one another, older rollout owns.
async fn fleet(client: &kube::Client, artifact_url: &str) {
    let zone = |z: &str| json!({"topology.kubernetes.io/zone": z});
    node(
        client,
        "cp-1",
        json!({"topology.kubernetes.io/zone": "a", "node-role.kubernetes.io/control-plane": ""}),
        json!({}),
        false,
    )
    .await;
    node(client, "w-a1", zone("a"), json!({}), false).await;
    node(client, "w-a2", zone("a"), json!({}), false).await;
    node(client, "w-b1", zone("b"), json!({}), false).await;
    node(client, "w-b2", zone("b"), json!({}), false).await;
    node(
        client,
        "w-held",
        zone("b"),
        json!({"inplace.dev/hold": "true"}),
        false,
    )
    .await;
    node(
        client,
        "w-skip",
        zone("a"),
        json!({"inplace.dev/skip": "true"}),
        false,
    )
    .await;
    node(
        client,
        "w-other",
        json!({"topology.kubernetes.io/zone": "a", "team": "other"}),
        json!({}),
        false,
    )
    .await;
    create::<NodeRollout>(
        client,
        json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
            "metadata": {"name": "others"},
            "spec": {"release": RELEASE, "nodeSelector": {"matchLabels": {"team": "other"}}},
        }),
    )
    .await;
    let server = client.apiserver_version().await.unwrap().git_version;
    create::<NodeRelease>(client, release(RELEASE, &server, artifact_url)).await;
    create::<NodeRelease>(client, release("kubernetes-next", "v1.99.0", artifact_url)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_shows_order_waves_slots_and_verdicts_and_writes_nothing() {
    let api = TestApi::start_shared().await.unwrap();
    api.apply_crd_dir(&packaging("crds")).await.unwrap();
    let client = api.client().await.unwrap();
    // The artifacts' server: nothing may connect to it.
    let artifacts = TcpListener::bind("127.0.0.1:0").unwrap();
    artifacts.set_nonblocking(true).unwrap();
    let artifact_url = format!("http://{}", artifacts.local_addr().unwrap());
    fleet(&client, &artifact_url).await;
    let before = versions(&client).await;
    let dir = tempfile::tempdir().unwrap();

    // The documented procedure, as written.
    let out = match api.real() {
        Some(_) => documented_preview(&api, dir.path()),
        None => {
            // The emulator has no kubectl: the plugin itself with the documented file.
            std::fs::write(dir.path().join("rollout.yaml"), documented_yaml()).unwrap();
            let file = dir.path().join("rollout.yaml");
            let (ok, out, err) = tokio::task::block_in_place(|| {
                plugin(&api, dir.path(), &["preview", "-f", file.to_str().unwrap()])
            });
            assert!(ok, "{err}");
            out
        }
    };
    eprintln!("{out}");
    assert!(out.contains("nothing written, nothing downloaded"), "{out}");
    assert!(out.contains("Skew check: passed (kubelet v1.36"), "{out}");
    assert!(out.contains("Slots: 2 of 7 nodes at once (maxUnavailable 2); at most 1 per topology.kubernetes.io/zone group"), "{out}");
    assert!(out.contains("Window: open now"), "{out}");
    assert!(
        out.contains("Held (staged, no slot until released): w-held"),
        "{out}"
    );
    assert!(
        out.contains("Skipped (keep the revision they run): w-skip"),
        "{out}"
    );
    assert!(
        out.contains("Not this rollout's: w-other (owned by rollout \"others\")"),
        "{out}"
    );
    // Control plane first and alone, then two at a time, one per zone.
    let names: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("NODE"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        names,
        ["cp-1", "w-a1", "w-a2", "w-b1", "w-b2", "w-held", "w-skip"],
        "{out}"
    );
    let waves = [
        ("cp-1", "1"),
        ("w-a1", "2"),
        ("w-b1", "2"),
        ("w-a2", "3"),
        ("w-b2", "3"),
    ];
    for (node, wave) in waves {
        assert_eq!(row(&out, node)[3], wave, "{node}: {out}");
    }
    for waiting in ["w-held", "w-skip"] {
        assert_eq!(row(&out, waiting)[3], "-", "{waiting}: {out}");
    }
    assert_eq!(row(&out, "cp-1")[1..3], ["control-plane", "a"]);
    assert_eq!(row(&out, "w-skip")[5..], ["0", "B"]);
    assert_eq!(row(&out, "w-a1")[5..], ["4.0", "MiB"]);

    // A closed window: every wave waits for its opening.
    let opens = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_hours(2))
        .unwrap();
    let start = opens.strftime("%H:%M").to_string();
    let windowed = dir.path().join("windowed.yaml");
    std::fs::write(
        &windowed,
        serde_json::to_string(&json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRollout",
            "metadata": {"name": "workers"},
            "spec": {"release": RELEASE, "maxUnavailable": 2, "maintenanceWindows": [{
                "days": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
                "start": start, "duration": "1h"}]},
        }))
        .unwrap(),
    )
    .unwrap();
    let (ok, out, err) = tokio::task::block_in_place(|| {
        plugin(
            &api,
            dir.path(),
            &["preview", "-f", windowed.to_str().unwrap()],
        )
    });
    assert!(ok, "{err}");
    let opening = format!("{}:00Z", opens.strftime("%Y-%m-%dT%H:%M"));
    assert!(
        out.contains(&format!("Window: closed now; the next opens at {opening}")),
        "{out}"
    );
    assert_eq!(row(&out, "cp-1")[3..5], ["1", opening.as_str()], "{out}");

    // Someone cordons w-b2: it takes a slot, and the control plane waits for it.
    assert_eq!(
        versions(&client).await,
        before,
        "the preview wrote something"
    );
    Api::<Node>::all(client.clone())
        .patch(
            "w-b2",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    let before = versions(&client).await;
    let documented = dir.path().join("rollout.yaml");
    let (ok, out, err) = tokio::task::block_in_place(|| {
        plugin(
            &api,
            dir.path(),
            &["preview", "-f", documented.to_str().unwrap()],
        )
    });
    assert!(ok, "{err}");
    assert!(
        out.contains("Down by others (each takes a slot): w-b2 cordoned"),
        "{out}"
    );
    assert!(
        out.contains("1 slot used by others: w-b2 cordoned"),
        "{out}"
    );
    for node in ["cp-1", "w-a1", "w-b1"] {
        assert_eq!(row(&out, node)[3], "-", "{node}: {out}");
    }

    // A kubelet newer than the API server: refused, with the condition's message.
    let skewed = dir.path().join("skewed.yaml");
    std::fs::write(
        &skewed,
        "apiVersion: inplace.dev/v1alpha1\nkind: NodeRollout\nmetadata: {name: next}\nspec: {release: kubernetes-next}\n",
    )
    .unwrap();
    let (ok, out, err) = tokio::task::block_in_place(|| {
        plugin(
            &api,
            dir.path(),
            &["preview", "-f", skewed.to_str().unwrap()],
        )
    });
    assert!(ok, "{err}");
    assert!(
        out.contains("Skew check: refused (VersionSkewDenied): release \"kubernetes-next\" brings kubelet v1.99.0, a minor version newer than the API server's"),
        "{out}"
    );

    // Not a rollout: a clear error naming the file.
    let wrong = dir.path().join("release.yaml");
    std::fs::write(
        &wrong,
        "apiVersion: inplace.dev/v1alpha1\nkind: NodeRelease\n",
    )
    .unwrap();
    let (ok, _, err) = tokio::task::block_in_place(|| {
        plugin(
            &api,
            dir.path(),
            &["preview", "-f", wrong.to_str().unwrap()],
        )
    });
    assert!(!ok);
    assert!(
        err.contains("release.yaml: kind is \"NodeRelease\", not NodeRollout"),
        "{err}"
    );

    assert_eq!(
        versions(&client).await,
        before,
        "the preview wrote something"
    );
    assert!(
        matches!(artifacts.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the preview connected to the artifacts' server"
    );
}

/// The rollout file the documented block writes.
fn documented_yaml() -> String {
    let block = documented_block();
    let yaml = block
        .split("<<'EOF'\n")
        .nth(1)
        .and_then(|rest| rest.split("\nEOF\n").next())
        .unwrap();
    format!("{yaml}\n")
}

fn documented_block() -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE);
    inplace_tests::docs::shell_block(&page, "### Previewing a rollout").unwrap()
}

/// The documented block run by bash as a person would, with kubectl of the pinned release
/// and the plugin on PATH.
fn documented_preview(api: &TestApi, dir: &Path) -> String {
    let kubeconfig = dir.join("kubeconfig");
    api.write_admin_kubeconfig(&kubeconfig).unwrap();
    let kubectl = inplace_tests::apiserver::kubectl().unwrap();
    let plugin = Path::new(env!("CARGO_BIN_EXE_kubectl-inplace"));
    let path = format!(
        "{}:{}:{}",
        kubectl.parent().unwrap().display(),
        plugin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    inplace_tests::docs::run_as_a_person(
        &documented_block(),
        dir,
        &[
            ("PATH", std::ffi::OsStr::new(&path)),
            ("KUBECONFIG", kubeconfig.as_os_str()),
        ],
    )
    .unwrap()
}
