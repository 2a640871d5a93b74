//! The guard of an agent switch (agent/src/self_update.rs, systemd/inplace-agent-guard.*)
//! on a real systemd 252 node: the agent installed from its sysext image and running against
//! the real kube-apiserver, the guard units installed outside the image, then a switch to an
//! agent image whose binary exits 1 at start, armed as the old agent will arm it
//! (docs/design/agent-self-update.md). The new agent never confirms, so at the deadline the
//! guard — the previous binary, started by the path unit — re-points the link at the previous
//! image, refreshes, restarts the agent and records why. Needs root, systemd-nspawn,
//! debootstrap and squashfs-tools.

use crate::support;

use std::path::Path;
use std::time::Duration;

use inplace_tests::nspawn::{Node, NodeOptions};

use inplace_tests::agent_images::{Behaviour, agent_image};
use support::packaging::{PATIENCE, api_for_agents, build, repo, write_kubelet_identity};

const IMAGES: &str = inplace_tests::install::AGENT_IMAGES;
const SELF_UPDATE: &str = "/var/lib/inplace/self-update";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_agent_that_never_confirms_is_replaced_by_the_previous_one() {
    inplace_tests::prereq::require_nspawn().expect("prerequisites");
    inplace_tests::prereq::require_squashfs_tools().expect("prerequisites");

    let out = tempfile::tempdir().unwrap();
    let good = build("packaging/node/build-sysext.sh", out.path());
    let good_name = good.file_name().unwrap().to_str().unwrap().to_owned();
    let broken = agent_image(
        Behaviour::ExitsAtStart,
        Path::new("/"),
        "9.9.9",
        out.path(),
        "",
    )
    .unwrap();

    let (test_api, _plans) = api_for_agents().await;
    let name = Node::unique_name("guard");
    let node = Node::boot(&name, NodeOptions::default())
        .await
        .expect("node boots");

    // The agent as flatcar.md installs it, with its node's identity.
    let previous = format!("{IMAGES}/{good_name}");
    node.copy_from_host(&good, &previous, 0o644).await.unwrap();
    node.copy_from_host(
        &broken,
        format!("{IMAGES}/inplace-agent-9.9.9-x86-64.raw"),
        0o644,
    )
    .await
    .unwrap();
    node.symlink(&previous, "/etc/extensions/inplace-agent.raw")
        .await
        .unwrap();
    write_kubelet_identity(&node, &test_api).await;
    // The guard's units, outside the image (where Butane will write them).
    for unit in ["inplace-agent-guard.service", "inplace-agent-guard.path"] {
        node.copy_from_host(
            repo().join("systemd").join(unit),
            format!("/etc/systemd/system/{unit}"),
            0o644,
        )
        .await
        .unwrap();
    }
    node.sh_ok(
        "systemd-sysext refresh && systemctl daemon-reload \
         && systemd-tmpfiles --create inplace-agent.conf \
         && systemctl enable --now inplace-agent.service inplace-agent-guard.path",
    )
    .await
    .expect("the agent and the guard's path unit start");
    node.wait_active("inplace-agent.service", PATIENCE)
        .await
        .expect("the agent starts");

    // What the old agent does to switch (design, steps 3-4): keep its own binary for the
    // guard, arm the guard, re-point its link, refresh, restart itself.
    let now: u64 = node
        .sh_ok("date +%s")
        .await
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pending = serde_json::json!({
        "previousImage": previous,
        "nextImage": format!("{IMAGES}/inplace-agent-9.9.9-x86-64.raw"),
        "expectedVersion": "9.9.9",
        "deadline": now + 20,
        "confirmTimeout": 20,
    });
    node.sh_ok(&format!(
        "install -D -m 0755 /usr/bin/inplace-agent {SELF_UPDATE}/previous/inplace-agent"
    ))
    .await
    .unwrap();
    node.write_file(
        format!("{SELF_UPDATE}/pending.json"),
        pending.to_string().as_bytes(),
        0o600,
    )
    .await
    .unwrap();
    node.sh_ok(&format!(
        "ln -sfn {IMAGES}/inplace-agent-9.9.9-x86-64.raw /etc/extensions/inplace-agent.raw \
         && systemd-sysext refresh && systemctl daemon-reload \
         && (systemctl restart inplace-agent.service || true)"
    ))
    .await
    .unwrap();
    assert!(
        node.sh_ok("/usr/bin/inplace-agent --version || true")
            .await
            .unwrap()
            .is_empty(),
        "the broken agent is what is merged now"
    );

    // The guard restores the previous agent at the deadline and records why.
    let record = wait_for_record(&node).await;
    let record: serde_json::Value = serde_json::from_slice(&record).unwrap();
    assert_eq!(record["reason"], "AgentNotConfirmed", "{record}");
    let message = record["message"].as_str().unwrap();
    assert!(
        message.contains("agent 9.9.9 did not confirm") && message.contains(&previous),
        "{message}"
    );
    node.wait_active("inplace-agent.service", PATIENCE)
        .await
        .expect("the previous agent runs again");
    let link = node
        .sh_ok("readlink /etc/extensions/inplace-agent.raw")
        .await
        .unwrap();
    assert_eq!(link.trim(), previous);
    let version = node.sh_ok("inplace-agent --version").await.unwrap();
    assert!(
        version.contains(env!("CARGO_PKG_VERSION")),
        "the merged agent is the previous one: {version}"
    );
    assert!(
        !node
            .exists(format!("{SELF_UPDATE}/pending.json"))
            .await
            .unwrap(),
        "the guard disarmed itself"
    );
    let guard = node
        .systemctl(&["show", "-p", "Result", "inplace-agent-guard.service"])
        .await
        .unwrap();
    assert!(guard.contains("Result=success"), "{guard}");
    node.poweroff().await.unwrap();
}

async fn wait_for_record(node: &Node) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(bytes) = node
            .read_file(format!("{SELF_UPDATE}/rolled-back.json"))
            .await
        {
            return bytes;
        }
        if tokio::time::Instant::now() > deadline {
            let guard = node
                .journal("inplace-agent-guard.service", 60)
                .await
                .unwrap_or_default();
            let agent = node
                .journal("inplace-agent.service", 30)
                .await
                .unwrap_or_default();
            panic!("the guard did not restore the agent\n{guard}\n{agent}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
