//! Issue 39's end-to-end case on the resume test's node (no boot of its own): a kubernetes
//! sysext from a private OCI registry, through a mirror when the first registry stops,
//! resumed after the agent is killed. Two real CNCF Distribution registries hold the same
//! image pushed by `crane`: A behind a token service, B with htpasswd; the node's Docker
//! `config.json` (written by `crane auth login`) has a login for each, and its mirror list
//! tries A first, then B (A is also the reference's registry, the origin last). Each
//! registry is reached through a slow link, so the download can be interrupted: A is
//! stopped with a part on disk, B continues the same blob (a registry blob is named by its
//! digest), the agent is SIGKILLed midway, and the restarted agent, finding A still down,
//! resumes from B. The plan commits with `status.artifacts[].source` naming B's blob and
//! the image merged.

use inplace_proto::Phase;
use inplace_tests::registry::{Registry, crane_login};
use inplace_tests::slow_link::SlowLink;
use serde_json::json;

use super::{Images, Plans, assert_kubelet_runs, output, revision};
use crate::real_node::AgentNode;

/// Each link's rate: the padded image takes about 12 s through one.
const RATE: u64 = 2 << 20;
/// Incompressible bytes added to the image so that its download can be interrupted.
const PADDING: usize = 24 << 20;

/// Where the agent's config for the registries goes on the node.
const FRAGMENT: &str = "/etc/inplace/agent.d/60-registries.toml";
/// The node's Docker `config.json` directory.
const AUTH_DIR: &str = "/etc/inplace/registry-auth";

pub(super) async fn a_private_sysext_through_a_mirror_resumes_after_a_restart(bed: &AgentNode) {
    let images = Images::new(bed.work.path()).await;
    let image = images.healthy("v1.33.1").await;
    let padding = inplace_tests::sysext::incompressible(PADDING);
    let padded_path = bed.work.path().join("kubernetes-padded.raw");
    let image = image
        .with_root_file("padding", &padding, &padded_path)
        .await
        .unwrap();
    let bytes = image.bytes().await.unwrap();

    let a = Registry::start_distribution_with_token_service("puller", "pw-a-never-printed")
        .await
        .unwrap();
    let b = Registry::start_distribution("puller", "pw-b-never-printed")
        .await
        .unwrap();
    let push = |r: &Registry| {
        tokio::task::block_in_place(|| r.push_file("sysext/kubernetes", "v1.33.1", "k.raw", &bytes))
            .unwrap()
    };
    let (pushed, pushed_b) = (push(&a), push(&b));
    assert_eq!(pushed.manifest_digest, pushed_b.manifest_digest);
    let link_a = SlowLink::start(a.addr, RATE).await.unwrap();
    let link_b = SlowLink::start(b.addr, RATE).await.unwrap();
    // A's token service fronts it: its realm is A's own address behind the link.
    let token_service = a.addr;
    configure_node(
        bed,
        [&link_a, &link_b],
        token_service,
        ["pw-a-never-printed", "pw-b-never-printed"],
    )
    .await;
    let since = output(bed, &["date", "+@%s"]).await;

    let plans = Plans {
        bed,
        images: &images,
    };
    let url = format!(
        "oci://{}/sysext/kubernetes@sha256:{}",
        link_a.host(),
        pushed.manifest_digest
    );
    let plan = plans.healthy(vec![
        json!({"name": "kubernetes", "type": "Sysext", "url": url,
        "sha256": image.sha256}),
    ]);
    let revision = revision(&plan);
    bed.apply(&plan).await;

    // A sysext is downloaded into the directory it is stored in, not the agent's tmp.
    let partial = format!(
        "/opt/extensions/kubernetes/.kubernetes.{}.partial",
        &image.sha256[..16]
    );
    bed.wait_file_size(&partial, 6 << 20).await;
    // A goes away mid-transfer: its link cut, the registry and its token service stopped.
    drop((link_a, a));
    let third = bed.wait_file_size(&partial, 14 << 20).await;
    bed.node
        .systemctl(&["kill", "--signal=SIGKILL", "inplace-agent.service"])
        .await
        .unwrap();
    println!(
        "A stopped, then the agent killed with {third} of {} bytes",
        image.size
    );

    bed.wait_final(Phase::Succeeded, &revision, "through the mirror")
        .await;
    let status = bed.api.get(bed.name()).await.unwrap().status.unwrap();
    let served = status.artifacts.iter().find(|a| a.name == "kubernetes");
    assert_eq!(
        served.and_then(|a| a.source.clone()),
        Some(format!(
            "http://{}/v2/sysext/kubernetes/blobs/sha256:{}",
            link_b.host(),
            image.sha256
        )),
        "B's blob served the bytes: {status:?}"
    );
    assert_kubelet_runs(bed, &images, "v1.33.1", "merged from the registry").await;
    let journal = bed.agent_messages(Some(&since)).await;
    assert!(
        journal.contains("resuming the partial download of an earlier run"),
        "the restarted agent resumed: {journal}"
    );
    for secret in ["pw-a-never-printed", "pw-b-never-printed"] {
        assert!(!journal.contains(secret), "a secret in the journal");
    }
    drop(link_b);
}

/// Gives the node a login for each link (`crane auth login` into its Docker config), the
/// mirror list A then B, a policy allowing both and A's token service, and fast retries; then
/// restarts the agent to read it.
async fn configure_node(
    bed: &AgentNode,
    [a, b]: [&SlowLink; 2],
    token_service: std::net::SocketAddr,
    passwords: [&str; 2],
) {
    let logins = tempfile::tempdir().unwrap();
    for (link, password) in [(a, passwords[0]), (b, passwords[1])] {
        tokio::task::block_in_place(|| {
            crane_login(logins.path(), &link.host(), "puller", password)
        })
        .unwrap();
    }
    let config = std::fs::read(logins.path().join("config.json")).unwrap();
    bed.node
        .write_file(&format!("{AUTH_DIR}/config.json"), &config, 0o600)
        .await
        .unwrap();
    let (a, b, server) = (a.host(), b.host(), bed.server.url("/"));
    // The artifact server stays allowed for the suite's other plans on this node.
    let fragment = format!(
        "[policy]\nallowed_url_prefixes = [\"http://{a}/v2/sysext/\", \"http://{b}/v2/sysext/\", \
         \"http://{token_service}/\", \"{server}\"]\nallow_http = true\n\
         [download]\nattempts = 2\ninitial_backoff = \"200ms\"\nmax_backoff = \"1s\"\n\
         stall_timeout = \"5s\"\n\
         [credentials]\ndocker_config = \"{AUTH_DIR}/config.json\"\n\
         [[mirrors]]\nregistry = \"{a}\"\nhosts = [\"http://{a}\", \"http://{b}\"]\n"
    );
    bed.configure_agent(FRAGMENT, &fragment).await;
}
