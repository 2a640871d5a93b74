//! The controller image `make images` writes (scripts/build-image.sh), installed the way the
//! install pages say, command by command: docs/usage/install-kustomize.md and install-helm.md
//! push it to a real registry (`crane registry serve` on loopback) and install the objects on
//! the real kube-apiserver. Then the image as the registry serves it: its config, and its layer
//! unpacked and the binary run from that root file system as the image's own user (a chroot
//! with that user), far enough to print its version and to serve /healthz while watching the
//! real server. `make images` (a prerequisite of `make unit`) builds the release first, so the
//! documented `make images` here only repackages it. Needs root (chroot); without `make images`
//! it fails saying so.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use inplace_tests::apiserver::ApiServer;
use inplace_tests::registry::{Registry, free_addr, wait_http_ok};
use inplace_tests::tools::{KillOnDrop, controller_image, path_with_tools, run_ok, tool};

/// The image's user, as the Deployments' `runAsUser` names it.
const IMAGE_UID: u32 = 65532;

/// A registry on loopback, ready for pushes, and the repository prefix a person would set
/// as `REGISTRY`.
async fn registry() -> (Registry, String) {
    let registry = Registry::start().await.unwrap();
    let prefix = format!("{}/platform", registry.host());
    (registry, prefix)
}

/// One install page run against `server`, pushing to `registry`: the scratch directory the
/// commands run in, and the admin kubeconfig in it.
struct Page {
    name: &'static str,
    work: tempfile::TempDir,
    kubeconfig: PathBuf,
    registry: String,
}

impl Page {
    fn new(name: &'static str, server: &ApiServer, registry: &str) -> Page {
        let work = tempfile::tempdir().unwrap();
        let kubeconfig = work.path().join("admin.kubeconfig");
        std::fs::copy(server.admin_kubeconfig(), &kubeconfig).unwrap();
        Page {
            name,
            work,
            kubeconfig,
            registry: registry.to_owned(),
        }
    }

    /// Runs the page's block after `heading` as written; what it printed.
    fn run(&self, heading: &str) -> String {
        let page = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/usage")
            .join(format!("{}.md", self.name));
        let block = inplace_tests::docs::shell_block(&page, heading).unwrap();
        let path = path_with_tools().unwrap();
        let envs = [
            ("REGISTRY", self.registry.as_ref()),
            ("KUBECONFIG", self.kubeconfig.as_os_str()),
            ("PATH", path.as_os_str()),
        ];
        tokio::task::block_in_place(|| {
            inplace_tests::docs::run_as_a_person(&block, self.work.path(), &envs)
        })
        .unwrap_or_else(|e| panic!("{}.md {heading}: {e}", self.name))
    }
}

/// The image `make images` wrote, under the local name it gives without `IMAGE_REPOSITORY`
/// (the pages push it under the reader's own name); its tag.
fn built_image() -> String {
    let (images, reference) = controller_image().unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        reference,
        format!("localhost/inplace-controller:v{version}")
    );
    // The tarball `docker load` reads carries that name.
    let manifest = run_ok(
        Command::new("tar")
            .arg("-xOf")
            .arg(images.join("inplace-controller.tar"))
            .arg("manifest.json"),
    );
    assert!(manifest.contains(&format!("\"{reference}\"")), "{manifest}");
    format!("v{version}")
}

/// The pushed image's config: user, entrypoint and the OCI labels.
fn check_config(crane: &Path, pushed: &str) {
    let config: serde_json::Value =
        serde_json::from_str(&run_ok(Command::new(crane).args(["config", pushed]))).unwrap();
    let config = &config["config"];
    assert_eq!(config["User"], format!("{IMAGE_UID}:{IMAGE_UID}"));
    assert_eq!(config["Entrypoint"][0], "/usr/bin/inplace-controller");
    let labels = &config["Labels"];
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        labels["org.opencontainers.image.version"],
        format!("v{version}")
    );
    assert_eq!(
        labels["org.opencontainers.image.source"],
        env!("CARGO_PKG_REPOSITORY")
    );
    assert_eq!(
        labels["org.opencontainers.image.revision"]
            .as_str()
            .map(str::len),
        Some(40),
        "{labels}"
    );
}

/// `inplace-controller ARGS` from the image's root file system `root`, as the image's user.
fn in_image(root: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("chroot");
    command
        .arg(format!("--userspec={IMAGE_UID}:{IMAGE_UID}"))
        .arg(root)
        .arg("/usr/bin/inplace-controller")
        .args(args);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_image_install_runs_the_controller_as_its_user_from_its_own_layer() {
    inplace_tests::prereq::require_root().expect("prerequisites");
    inplace_tests::prereq::require_tools(&["chroot", "tar"]).expect("prerequisites");
    let tag = built_image();
    let (_registry, registry) = registry().await;
    let server = ApiServer::start().await.unwrap();
    let page = Page::new("install-kustomize", &server, &registry);
    let pushed = format!("{registry}/inplace-controller:{tag}");
    page.run("## 1. Build the image and push it");
    let printed = page.run("## 2. Install the objects, pointing at your image");
    assert!(printed.lines().any(|l| l == pushed), "{printed}");

    let crane = tool("crane").unwrap();
    check_config(&crane, &pushed);

    // The layer as pulled, unpacked: the binary runs from it as the image's user.
    let root = page.work.path().join("rootfs");
    std::fs::create_dir(&root).unwrap();
    let layer = page.work.path().join("rootfs.tar");
    run_ok(Command::new(&crane).args(["export", &pushed]).arg(&layer));
    run_ok(
        Command::new("tar")
            .arg("-xf")
            .arg(&layer)
            .arg("-C")
            .arg(&root),
    );
    let printed = run_ok(&mut in_image(&root, &["--version"]));
    assert_eq!(
        printed.trim(),
        format!("inplace-controller {}", env!("CARGO_PKG_VERSION"))
    );

    // Against the real server the page installed into, as a pod would: its credentials
    // readable by the image's user only.
    let kubeconfig = root.join("kubeconfig");
    std::fs::copy(&page.kubeconfig, &kubeconfig).unwrap();
    std::os::unix::fs::chown(&kubeconfig, Some(IMAGE_UID), Some(IMAGE_UID)).unwrap();
    let metrics = free_addr();
    let child = in_image(
        &root,
        &[
            "run",
            &format!("--metrics-addr={metrics}"),
            "--kubeconfig=/kubeconfig",
            "--no-leader-election",
        ],
    )
    .env_remove("KUBECONFIG")
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    let controller = KillOnDrop(child);
    wait_http_ok(&metrics, "/healthz", "the controller from the image").await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", controller.0.id())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(
        uid.split_whitespace().nth(1),
        Some(IMAGE_UID.to_string().as_str()),
        "{uid}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_helm_install_deploys_the_pushed_image_and_upgrades() {
    let tag = built_image();
    let (_registry, registry) = registry().await;
    let server = ApiServer::start().await.unwrap();
    let page = Page::new("install-helm", &server, &registry);
    page.run("## 1. Build the image and push it");
    let printed = page.run("## 2. Install the chart");
    assert!(printed.contains("STATUS: deployed"), "{printed}");
    let image = inplace_tests::apiserver::run_kubectl(
        &page.kubeconfig,
        &[
            "-n",
            "inplace-system",
            "get",
            "deployment",
            "inplace-controller",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
    )
    .unwrap();
    assert_eq!(image, format!("{registry}/inplace-controller:{tag}"));
    // The pushed image is there to pull.
    run_ok(Command::new(tool("crane").unwrap()).args(["manifest", &image]));

    page.run("## 3. Upgrade");
    let history = inplace_tests::apiserver::run_kubectl(
        &page.kubeconfig,
        &["-n", "inplace-system", "get", "secrets", "-o", "name"],
    )
    .unwrap();
    assert!(
        history
            .lines()
            .any(|l| l.ends_with("sh.helm.release.v1.inplace.v2")),
        "the upgrade is the release's second revision: {history}"
    );
}

/// The image for x86-64 and arm64 clusters: `scripts/build-image.sh` given the aarch64 build
/// too (`IMAGE_BINARY_ARM64`, as `make arm64` gives it its release builds; here the suites'
/// debug builds, the aarch64 one `inplace_tests::workspace_build::arm64_bin`'s, which the
/// krew and packaging_arm64 tests share) writes an OCI index, and
/// `scripts/check-image-index.sh` pushes it with `crane push` to `crane registry serve`,
/// finds `linux/amd64` and `linux/arm64` in the index, and runs the arm64 image's
/// `inplace-controller --version`, exported with `crane export --platform linux/arm64`,
/// under qemu-user with the image's own libraries (the cross toolchain's, not this host's).
#[test]
fn the_two_platform_image_is_an_index_whose_arm64_controller_runs() {
    let amd64 = inplace_tests::workspace_build::workspace_bin("inplace-controller").unwrap();
    let arm64 = inplace_tests::workspace_build::arm64_bin("inplace-controller").unwrap();
    // The scripts take them from the tools' directory: current with their sources first.
    tool("oci-image").unwrap();
    tool("crane").unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let images = tempfile::tempdir().unwrap();
    run_ok(
        Command::new(repo.join("scripts/build-image.sh"))
            .env("IMAGES_DIR", images.path())
            .env("IMAGE_BINARY", &amd64)
            .env("IMAGE_BINARY_ARM64", &arm64),
    );
    assert!(images.path().join("inplace-controller-arm64.tar").is_file());
    let checked =
        run_ok(Command::new(repo.join("scripts/check-image-index.sh")).arg(images.path()));
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        checked.contains(&format!(
            "an index of linux/amd64 linux/arm64; the arm64 image runs: inplace-controller {version}"
        )),
        "{checked}"
    );
}
