//! `inplace-controller release from-oci` as a person runs it: a file the real `crane` pushed
//! to a real registry (go-containerregistry's, `crane registry serve`), named by its tag, the
//! block of docs/usage/standalone-rollouts.md § From an OCI registry run as written, and its
//! release applied with kubectl to the API server (the real kube-apiserver by default) and
//! found valid by the controller; then the ways it fails, each with its stable kind and
//! nothing written.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Output;

use inplace_proto::{ArtifactType, NodeRelease};
use inplace_tests::docs;
use inplace_tests::registry::Registry;
use support::{Bed, failure, release_command};

const REPOSITORY: &str = "sysext/kubernetes";
const TAG: &str = "v1.31.2";
const FILE: &str = "kubernetes-v1.31.2-x86-64.raw";

/// `release from-oci <reference> --name kubernetes --version v1.31.2 <extra>`.
async fn from_oci(reference: &str, extra: &[&str]) -> Output {
    release_command("from-oci", reference, TAG, extra).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_command_pins_a_tagged_image_and_the_release_is_valid() {
    let registry = Registry::start().await.unwrap();
    let file: Vec<u8> = (0..(256u32 << 10)).map(|i| (i % 253) as u8).collect();
    let pushed =
        tokio::task::block_in_place(|| registry.push_file(REPOSITORY, TAG, FILE, &file)).unwrap();
    let bed = Bed::start().await;

    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/standalone-rollouts.md");
    let block = docs::shell_block(&page, "### From an OCI registry").unwrap();
    let image = format!("{}/{REPOSITORY}:{TAG}", registry.host());
    let block = docs::with_assignment(&block, "IMAGE", &image).unwrap();
    let work = tempfile::tempdir().unwrap();
    let kubeconfig = work.path().join("admin.kubeconfig");
    bed.api.write_admin_kubeconfig(&kubeconfig).unwrap();
    let controller_dir = Path::new(env!("CARGO_BIN_EXE_inplace-controller"))
        .parent()
        .unwrap();
    let path = std::env::join_paths(std::iter::once(controller_dir.to_owned()).chain(
        std::env::split_paths(&inplace_tests::tools::path_with_tools().unwrap()),
    ))
    .unwrap();
    tokio::task::block_in_place(|| {
        docs::run_as_a_person(
            &block,
            work.path(),
            &[
                ("KUBECONFIG", kubeconfig.as_os_str()),
                ("PATH", path.as_os_str()),
            ],
        )
    })
    .unwrap();

    let written = std::fs::read_to_string(work.path().join("kubernetes-v1.31.2.yaml")).unwrap();
    let release: NodeRelease = inplace_strict_yaml::object_from_yaml(&written).unwrap();
    let artifact = &release.spec.content.artifacts[0];
    assert_eq!(artifact.kind, ArtifactType::Sysext);
    assert_eq!(
        artifact.url,
        format!("oci://{image}@sha256:{}", pushed.manifest_digest),
        "the tag resolved to the manifest crane pushed, and pinned"
    );
    assert_eq!(artifact.sha256, pushed.sha256, "the file's layer");
    assert_eq!(artifact.size, Some(file.len() as u64));
    assert_eq!(
        release.spec.content.kubernetes_version.as_deref(),
        Some(TAG)
    );

    let condition = bed.release_validity("kubernetes-v1.31.2").await;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "ValidRelease"),
        "{}",
        condition.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_registry_does_not_hold_is_refused_by_kind() {
    let registry = Registry::start().await.unwrap();
    tokio::task::block_in_place(|| registry.push_file(REPOSITORY, TAG, FILE, b"kubelet")).unwrap();
    let host = registry.host();

    let e = failure(
        &from_oci(&format!("{host}/{REPOSITORY}:v9.9.9"), &[]).await,
        "http_status",
    );
    assert!(
        e.contains("/v2/sysext/kubernetes/manifests/v9.9.9 answered 404"),
        "{e}"
    );

    let tagged = format!("{host}/{REPOSITORY}:{TAG}");
    let e = failure(
        &from_oci(&tagged, &["--file", "other.raw"]).await,
        "no_layer",
    );
    assert!(e.contains("no layer is titled \"other.raw\""), "{e}");
    assert!(e.contains(FILE), "names the layers it has: {e}");

    let wrong = format!("{host}/{REPOSITORY}@sha256:{}", "0".repeat(64));
    failure(&from_oci(&wrong, &[]).await, "http_status");

    let e = failure(
        &from_oci(&format!("{host}/{REPOSITORY}"), &[]).await,
        "invalid_argument",
    );
    assert!(e.contains("neither a tag"), "{e}");
}
