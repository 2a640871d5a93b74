//! Test bed 5 itself: real kubelets with containerd in nspawn nodes register their Nodes with
//! the real API server, go Ready, and run Pods from the locally imported images.

#![allow(clippy::unwrap_used, clippy::expect_used)]

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
