//! Conformance of the API emulator through the real kube client: every behaviour the product
//! relies on. Each case in `on_both_servers!` runs against the real kube-apiserver (the
//! reference) and against the emulator, so a difference fails here; the rest need what only
//! the emulator can do (injected faults, its token users, its store, a history window of
//! three events) and run on it alone.

use futures::{StreamExt, TryStreamExt};
use inplace_api_emulator::{AuthzMode, Emulator, EmulatorConfig, Handle, OutageKind, User};
use inplace_tests::apiserver::ApiServer;
use inplace_tests::test_api::TestApi;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Error};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/crds")
}

/// Which server a case runs against.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Real,
    Emulator,
}

/// Runs each named case (an `async fn(Backend)`) as two tests, `NAME::real` and
/// `NAME::emulator`.
macro_rules! on_both_servers {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            #[tokio::test]
            async fn real() {
                super::$case(super::Backend::Real).await
            }
            #[tokio::test]
            async fn emulator() {
                super::$case(super::Backend::Emulator).await
            }
        }
    )*};
}

on_both_servers!(
    discovery_serves_builtins_crds_and_subresources,
    crud_with_resource_version_conflicts,
    generation_status_subresource_and_patches,
    server_side_apply_ownership_conflicts_and_force,
    selectors_limit_and_continue,
    table_responses_use_printer_columns,
    schema_validation_defaulting_pruning_and_cel,
    node_release_spec_is_immutable,
    garbage_collection_and_finalizers,
    json_patch_test_of_a_missing_path_against_null_passes,
    eviction_honours_pod_disruption_budgets,
    crds_registered_through_the_api_are_served_and_removed,
    events_are_one_resource_in_two_shapes,
    streaming_list_watch_sends_initial_events_then_changes
);

async fn start(config: EmulatorConfig) -> Handle {
    let h = Emulator::start(config).await.unwrap();
    h.apply_crd_dir(&crd_dir()).await.unwrap();
    h
}

/// The emulator with the CRDs, and an admin client, for the cases only it can produce.
async fn emulator_started() -> (Handle, Client) {
    let h = start(EmulatorConfig::default()).await;
    let c = h.client().await.unwrap();
    (h, c)
}

/// A server of `backend`, without the CRDs.
async fn server(backend: Backend) -> TestApi {
    match backend {
        Backend::Real => TestApi::Real(ApiServer::start_shared().await.unwrap()),
        Backend::Emulator => TestApi::start_emulator(EmulatorConfig::default())
            .await
            .unwrap(),
    }
}

/// A server of `backend` with the CRDs, and an admin client.
async fn started(backend: Backend) -> (TestApi, Client) {
    let api = server(backend).await;
    api.apply_crd_dir(&crd_dir()).await.unwrap();
    let c = api.client().await.unwrap();
    (api, c)
}

fn ar(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("inplace.dev", "v1alpha1", kind),
        plural,
    )
}

fn plans(c: &Client) -> Api<DynamicObject> {
    Api::all_with(c.clone(), &ar("NodeUpdatePlan", "nodeupdateplans"))
}

fn releases(c: &Client) -> Api<DynamicObject> {
    Api::all_with(c.clone(), &ar("NodeRelease", "nodereleases"))
}

fn plan(name: &str) -> Value {
    json!({
        "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan",
        "metadata": {"name": name},
        "spec": {
            "nodeName": name, "revision": "r1", "desiredState": "Staged",
            "artifacts": [{"name": "kubernetes", "type": "Sysext", "url": "https://x.example/k.raw",
                           "sha256": "a".repeat(64)}]
        }
    })
}

fn dyn_obj(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
        "labels": {"node-role.kubernetes.io/worker": ""}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.31.2",
        "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
        "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""}}}))
    .unwrap()
}

fn code(e: &Error) -> u16 {
    match e {
        Error::Api(s) => s.code,
        other => panic!("not an API error: {other:?}"),
    }
}

fn to_json<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap()
}

async fn discovery_serves_builtins_crds_and_subresources(backend: Backend) {
    let (_h, c) = started(backend).await;
    let d = kube::Discovery::new(c.clone()).run().await.unwrap();
    let mut found = Vec::new();
    for g in d.groups() {
        for (ar, _) in g.recommended_resources() {
            found.push(format!("{}/{}", ar.group, ar.plural));
        }
    }
    for want in [
        "/nodes",
        "/pods",
        "/namespaces",
        "/secrets",
        "/events",
        "events.k8s.io/events",
        "coordination.k8s.io/leases",
        "policy/poddisruptionbudgets",
        "inplace.dev/nodeupdateplans",
        "inplace.dev/nodereleases",
        "inplace.dev/noderollouts",
    ] {
        assert!(
            found.contains(&want.to_string()),
            "{want} missing from {found:?}"
        );
    }
    let v: Value = serde_json::from_str(
        &c.request_text(http::Request::get("/api/v1").body(Vec::new()).unwrap())
            .await
            .unwrap(),
    )
    .unwrap();
    let names: Vec<&str> = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(names.contains(&"pods/eviction") && names.contains(&"nodes/status"));
    let version = c.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
}

async fn crud_with_resource_version_conflicts(backend: Backend) {
    let (_h, c) = started(backend).await;
    let nodes: Api<Node> = Api::all(c.clone());
    let created = nodes
        .create(&PostParams::default(), &node("w1"))
        .await
        .unwrap();
    let rv1: u64 = created
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(
        code(
            &nodes
                .create(&PostParams::default(), &node("w1"))
                .await
                .unwrap_err()
        ),
        409
    );
    let mut changed = created.clone();
    changed
        .metadata
        .labels
        .get_or_insert_default()
        .insert("a".into(), "b".into());
    let updated = nodes
        .replace("w1", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv2: u64 = updated
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1, "resourceVersion is monotonic");
    // The stale copy now conflicts.
    assert_eq!(
        code(
            &nodes
                .replace("w1", &PostParams::default(), &changed)
                .await
                .unwrap_err()
        ),
        409
    );
    assert_eq!(code(&nodes.get("nope").await.unwrap_err()), 404);
    nodes.delete("w1", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(&nodes.get("w1").await.unwrap_err()), 404);
    // A namespaced object needs its namespace.
    let pods: Api<Pod> = Api::namespaced(c.clone(), "missing");
    let pod: Pod = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .unwrap();
    assert_eq!(
        code(&pods.create(&PostParams::default(), &pod).await.unwrap_err()),
        404
    );
}

async fn generation_status_subresource_and_patches(backend: Backend) {
    let (_h, c) = started(backend).await;
    let api = plans(&c);
    let created = api
        .create(&PostParams::default(), &dyn_obj(plan("w1")))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    // Defaults were applied on write.
    assert_eq!(created.data["spec"]["activation"], json!({}));
    // Status through the status subresource does not bump generation nor touch spec.
    let st = api
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Downloading"}, "spec": {"revision": "zzz"}})),
        )
        .await
        .unwrap();
    assert_eq!(st.metadata.generation, Some(1));
    assert_eq!(st.data["status"]["phase"], "Downloading");
    assert_eq!(st.data["spec"]["revision"], "r1");
    // Status in a main-resource write is ignored.
    let m = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "y"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(m.data["status"]["phase"], "Downloading");
    assert_eq!(
        m.metadata.generation,
        Some(1),
        "metadata-only change keeps generation"
    );
    // JSON patch on spec bumps generation.
    let j = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
            {"op": "replace", "path": "/spec/desiredState", "value": "Active"}]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    assert_eq!(j.metadata.generation, Some(2));
    assert_eq!(j.data["spec"]["desiredState"], "Active");
    // A no-op write keeps the resourceVersion.
    let again = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"desiredState": "Active"}})),
        )
        .await
        .unwrap();
    assert_eq!(again.metadata.resource_version, j.metadata.resource_version);
    // A merge patch carrying a stale resourceVersion is a precondition failure.
    let stale = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"resourceVersion": "1"}, "spec": {"revision": "r2"}}),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&stale), 409);
    // Update of a custom resource without resourceVersion is invalid.
    let mut no_rv = j.clone();
    no_rv.metadata.resource_version = None;
    assert_eq!(
        code(
            &api.replace("w1", &PostParams::default(), &no_rv)
                .await
                .unwrap_err()
        ),
        422
    );
}

async fn server_side_apply_ownership_conflicts_and_force(backend: Backend) {
    let (_h, c) = started(backend).await;
    let api = plans(&c);
    let ctl = PatchParams::apply("controller");
    api.patch("w1", &ctl, &Patch::Apply(plan("w1")))
        .await
        .unwrap();
    // Another manager changing a field the controller owns conflicts.
    let mut theirs = plan("w1");
    theirs["spec"]["revision"] = json!("other");
    let err = api
        .patch("w1", &PatchParams::apply("person"), &Patch::Apply(&theirs))
        .await
        .unwrap_err();
    assert_eq!(code(&err), 409);
    if let Error::Api(s) = &err {
        assert!(
            s.message.contains("controller") && s.message.contains(".spec.revision"),
            "{}",
            s.message
        );
    }
    // Forced, it wins and takes ownership.
    let forced = api
        .patch(
            "w1",
            &PatchParams::apply("person").force(),
            &Patch::Apply(&theirs),
        )
        .await
        .unwrap();
    assert_eq!(forced.data["spec"]["revision"], "other");
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert!(managers.contains(&"controller".into()) && managers.contains(&"person".into()));
    // The agent applies status through the subresource with its own manager: no conflict.
    let status = json!({"apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan", "metadata": {"name": "w1"},
                        "status": {"phase": "Staged", "conditions": [{"type": "Ready", "status": "False", "reason": "Staged",
                                   "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    let s = api
        .patch_status("w1", &PatchParams::apply("agent"), &Patch::Apply(&status))
        .await
        .unwrap();
    assert_eq!(s.data["status"]["phase"], "Staged");
    let entry = s
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .find(|m| m.manager.as_deref() == Some("agent"))
        .unwrap();
    assert_eq!(entry.subresource.as_deref(), Some("status"));
    // Dropping a field from one's apply configuration removes it when nobody else owns it.
    let mut slim = plan("w1");
    slim["spec"]["revision"] = json!("other");
    slim["spec"].as_object_mut().unwrap().remove("desiredState");
    api.patch(
        "w1",
        &PatchParams::apply("person").force(),
        &Patch::Apply(&slim),
    )
    .await
    .unwrap();
    let mut ctl_slim = plan("w1");
    ctl_slim["spec"].as_object_mut().unwrap().remove("revision");
    ctl_slim["spec"]
        .as_object_mut()
        .unwrap()
        .remove("desiredState");
    let after = api
        .patch("w1", &ctl, &Patch::Apply(&ctl_slim))
        .await
        .unwrap();
    // desiredState has a default, so it comes back as the default.
    assert_eq!(after.data["spec"]["desiredState"], "Staged");
    assert_eq!(after.data["spec"]["revision"], "other");
}

async fn selectors_limit_and_continue(backend: Backend) {
    let (_h, c) = started(backend).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    for i in 0..5 {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": format!("p{i}"), "labels": {"app": if i % 2 == 0 {"even"} else {"odd"}}},
            "spec": {"nodeName": format!("n{}", i % 2), "containers": [{"name": "c", "image": "i"}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let on_n0 = pods
        .list(&ListParams::default().fields("spec.nodeName=n0"))
        .await
        .unwrap();
    assert_eq!(on_n0.items.len(), 3);
    let odd = pods
        .list(&ListParams::default().labels("app=odd"))
        .await
        .unwrap();
    assert_eq!(odd.items.len(), 2);
    let named = pods
        .list(&ListParams::default().fields("metadata.name=p3"))
        .await
        .unwrap();
    assert_eq!(named.items.len(), 1);
    let bad = pods
        .list(&ListParams::default().fields("spec.bogus=1"))
        .await
        .unwrap_err();
    assert_eq!(code(&bad), 400);
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(2);
    loop {
        let page = pods.list(&lp).await.unwrap();
        assert!(page.items.len() <= 2);
        seen.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap()));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => lp = lp.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(seen, vec!["p0", "p1", "p2", "p3", "p4"]);
    let all: Api<Pod> = Api::all(c.clone());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        5
    );
}

#[tokio::test]
async fn watch_from_resource_version_with_bookmarks() {
    let h = start(EmulatorConfig {
        bookmark_interval: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let c = h.client().await.unwrap();
    let api = plans(&c);
    let first = api
        .create(&PostParams::default(), &dyn_obj(plan("w1")))
        .await
        .unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    api.create(&PostParams::default(), &dyn_obj(plan("w2")))
        .await
        .unwrap();
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"revision": "r9"}})),
    )
    .await
    .unwrap();
    // Watch w1 alone (the agent's pattern), from the first resourceVersion.
    let wp = WatchParams::default()
        .fields("metadata.name=w1")
        .timeout(60);
    let mut s = api.watch(&wp, &rv).await.unwrap().boxed();
    let ev = tokio::time::timeout(Duration::from_secs(30), s.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        WatchEvent::Modified(o) => assert_eq!(o.data["spec"]["revision"], "r9"),
        other => panic!("expected MODIFIED of w1, got {other:?}"),
    }
    api.delete("w2", &DeleteParams::default()).await.unwrap();
    api.delete("w1", &DeleteParams::default()).await.unwrap();
    let mut saw_bookmark = false;
    let mut saw_delete = false;
    while !(saw_bookmark && saw_delete) {
        match tokio::time::timeout(Duration::from_secs(30), s.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Bookmark(_) => saw_bookmark = true,
            WatchEvent::Deleted(o) => {
                assert_eq!(
                    o.metadata.name.as_deref(),
                    Some("w1"),
                    "w2's delete must not reach a w1 watch"
                );
                saw_delete = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn too_old_resource_version_is_gone() {
    let h = start(EmulatorConfig {
        history_window: 3,
        ..Default::default()
    })
    .await;
    let c = h.client().await.unwrap();
    let api = plans(&c);
    let first = api
        .create(&PostParams::default(), &dyn_obj(plan("w1")))
        .await
        .unwrap();
    for i in 0..6 {
        api.patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"revision": format!("r{i}")}})),
        )
        .await
        .unwrap();
    }
    let rv = first.metadata.resource_version.unwrap();
    let mut s = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match s.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // Listing with a compacted continue token is 410 too; a fresh list works.
    assert!(api.list(&ListParams::default()).await.is_ok());
}

async fn table_responses_use_printer_columns(backend: Backend) {
    let (_h, c) = started(backend).await;
    plans(&c)
        .create(&PostParams::default(), &dyn_obj(plan("w1")))
        .await
        .unwrap();
    plans(&c)
        .patch_status("w1", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Verifying",
            "conditions": [{"type": "Ready", "status": "False", "reason": "Verifying", "message": "12s of 30s",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})))
        .await
        .unwrap();
    let req = http::Request::get("/apis/inplace.dev/v1alpha1/nodeupdateplans")
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .unwrap();
    let t: Value = serde_json::from_str(&c.request_text(req).await.unwrap()).unwrap();
    assert_eq!(t["kind"], "Table");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cols,
        vec![
            "Name", "Node", "Desired", "Phase", "Target", "Current", "Progress", "Age", "Release",
            "Message"
        ]
    );
    let cells = &t["rows"][0]["cells"];
    assert_eq!(cells[0], "w1");
    assert_eq!(cells[3], "Verifying");
    assert_eq!(cells[9], "12s of 30s");
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
}

async fn schema_validation_defaulting_pruning_and_cel(backend: Backend) {
    let (_h, c) = started(backend).await;
    let api = plans(&c);
    let mut bad_enum = plan("w1");
    bad_enum["spec"]["desiredState"] = json!("Sideways");
    let e = api
        .create(&PostParams::default(), &dyn_obj(bad_enum))
        .await
        .unwrap_err();
    assert_eq!(code(&e), 422);
    let mut bad_sha = plan("w1");
    bad_sha["spec"]["artifacts"][0]["sha256"] = json!("XYZ");
    assert_eq!(
        code(
            &api.create(&PostParams::default(), &dyn_obj(bad_sha))
                .await
                .unwrap_err()
        ),
        422
    );
    let mut missing = plan("w1");
    missing["spec"]["artifacts"][0]
        .as_object_mut()
        .unwrap()
        .remove("url");
    assert_eq!(
        code(
            &api.create(&PostParams::default(), &dyn_obj(missing))
                .await
                .unwrap_err()
        ),
        422
    );
    // CEL at the root: spec.nodeName must equal metadata.name.
    let mut other_node = plan("w1");
    other_node["spec"]["nodeName"] = json!("w2");
    let e = api
        .create(&PostParams::default(), &dyn_obj(other_node))
        .await
        .unwrap_err();
    assert_eq!(code(&e), 422);
    // CEL on an item: a Binary needs a path.
    let mut binary = plan("w1");
    binary["spec"]["artifacts"][0]["type"] = json!("Binary");
    assert_eq!(
        code(
            &api.create(&PostParams::default(), &dyn_obj(binary))
                .await
                .unwrap_err()
        ),
        422
    );
    // CEL on an item: mode, owner and directory are a Config's; a mode has no setuid bit.
    let mut sysext_mode = plan("w1");
    sysext_mode["spec"]["artifacts"][0]["mode"] = json!("0644");
    let mut setuid = plan("w1");
    setuid["spec"]["artifacts"][0]["type"] = json!("Config");
    setuid["spec"]["artifacts"][0]["path"] = json!("/etc/kubernetes/kubelet.conf");
    setuid["spec"]["artifacts"][0]["mode"] = json!("4755");
    let mut sysext_directory = plan("w1");
    sysext_directory["spec"]["artifacts"][0]["directory"] = json!(true);
    for refused in [sysext_mode, setuid, sysext_directory] {
        let e = api
            .create(&PostParams::default(), &dyn_obj(refused))
            .await
            .unwrap_err();
        assert_eq!(code(&e), 422);
    }
    // Duplicate list-map keys.
    let mut dup = plan("w1");
    let a = dup["spec"]["artifacts"][0].clone();
    dup["spec"]["artifacts"].as_array_mut().unwrap().push(a);
    assert_eq!(
        code(
            &api.create(&PostParams::default(), &dyn_obj(dup))
                .await
                .unwrap_err()
        ),
        422
    );
    // Unknown fields are pruned (no fieldValidation, as kube-rs sends), rejected when Strict.
    let mut extra = plan("w1");
    extra["spec"]["bogus"] = json!(1);
    let strict = c
        .request_text(
            http::Request::post(
                "/apis/inplace.dev/v1alpha1/nodeupdateplans?fieldValidation=Strict",
            )
            .header("Content-Type", "application/json")
            .body(serde_json::to_vec(&extra).unwrap())
            .unwrap(),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&strict), 400);
    let created = api
        .create(&PostParams::default(), &dyn_obj(extra))
        .await
        .unwrap();
    assert!(created.data["spec"].get("bogus").is_none());
    assert_eq!(
        created.data["spec"]["healthChecks"]["window"], "30s",
        "nested defaults applied"
    );
}

async fn node_release_spec_is_immutable(backend: Backend) {
    let (_h, c) = started(backend).await;
    let api = releases(&c);
    let artifact = |name: &str| json!({"name": name, "type": "Sysext", "url": format!("https://x/{name}.raw"), "sha256": "b".repeat(64)});
    let rel = json!({"apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease", "metadata": {"name": "r1"},
        "spec": {"version": "v1", "artifacts": [artifact("k"), artifact("c")]}});
    api.create(&PostParams::default(), &dyn_obj(rel))
        .await
        .unwrap();
    let e = api
        .patch(
            "r1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": "v2"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), 422, "transition rule self == oldSelf");
    // `artifacts` is a map list: the same items in another order are the same spec.
    api.patch(
        "r1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"artifacts": [artifact("c"), artifact("k")]}})),
    )
    .await
    .expect("a reordered map list is unchanged for self == oldSelf");
    // Labels may still change.
    api.patch(
        "r1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await
    .unwrap();
}

async fn garbage_collection_and_finalizers(backend: Backend) {
    let (_api, c) = started(backend).await;
    let api = plans(&c);
    let owner = api
        .create(&PostParams::default(), &dyn_obj(plan("owner")))
        .await
        .unwrap();
    let mut dep = plan("dep");
    dep["metadata"]["ownerReferences"] = json!([{"apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan",
        "name": "owner", "uid": owner.metadata.uid.clone().unwrap()}]);
    api.create(&PostParams::default(), &dyn_obj(dep))
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    // The real garbage collector works from its informers: allow it minutes on a loaded machine.
    let mut gone = false;
    for _ in 0..1200 {
        if api.get_opt("dep").await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the dependent is collected");
    // Finalizers hold deletion until the last one is removed; none may be added meanwhile.
    let mut held = plan("held");
    held["metadata"]["finalizers"] = json!(["inplace.dev/test", "inplace.dev/other"]);
    api.create(&PostParams::default(), &dyn_obj(held))
        .await
        .unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let marked = api.get("held").await.unwrap().metadata.deletion_timestamp;
    assert!(marked.is_some());
    let added = api
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["inplace.dev/test", "inplace.dev/other", "late"]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&added), 422);
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["inplace.dev/other"]}})),
    )
    .await
    .unwrap();
    let still = api.get("held").await.unwrap();
    assert_eq!(
        still.metadata.deletion_timestamp, marked,
        "the deletion time stays"
    );
    assert_eq!(
        still.metadata.finalizers,
        Some(vec!["inplace.dev/other".to_owned()])
    );
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(code(&api.get("held").await.unwrap_err()), 404);
}

/// kube-runtime's finalizer helper adds the first finalizer with `test /metadata/finalizers
/// == null` then `add`: the real server passes that test on a missing path (the emulator
/// refused it, and a rollout on the emulator never got its finalizer).
async fn json_patch_test_of_a_missing_path_against_null_passes(backend: Backend) {
    let (_api, c) = started(backend).await;
    let api = plans(&c);
    api.create(&PostParams::default(), &dyn_obj(plan("p")))
        .await
        .unwrap();
    let first: Patch<()> = Patch::Json(
        serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["inplace.dev/test"]},
        ]))
        .unwrap(),
    );
    let patched = api
        .patch("p", &PatchParams::default(), &first)
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.finalizers,
        Some(vec!["inplace.dev/test".to_owned()])
    );
    // Now present: the same test fails, and nothing changes.
    let refused = api
        .patch("p", &PatchParams::default(), &first)
        .await
        .unwrap_err();
    assert_eq!(code(&refused), 422);
    api.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

fn pod(name: &str, ready: bool) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"nodeName": "w1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}}))
    .unwrap()
}

async fn eviction_honours_pod_disruption_budgets(backend: Backend) {
    let (h, _) = started(backend).await;
    let c = h.client_without_retries().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    for n in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(n, true))
            .await
            .unwrap();
        // Pod status is reset on create (as in kube-apiserver); the kubelet sets it.
        pods.patch_status(
            n,
            &PatchParams::default(),
            &Patch::Merge(to_json(&pod(n, true))),
        )
        .await
        .unwrap();
    }
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(c.clone(), "default");
    pdbs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})).unwrap(),
    )
    .await
    .unwrap();
    // kube-apiserver refuses evictions (429, "still being processed") until the disruption
    // controller has observed the budget; the emulator has no such controller and decides
    // budgets at eviction time.
    for _ in 0..if h.real().is_some() { 1200 } else { 0 } {
        let pdb = pdbs.get("web").await.unwrap();
        let observed = pdb.status.as_ref().and_then(|s| s.observed_generation);
        if observed.is_some() && observed >= pdb.metadata.generation {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pods.evict("a", &Default::default()).await.unwrap();
    // A pod bound to a node terminates gracefully: its kubelet (none runs here) deletes it
    // for good once its containers stopped. Finish it as the kubelet would.
    if let Some(terminating) = pods.get_opt("a").await.unwrap() {
        assert!(terminating.metadata.deletion_timestamp.is_some());
        pods.delete("a", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    assert_eq!(code(&pods.get("a").await.unwrap_err()), 404);
    let e = pods.evict("b", &Default::default()).await.unwrap_err();
    assert_eq!(
        code(&e),
        429,
        "evicting the last healthy pod violates minAvailable=1"
    );
    assert!(pods.get("b").await.is_ok());
}

#[tokio::test]
async fn node_identities_are_restricted() {
    let h = start(EmulatorConfig {
        authz: AuthzMode::Rbac,
        ..Default::default()
    })
    .await;
    let admin = h.client().await.unwrap();
    // What the product ships: nodes read plans and write plan status; a policy pins each node to its plan.
    let rbac = json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "inplace-agent"},
         "rules": [{"apiGroups": ["inplace.dev"], "resources": ["nodeupdateplans"], "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["inplace.dev"], "resources": ["nodeupdateplans/status"], "verbs": ["patch", "update"]},
                   {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "inplace-agent"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "inplace-agent"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "inplace-node-own-plan"},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["inplace.dev"], "apiVersions": ["*"], "operations": ["UPDATE"],
                                                          "resources": ["nodeupdateplans", "nodeupdateplans/status"]}]},
                  "matchConditions": [{"name": "nodes-only", "expression": "request.userInfo.username.startsWith('system:node:')"}],
                  "validations": [{"expression": "request.userInfo.username == 'system:node:' + object.metadata.name",
                                   "message": "a node may only write its own plan"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "inplace-node-own-plan"},
         "spec": {"policyName": "inplace-node-own-plan", "validationActions": ["Deny"]}}
    ]);
    for o in rbac.as_array().unwrap() {
        let kind = o["kind"].as_str().unwrap();
        let (group, version) = o["apiVersion"].as_str().unwrap().split_once('/').unwrap();
        let plural = format!("{}s", kind.to_lowercase()).replace("policys", "policies");
        let api: Api<DynamicObject> = Api::all_with(
            admin.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(group, version, kind),
                &plural,
            ),
        );
        api.create(&PostParams::default(), &dyn_obj(o.clone()))
            .await
            .unwrap();
    }
    plans(&admin)
        .create(&PostParams::default(), &dyn_obj(plan("w1")))
        .await
        .unwrap();
    plans(&admin)
        .create(&PostParams::default(), &dyn_obj(plan("w2")))
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(&PostParams::default(), &node("w1"))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("w2"))
        .await
        .unwrap();

    let w1 = h.client_as_node("w1").await.unwrap();
    let status = Patch::Merge(json!({"status": {"phase": "Staged"}}));
    plans(&w1)
        .patch_status("w1", &PatchParams::default(), &status)
        .await
        .unwrap();
    let e = plans(&w1)
        .patch_status("w2", &PatchParams::default(), &status)
        .await
        .unwrap_err();
    assert_eq!(code(&e), 403, "admission policy: only its own plan");
    let e = plans(&w1)
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"revision": "x"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), 403, "RBAC: no spec writes");
    let e = plans(&w1)
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(code(&e), 403);
    // NodeRestriction: its own Node only.
    let nodes_w1: Api<Node> = Api::all(w1.clone());
    nodes_w1
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    let e = nodes_w1
        .patch(
            "w2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), 403);
    // Reads work; an unknown token is 401.
    assert_eq!(
        plans(&w1)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
    let stranger = User::new("bad", "nobody", &[]);
    let nobody = h.client_as(&stranger).await.unwrap();
    assert_eq!(
        code(
            &plans(&nobody)
                .list(&ListParams::default())
                .await
                .unwrap_err()
        ),
        403
    );
    let ns: Api<Namespace> = Api::all(w1.clone());
    assert_eq!(
        code(&ns.list(&ListParams::default()).await.unwrap_err()),
        403
    );
}

#[tokio::test]
async fn unknown_token_is_unauthorized() {
    let (h, _c) = emulator_started().await;
    let kubeconfig = h
        .kubeconfig_yaml(&User::new("t1", "someone", &[]))
        .replace("\"t1\"", "\"wrong\"");
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(cfg).unwrap();
    let nodes: Api<Node> = Api::all(client);
    assert_eq!(
        code(&nodes.list(&ListParams::default()).await.unwrap_err()),
        401
    );
}

#[tokio::test]
async fn faults_outage_conflicts_cut_and_gone() {
    let (h, _) = emulator_started().await;
    let c = h.client_without_retries().await.unwrap();
    let api = plans(&c);
    api.create(&PostParams::default(), &dyn_obj(plan("w1")))
        .await
        .unwrap();
    // 503 outage, then recovery.
    h.faults()
        .outage(Duration::from_secs(600), OutageKind::Unavailable);
    assert_eq!(code(&api.get("w1").await.unwrap_err()), 503);
    h.faults().end_outage();
    api.get("w1").await.unwrap();
    // Connection refused outage.
    h.faults()
        .outage(Duration::from_secs(600), OutageKind::ConnectionRefused);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fresh = h.client_without_retries().await.unwrap();
    assert!(matches!(
        plans(&fresh).get("w1").await.unwrap_err(),
        Error::HyperError(_) | Error::Service(_)
    ));
    h.faults().end_outage();
    let mut ok = false;
    for _ in 0..100 {
        if plans(&h.client().await.unwrap()).get("w1").await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "the server comes back after the outage");
    let c = h.client().await.unwrap();
    let api = plans(&c);
    // Forced conflicts on the next writes.
    h.faults().conflict_next_writes(2);
    let merge = Patch::Merge(json!({"spec": {"revision": "r2"}}));
    assert_eq!(
        code(
            &api.patch("w1", &PatchParams::default(), &merge)
                .await
                .unwrap_err()
        ),
        409
    );
    assert_eq!(
        code(
            &api.patch("w1", &PatchParams::default(), &merge)
                .await
                .unwrap_err()
        ),
        409
    );
    api.patch("w1", &PatchParams::default(), &merge)
        .await
        .unwrap();
    // Latency: requests still succeed.
    h.faults().latency(Duration::from_millis(20));
    api.get("w1").await.unwrap();
    h.faults().latency(Duration::ZERO);
    // Cut watches end the stream.
    let mut s = api
        .watch(&WatchParams::default().timeout(600), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(
        s.try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    h.faults().cut_watches();
    let end = tokio::time::timeout(Duration::from_secs(30), s.try_next())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None) | Err(_)), "stream ends: {end:?}");
    // 410 on the next watch.
    h.faults().gone_next_watch();
    let rv = api
        .get("w1")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut s = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match s.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn kube_runtime_watcher_follows_one_object() {
    use kube::runtime::{WatchStreamExt, watcher};
    let (h, c) = emulator_started().await;
    let api = plans(&c);
    api.create(&PostParams::default(), &dyn_obj(plan("w1")))
        .await
        .unwrap();
    let cfg = watcher::Config::default().fields("metadata.name=w1");
    let mut stream = watcher::watcher(api.clone(), cfg)
        .default_backoff()
        .applied_objects()
        .boxed();
    let first = tokio::time::timeout(Duration::from_secs(30), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.data["spec"]["revision"], "r1");
    // Survives a 410 and a cut: it re-lists and carries on.
    h.faults().gone_next_watch();
    h.faults().cut_watches();
    api.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"revision": "r2"}})),
    )
    .await
    .unwrap();
    let mut errors = 0;
    loop {
        // The watcher reports the 410 as an error item, then re-lists.
        match tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .unwrap()
            .unwrap()
        {
            Ok(o) if o.data["spec"]["revision"] == "r2" => break,
            Ok(_) => {}
            Err(_) => errors += 1,
        }
    }
    assert!(errors <= 3);
}

async fn crds_registered_through_the_api_are_served_and_removed(backend: Backend) {
    let h = server(backend).await;
    let c = h.client().await.unwrap();
    assert_eq!(
        code(&plans(&c).list(&ListParams::default()).await.unwrap_err()),
        404
    );
    h.apply_crd_dir(&crd_dir()).await.unwrap();
    plans(&c)
        .create(&PostParams::default(), &dyn_obj(plan("w1")))
        .await
        .unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(c.clone());
    let crd = crds.get("nodeupdateplans.inplace.dev").await.unwrap();
    let established = crd
        .status
        .unwrap()
        .conditions
        .unwrap()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established);
    crds.delete("nodeupdateplans.inplace.dev", &DeleteParams::default())
        .await
        .unwrap();
    // kube-apiserver first deletes every instance (the CRD's cleanup finalizer), then stops
    // serving the kind: a while, on a loaded machine.
    let mut last = None;
    for _ in 0..1200 {
        match plans(&c).list(&ListParams::default()).await {
            Err(e) if code(&e) == 404 => return,
            other => last = Some(other.map(|list| list.items.len())),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the kind is still served after its CRD was deleted: {last:?}");
}

async fn events_are_one_resource_in_two_shapes(backend: Backend) {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let (_h, c) = started(backend).await;
    let created = plans(&c)
        .create(&PostParams::default(), &dyn_obj(plan("w1")))
        .await
        .unwrap();
    let reporter = Reporter {
        controller: "inplace-controller".into(),
        instance: Some("test".into()),
    };
    let recorder = Recorder::new(c.clone(), reporter);
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("inplace.dev/v1alpha1".into()),
        kind: Some("NodeUpdatePlan".into()),
        name: created.metadata.name.clone(),
        uid: created.metadata.uid.clone(),
        ..Default::default()
    };
    recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "Staged".into(),
                note: Some("staged r1".into()),
                action: "Stage".into(),
                secondary: None,
            },
            &reference,
        )
        .await
        .unwrap();
    // `kubectl get events` reads core/v1.
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), "default");
    let list = core
        .list(&ListParams::default().fields("involvedObject.name=w1"))
        .await
        .unwrap();
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].message.as_deref(), Some("staged r1"));
    assert_eq!(
        list.items[0].reporting_component.as_deref(),
        Some("inplace-controller")
    );
}

async fn streaming_list_watch_sends_initial_events_then_changes(backend: Backend) {
    use kube::runtime::{WatchStreamExt, watcher};
    let (_h, c) = started(backend).await;
    let api = plans(&c);
    for n in ["w1", "w2"] {
        api.create(&PostParams::default(), &dyn_obj(plan(n)))
            .await
            .unwrap();
    }
    // kube-rs opens the streaming list at resourceVersion "0": any freshness, so the real
    // server answers from its watch cache, which may not have the second create yet (a
    // loaded run saw only w1 before the initial events ended; the watch then brings w2 as
    // an ordinary event). A consistent list first waits until the cache has both.
    api.list(&ListParams::default()).await.unwrap();
    let cfg = watcher::Config::default().streaming_lists();
    let mut stream = watcher::watcher(api.clone(), cfg).boxed();
    let mut init = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => init.push(o.metadata.name.unwrap()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    init.sort();
    assert_eq!(init, vec!["w1", "w2"]);
    api.delete("w2", &DeleteParams::default()).await.unwrap();
    let mut rest = stream.touched_objects().boxed();
    let o = tokio::time::timeout(Duration::from_secs(30), rest.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(o.metadata.name.as_deref(), Some("w2"));
}
