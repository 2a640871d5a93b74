//! Test bed 5 itself: real kubelets with containerd in nspawn nodes register their Nodes with
//! the real API server, go Ready, and run Pods from the locally imported images.

use std::time::Duration;

use inplace_tests::apiserver::ApiServer;
use inplace_tests::kube_node::{self, KubeNode, KubeNodeConfig, KubeletImage};
use inplace_tests::nspawn::{Node, NodeOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_kubelet_registers_its_node_goes_ready_and_runs_a_pod() {
    let work = tempfile::tempdir().unwrap();
    let api = ApiServer::start_for_kubelets(&work.path().join("api"))
        .await
        .unwrap();
    let image = kube_node::kubelet_sysext("v1.36.3", KubeletImage::Working, work.path())
        .await
        .unwrap();
    let name = Node::unique_name("kube");
    let kubeconfig = api.node_kubeconfig(&name).unwrap();
    let config = KubeNodeConfig {
        name: name.clone(),
        kubeconfig_yaml: std::fs::read_to_string(kubeconfig).unwrap(),
        ca_pem: api.ca_pem().unwrap(),
        kubelet_image: image,
        images_dir: kube_node::node_images().await.unwrap(),
        ports: KubeNodeConfig::free_ports().unwrap(),
        kubelet_path: None,
    };
    let node = KubeNode::boot(&config, NodeOptions::default())
        .await
        .unwrap();
    let client = api.client().await.unwrap();
    if let Err(e) =
        kube_node::wait_node_ready(&client, &name, Some("v1.36.3"), Duration::from_secs(120)).await
    {
        panic!("{e}\n{}", node.diagnostics().await);
    }
}

/// `inplace-testbed cluster` as a person runs it: progress, then `ready:`, the files it
/// promises, a Pod from the image `images.txt` names running on a real node, and after SIGTERM
/// no node directory, mount or cgroup of its node left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inplace_testbed_cluster_runs_a_pod_and_leaves_nothing_behind() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let dir = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_inplace-testbed"));
    command
        .args([
            "cluster",
            "--nodes",
            "1",
            "--kubelet",
            "v1.36.3",
            "--no-controller",
            "--dir",
        ])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut cluster = command.spawn().unwrap();
    let mut lines = BufReader::new(cluster.stdout.take().unwrap()).lines();
    let mut printed = String::new();
    let ready = tokio::time::timeout(Duration::from_secs(900), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            printed.push_str(&line);
            printed.push('\n');
            if line.starts_with("ready: ") {
                return;
            }
        }
        panic!("inplace-testbed cluster ended before it was ready:\n{printed}");
    })
    .await;
    assert!(ready.is_ok(), "not ready in time:\n{printed}");
    assert!(
        printed.contains("==> node "),
        "no progress shown:\n{printed}"
    );
    for file in [
        "admin.kubeconfig",
        "releases/v1.35.4.yaml",
        "releases/v1.36.1.yaml",
        "releases/v1.36.3.yaml",
        "images.txt",
    ] {
        assert!(dir.path().join(file).is_file(), "no {file}");
    }

    let kubeconfig = dir.path().join("admin.kubeconfig");
    let kubectl = |args: &[&str]| inplace_tests::apiserver::run_kubectl(&kubeconfig, args).unwrap();
    let node = kubectl(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
    let image = std::fs::read_to_string(dir.path().join("images.txt")).unwrap();
    kubectl(&[
        "run",
        "hello",
        "--image",
        image.lines().next().unwrap(),
        "--image-pull-policy=Never",
        "--overrides",
        r#"{"spec":{"hostNetwork":true}}"#,
    ]);
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/hello",
        "--timeout=300s",
    ]);

    let pid = nix::unistd::Pid::from_raw(i32::try_from(cluster.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(180), cluster.wait())
        .await
        .expect("it stops after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    let node_dir = std::path::Path::new(inplace_tests::nspawn::NODES_DIR).join(&node);
    assert!(!node_dir.exists(), "{} left behind", node_dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&node), "a mount of {node} left behind");
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap() {
        let hierarchy = hierarchy.unwrap().path();
        let left = walk_for(&hierarchy, &node, 6);
        assert!(left.is_none(), "cgroup {left:?} left behind");
    }
}

/// A directory named `name` at most `depth` levels below `dir`.
fn walk_for(dir: &std::path::Path, name: &str, depth: usize) -> Option<std::path::PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name() == name {
            return Some(path);
        }
        if depth > 0
            && let Some(found) = walk_for(&path, name, depth - 1)
        {
            return Some(found);
        }
    }
    None
}
