//! `inplace-controller release from-oci` as a person runs it: files the real `crane` pushed
//! to a real registry (go-containerregistry's, `crane registry serve`) for linux/amd64 and
//! linux/arm64, in an index `crane index append` made, named by its tag; the block of
//! docs/usage/standalone-rollouts.md § From an OCI registry run as written, and its
//! two-architecture release applied with kubectl to the API server (the real kube-apiserver
//! by default) and found valid by the controller; what an index offers besides (another OS,
//! `arm`) passed over with a note, `--arch`, a single manifest; then the ways it fails,
//! each with its stable kind and nothing written.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::Output;

use inplace_proto::{Architecture, ArtifactType, NodeRelease};
use inplace_tests::docs;
use inplace_tests::registry::{Pushed, Registry};
use support::{Bed, failure, release_command};

const REPOSITORY: &str = "sysext/kubernetes";
const TAG: &str = "v1.31.2";
const FILE: &str = "kubernetes-v1.31.2-x86-64.raw";
const ARM64_FILE: &str = "kubernetes-v1.31.2-arm64.raw";

/// `release from-oci <reference> --name kubernetes --version v1.31.2 <extra>`.
async fn from_oci(reference: &str, extra: &[&str]) -> Output {
    release_command("from-oci", reference, TAG, extra).await
}

/// A file of `len` bytes that differs by `seed`.
fn file_bytes(len: u32, seed: u32) -> Vec<u8> {
    (0..len).map(|i| ((i + seed) % 253) as u8).collect()
}

/// Pushes `file` titled `title` for `platform`, untagged but for a name of its own.
fn push_for(registry: &Registry, platform: &str, title: &str, file: &[u8]) -> Pushed {
    let tag = platform.replace('/', "-");
    tokio::task::block_in_place(|| {
        registry.push_platform_file(REPOSITORY, &tag, title, file, Some(platform))
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_command_pins_each_platform_of_a_tagged_index_and_the_release_is_valid() {
    let registry = Registry::start().await.unwrap();
    let amd64_file = file_bytes(256 << 10, 0);
    let arm64_file = file_bytes(200 << 10, 7);
    let amd64 = push_for(&registry, "linux/amd64", FILE, &amd64_file);
    let arm64 = push_for(&registry, "linux/arm64", ARM64_FILE, &arm64_file);
    tokio::task::block_in_place(|| {
        registry.push_index(
            REPOSITORY,
            TAG,
            &[&amd64.manifest_digest, &arm64.manifest_digest],
        )
    })
    .unwrap();
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
    assert_eq!(artifact.architecture, Some(Architecture::Amd64));
    assert_eq!(
        artifact.url,
        format!("oci://{image}@sha256:{}", amd64.manifest_digest),
        "the tag resolved through the index to the amd64 manifest crane pushed, and pinned"
    );
    assert_eq!(artifact.sha256, amd64.sha256, "the file's layer");
    assert_eq!(artifact.size, Some(amd64_file.len() as u64));
    let [arm64_build] = artifact.other_architectures.as_slice() else {
        panic!("one other build: {:?}", artifact.other_architectures);
    };
    assert_eq!(arm64_build.architecture, Architecture::Arm64);
    assert_eq!(
        arm64_build.url,
        format!("oci://{image}@sha256:{}", arm64.manifest_digest),
        "pinned to the arm64 manifest, not to the index"
    );
    assert_eq!(arm64_build.sha256, arm64.sha256);
    assert_eq!(arm64_build.size, Some(arm64_file.len() as u64));
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
async fn an_index_offers_its_linux_architectures_and_notes_what_it_passes_over() {
    let registry = Registry::start().await.unwrap();
    let host = registry.host();
    let amd64 = push_for(&registry, "linux/amd64", FILE, b"amd64 kubelet");
    let windows = push_for(&registry, "windows/amd64", FILE, b"windows kubelet");
    let arm = push_for(&registry, "linux/arm", FILE, b"arm kubelet");
    let arm64 = push_for(&registry, "linux/arm64", ARM64_FILE, b"arm64 kubelet");
    let index = tokio::task::block_in_place(|| {
        registry.push_index(
            REPOSITORY,
            TAG,
            &[
                &windows.manifest_digest,
                &arm64.manifest_digest,
                &arm.manifest_digest,
                &amd64.manifest_digest,
            ],
        )
    })
    .unwrap();
    let release_of = |output: &Output| -> NodeRelease {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        inplace_strict_yaml::object_from_yaml(std::str::from_utf8(&output.stdout).unwrap()).unwrap()
    };

    // By digest: the index's first usable platform is the artifact's url.
    let pinned = format!("{host}/{REPOSITORY}@sha256:{index}");
    let output = from_oci(&pinned, &[]).await;
    let release = release_of(&output);
    let artifact = &release.spec.content.artifacts[0];
    assert_eq!(artifact.architecture, Some(Architecture::Arm64));
    assert_eq!(artifact.sha256, arm64.sha256);
    let others: Vec<_> = artifact
        .other_architectures
        .iter()
        .map(|b| (b.architecture, b.sha256.as_str()))
        .collect();
    assert_eq!(others, [(Architecture::Amd64, amd64.sha256.as_str())]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    for note in [
        format!(
            "note: {pinned}: passed over windows/amd64 (sha256:{}): not linux",
            windows.manifest_digest
        ),
        format!(
            "note: {pinned}: passed over linux/arm (sha256:{}): not an architecture a release names",
            arm.manifest_digest
        ),
    ] {
        assert!(stderr.contains(&note), "{note} in {stderr}");
    }

    // --arch takes one platform, and says so.
    let tagged = format!("{host}/{REPOSITORY}:{TAG}");
    let release = release_of(&from_oci(&tagged, &["--arch", "x86-64"]).await);
    let artifact = &release.spec.content.artifacts[0];
    assert_eq!(artifact.architecture, Some(Architecture::Amd64));
    assert_eq!(artifact.sha256, amd64.sha256);
    assert!(artifact.other_architectures.is_empty());

    // A single manifest: the one file for every node, as before.
    let single = format!("{host}/{REPOSITORY}:linux-amd64");
    let release = release_of(&from_oci(&single, &[]).await);
    let artifact = &release.spec.content.artifacts[0];
    assert_eq!(
        (artifact.architecture, artifact.sha256.as_str()),
        (None, amd64.sha256.as_str())
    );

    // Nothing a node can take: an error naming the reference and what the index has.
    tokio::task::block_in_place(|| {
        registry.push_index(
            REPOSITORY,
            "windows",
            &[&windows.manifest_digest, &arm.manifest_digest],
        )
    })
    .unwrap();
    let reference = format!("{host}/{REPOSITORY}:windows");
    let e = failure(&from_oci(&reference, &[]).await, "no_platform");
    assert!(
        e.contains(&format!(
            "{reference} is an index without a linux manifest of any architecture a release names"
        )),
        "{e}"
    );
    assert!(e.contains("it has windows/amd64, linux/arm"), "{e}");
    let e = failure(
        &from_oci(&tagged, &["--arch", "riscv64"]).await,
        "no_platform",
    );
    assert!(e.contains("without a linux manifest of riscv64"), "{e}");
    let e = failure(
        &from_oci(&tagged, &["--arch", "arm"]).await,
        "invalid_argument",
    );
    assert!(e.contains("not a node architecture"), "{e}");
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
