//! docs/usage/image-builder.md's Ansible role, with the Ansible pinned in
//! tests/ansible/requirements.txt: the page's checks (`ansible-playbook --syntax-check`,
//! `ansible-lint`) pass on packaging/node/image-builder, and the page's local run of the
//! playbook inside a real systemd 252 node installs the agent's .deb, which runs after the
//! node reboots, against the real kube-apiserver with the node's kubelet identity. Needs
//! root, systemd-nspawn, debootstrap, Python 3 with venv, and the Debian mirror (the node
//! gets `python3-apt`, as every image-builder base image has); a missing prerequisite fails
//! with an install hint.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use inplace_tests::nspawn::{Node, NodeOptions};
use kube::api::PostParams;

use support::packaging::{
    PATIENCE, api_for_agents, build, node_tool, refused_plan, repo, wait_reported,
    write_kubelet_identity,
};

const PAGE: &str = "docs/usage/image-builder.md";
/// Where the node sees the test's copy of the repository layout the page's commands expect.
const WORK_IN_NODE: &str = "/srv/inplace";

/// The pinned Ansible's venv (installed, or found cached, beside this test's target
/// directory).
fn ansible_venv() -> PathBuf {
    node_tool("tests/ansible/install.sh", "ansible/venv")
}

fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn the_role_passes_ansibles_syntax_check_and_lint_as_documented() {
    let venv = ansible_venv();
    let block =
        inplace_tests::docs::shell_block(&repo().join(PAGE), "#### Checking the role").unwrap();
    let ran = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .current_dir(repo())
        .env("PATH", path_with(&venv.join("bin")))
        .env("ANSIBLE_LOCAL_TEMP", tempfile::tempdir().unwrap().keep())
        .output()
        .unwrap();
    assert!(
        ran.status.success(),
        "{block}\n{}\n{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
}

/// The Python the venv was made from (its `sys.base_prefix`): bound into the node with the
/// venv, so the node runs the same pinned Ansible.
fn base_prefix(venv: &Path) -> PathBuf {
    let out = Command::new(venv.join("bin/python"))
        .args(["-c", "import sys; print(sys.base_prefix)"])
        .output()
        .unwrap();
    let prefix = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(
        !prefix.starts_with("/usr"),
        "the venv's Python lives in {}, which a node cannot borrow; make it from a Python \
         installed outside /usr (pyenv, as on these machines)",
        prefix.display()
    );
    prefix
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_builder_role_installs_the_deb_and_the_agent_runs_after_a_reboot() {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_tools(&["dpkg-deb", "python3"]).expect("prerequisites");
    let venv = ansible_venv();

    // The layout the page's commands expect, from the repository root: the role under
    // packaging/ and `make packages`' output under target/packages/.
    let work = tempfile::tempdir().unwrap();
    let packages = work.path().join("target/packages");
    let deb = build("packaging/node/build-deb.sh", &packages);
    assert!(deb.starts_with(&packages));
    let copied = Command::new("cp")
        .arg("-a")
        .arg(repo().join("packaging"))
        .arg(work.path())
        .status()
        .unwrap();
    assert!(copied.success());

    let (test_api, api) = api_for_agents().await;
    let name = Node::unique_name("imgbuild");
    let mut options = NodeOptions::default();
    for (host, node) in [
        (base_prefix(&venv), base_prefix(&venv)),
        (venv.clone(), venv.clone()),
        (work.path().to_path_buf(), PathBuf::from(WORK_IN_NODE)),
    ] {
        options
            .extra_nspawn_args
            .push(format!("--bind-ro={}:{}", host.display(), node.display()));
    }
    let mut node = Node::boot(&name, options).await.expect("node boots");
    // The build image's Python with apt bindings, which Ansible's apt module uses.
    node.sh_ok(
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends python3-apt >/dev/null",
    )
    .await
    .expect("python3-apt installs in the node");
    write_kubelet_identity(&node, &test_api).await;

    let block =
        inplace_tests::docs::shell_block(&repo().join(PAGE), "### Ansible role (image-builder)")
            .unwrap();
    let script = format!(
        "set -euo pipefail\nexport PATH={bin}:$PATH LC_ALL=C.UTF-8 HOME=/root\ncd {WORK_IN_NODE}\n{block}",
        bin = venv.join("bin").display()
    );
    let ran = node.sh(&script).await.unwrap();
    assert!(
        ran.success(),
        "{block}\n{}\n{}",
        ran.stdout_text(),
        ran.stderr_text()
    );
    assert!(
        ran.stdout_text().contains("failed=0"),
        "{}",
        ran.stdout_text()
    );
    let config =
        String::from_utf8(node.read_file("/etc/inplace/agent.toml").await.unwrap()).unwrap();
    assert!(
        config.contains("allowed_url_prefixes = [\"https://extensions.example/\"]"),
        "the role's template: {config}"
    );

    node.reboot_and_wait().await.expect("the node boots again");
    node.wait_active("inplace-agent.service", PATIENCE)
        .await
        .expect("the agent the role installed runs at boot (READY sent)");
    let plan = refused_plan(&name);
    let revision = inplace_proto::revision_of(&plan.spec.content);
    api.create(&PostParams::default(), &plan).await.unwrap();
    wait_reported(&api, &node, &revision).await;
    node.poweroff().await.unwrap();
}
