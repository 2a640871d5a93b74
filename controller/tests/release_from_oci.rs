//! `inplace-controller release from-oci` as a person runs it: files the real `crane` pushed
//! to a real registry (go-containerregistry's, `crane registry serve`) for linux/amd64 and
//! linux/arm64, in an index `crane index append` made, named by its tag; the block of
//! docs/usage/standalone-rollouts.md § From an OCI registry run as written, and its
//! two-architecture release applied with kubectl to the API server (the real kube-apiserver
//! by default) and found valid by the controller; what an index offers besides (another OS,
//! `arm`) passed over with a note, `--arch`, a single manifest; then the ways it fails,
//! each with its stable kind and nothing written. And registries that want credentials (the
//! CNCF Distribution registry in token mode and with htpasswd): the login § From a registry
//! that wants credentials does, run as written; a Docker config.json's password, refresh
//! token, or a token file; a missing or wrong credential refused naming the registry, never
//! the secret.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::path::Path;
use std::process::Output;

use base64::Engine;
use inplace_proto::{Architecture, ArtifactType, NodeRelease};
use inplace_tests::docs;
use inplace_tests::registry::{Pushed, REFRESH_TOKEN, Registry, crane_login};
use support::{Bed, failure, release_command, release_command_with_env};

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

/// `PATH` with this build's `inplace-controller`, the tools and kubectl first, as a person
/// who installed them has it.
fn path_with_controller() -> std::ffi::OsString {
    let controller_dir = Path::new(env!("CARGO_BIN_EXE_inplace-controller"))
        .parent()
        .unwrap();
    std::env::join_paths(
        std::iter::once(controller_dir.to_owned()).chain(std::env::split_paths(
            &inplace_tests::tools::path_with_tools().unwrap(),
        )),
    )
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
    let path = path_with_controller();
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

/// The pull user's password on the registries that want credentials.
const PASSWORD: &str = "pw-91c4e7-never-printed";

/// A registry behind a token service holding the kubernetes file, pushed by crane with its
/// login.
async fn private_registry() -> (Registry, inplace_tests::registry::Pushed) {
    let registry = Registry::start_distribution_with_token_service("puller", PASSWORD)
        .await
        .unwrap();
    let pushed =
        tokio::task::block_in_place(|| registry.push_file(REPOSITORY, TAG, FILE, b"kubelet"))
            .unwrap();
    (registry, pushed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_login_reads_a_registry_behind_a_token_service() {
    let (registry, pushed) = private_registry().await;
    let home = tempfile::tempdir().unwrap();
    let password_file = home.path().join("registry-puller.password");
    std::fs::write(&password_file, PASSWORD).unwrap();

    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/standalone-rollouts.md");
    let mut block =
        docs::shell_block(&page, "#### From a registry that wants credentials").unwrap();
    for (name, value) in [
        ("REGISTRY", registry.host()),
        ("PASSWORD_FILE", password_file.display().to_string()),
    ] {
        block = docs::with_assignment(&block, name, &value).unwrap();
    }
    let path = path_with_controller();
    tokio::task::block_in_place(|| {
        docs::run_as_a_person(
            &block,
            home.path(),
            &[
                ("HOME", home.path().as_os_str()),
                ("PATH", path.as_os_str()),
            ],
        )
    })
    .unwrap();
    assert!(
        home.path().join(".docker/config.json").exists(),
        "the login went where from-oci looks by default"
    );
    let written = std::fs::read_to_string(home.path().join("kubernetes-v1.31.2.yaml")).unwrap();
    let release: NodeRelease = inplace_strict_yaml::object_from_yaml(&written).unwrap();
    let artifact = &release.spec.content.artifacts[0];
    assert_eq!(
        artifact.url,
        format!(
            "oci://{}/{REPOSITORY}:{TAG}@sha256:{}",
            registry.host(),
            pushed.manifest_digest
        )
    );
    assert_eq!(artifact.sha256, pushed.sha256);
}

/// `from-oci` of the private image with `args`, where the default login is `docker_dir`.
async fn from_private(registry: &Registry, docker_dir: &Path, args: &[&str]) -> Output {
    let image = format!("{}/{REPOSITORY}:{TAG}", registry.host());
    release_command_with_env(
        "from-oci",
        &image,
        TAG,
        args,
        &[("DOCKER_CONFIG", docker_dir)],
    )
    .await
}

/// The stderr of a refused `from-oci`, checked to name `registry` and no secret.
fn refused(output: &Output, kind: &str, registry: &Registry, secrets: &[&str]) -> String {
    let e = failure(output, kind);
    assert!(e.contains(&registry.host()), "names the registry: {e}");
    for secret in secrets {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("puller:{secret}"));
        assert!(
            !e.contains(secret) && !e.contains(&basic),
            "a secret was printed: {e}"
        );
    }
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_credential_is_used_and_a_wrong_one_never_printed() {
    let (registry, pushed) = private_registry().await;
    let work = tempfile::tempdir().unwrap();
    let dir = |name: &str| {
        let dir = work.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    };
    let pinned = |output: &Output| {
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains(&pushed.sha256), "{stdout}");
    };

    let nobody = dir("nobody");
    let e = refused(
        &from_private(&registry, &nobody, &[]).await,
        "unauthorized",
        &registry,
        &[],
    );
    assert!(e.contains("no Docker config.json was found"), "{e}");

    let wrong = "wrong-3a8d0f-never-printed";
    let wrong_login = dir("wrong");
    crane_login(&wrong_login, &registry.host(), "puller", wrong).unwrap();
    let config = wrong_login.join("config.json");
    let args = ["--registry-config", config.to_str().unwrap()];
    let e = refused(
        &from_private(&registry, &nobody, &args).await,
        "unauthorized",
        &registry,
        &[wrong, PASSWORD],
    );
    assert!(e.contains("the credentials for it from"), "{e}");
    assert!(e.contains("were refused"), "{e}");
    assert!(e.contains(config.to_str().unwrap()), "names the file: {e}");

    let token_file = work.path().join("token");
    std::fs::write(&token_file, format!("{wrong}\n")).unwrap();
    let args = ["--registry-token-file", token_file.to_str().unwrap()];
    let e = refused(
        &from_private(&registry, &nobody, &args).await,
        "unauthorized",
        &registry,
        &[wrong],
    );
    assert!(
        e.contains(token_file.to_str().unwrap()),
        "names the file: {e}"
    );

    let missing = work.path().join("missing.json");
    let args = ["--registry-config", missing.to_str().unwrap()];
    let e = refused(
        &from_private(&registry, &nobody, &args).await,
        "credentials",
        &registry,
        &[],
    );
    assert!(e.contains(missing.to_str().unwrap()), "{e}");

    // An identitytoken, as a cloud registry's login leaves it: exchanged at the token service.
    let identity = dir("identity");
    let entry = serde_json::json!({"auths": {registry.host(): {"identitytoken": REFRESH_TOKEN}}});
    std::fs::write(identity.join("config.json"), entry.to_string()).unwrap();
    pinned(&from_private(&registry, &identity, &[]).await);

    // A registry that asks for HTTP Basic itself (htpasswd), with the login's password.
    let basic = Registry::start_distribution("puller", PASSWORD)
        .await
        .unwrap();
    let pushed_basic =
        tokio::task::block_in_place(|| basic.push_file(REPOSITORY, TAG, FILE, b"kubelet")).unwrap();
    assert_eq!(pushed_basic.sha256, pushed.sha256);
    let login = basic.docker_config.clone().unwrap();
    pinned(&from_private(&basic, &login, &[]).await);
}
