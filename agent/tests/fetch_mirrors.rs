//! Mirrors (`[[mirrors]]` in the agent's config, read as a node reads it), with the real
//! fetcher: tried in order before the origin, each held to the node policy, the plan's
//! sha256 the guarantee. Against the test artifact server for http(s) artifacts, and two
//! real CNCF Distribution registries for `oci://` ones (one whose storage went bad, so it
//! serves other bytes under the blob's digest), plus addresses where nothing listens.

use inplace_agent::fetch::{FetchError, Fetched, Fetcher, HttpFetcher};
use std::path::Path;

use inplace_agent::settings::{Settings, from_toml, load};
use inplace_proto::{Artifact, ArtifactType, Reason};
use inplace_tests::artifact_server::{Artifact as Served, ArtifactServer};
use inplace_tests::docs;
use inplace_tests::registry::{Registry, crane_login, free_addr};
use sha2::{Digest, Sha256};

/// An agent config of `config` (policy, credentials, mirrors), retrying fast.
fn config_text(config: &str) -> String {
    format!(
        "node_name = \"n\"\n[download]\nattempts = 3\ninitial_backoff = \"10ms\"\n\
         max_backoff = \"100ms\"\nmin_speed = 0\n{config}"
    )
}

/// A fetcher configured by `config` (policy and mirrors), retrying fast.
fn fetcher(config: &str) -> HttpFetcher {
    with_settings(from_toml(&config_text(config), || None).unwrap())
}

fn with_settings(settings: Settings) -> HttpFetcher {
    HttpFetcher::new(&settings.download, &settings.policy)
        .unwrap()
        .with_credentials(settings.credentials)
        .with_mirrors(settings.mirrors)
}

/// The fetcher of a node whose config directory holds an `agent.toml` of `config` and the
/// mirrors of `registry` that docs/usage/registries.md § Mirrors writes, run as written.
fn fetcher_with_documented_mirrors(
    config: &str,
    registry: &str,
    mirrors: [&str; 2],
) -> HttpFetcher {
    let conf = tempfile::tempdir().unwrap();
    std::fs::write(conf.path().join("agent.toml"), config_text(config)).unwrap();
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/registries.md");
    let mut block = docs::shell_block(&page, "## Mirrors").unwrap();
    for (name, value) in [
        ("REGISTRY", registry.to_owned()),
        ("FIRST_MIRROR", format!("http://{}", mirrors[0])),
        ("SECOND_MIRROR", format!("http://{}", mirrors[1])),
        ("CONF_DIR", conf.path().display().to_string()),
    ] {
        block = docs::with_assignment(&block, name, &value).unwrap();
    }
    docs::run_as_a_person(&block, conf.path(), &[]).unwrap();
    with_settings(load(&conf.path().join("agent.toml"), || None).unwrap())
}

fn artifact(url: String, bytes: &[u8]) -> Artifact {
    Artifact::new(
        "kubernetes",
        ArtifactType::Sysext,
        url,
        hex::encode(Sha256::digest(bytes)),
    )
}

/// Fetches `a` into a fresh directory; checks that a success leaves only its file and a
/// failure nothing at all.
async fn fetch(f: &HttpFetcher, a: &Artifact) -> Result<(Fetched, Vec<u8>), FetchError> {
    let dir = tempfile::tempdir().unwrap();
    let result = f.fetch(a, dir.path(), &|_| {}).await;
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    match result {
        Ok(fetched) => {
            assert_eq!(
                left,
                std::slice::from_ref(&fetched.path),
                "only the result is left"
            );
            let bytes = std::fs::read(&fetched.path).unwrap();
            Ok((fetched, bytes))
        }
        Err(e) => {
            assert!(left.is_empty(), "nothing half-written is left: {left:?}");
            Err(e)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_mirrors_are_tried_in_order_and_the_sha256_decides() {
    let server = ArtifactServer::start().await.unwrap();
    let good = vec![7u8; 256 << 10];
    let mut bad = good.clone();
    bad[1000] ^= 1;
    server.put("/origin/k.raw", Served::bytes(good.clone()));
    server.put("/bad/k.raw", Served::bytes(bad));
    server.put("/good/k.raw", Served::bytes(good.clone()));
    let base = server.url("");
    let policy = format!(
        "[policy]\nallow_http = true\nallowed_url_prefixes = \
         [\"{base}/origin/\", \"{base}/bad/\", \"{base}/gone/\", \"{base}/good/\"]\n"
    );
    let a = artifact(server.url("/origin/k.raw"), &good);

    // Outside the policy, serving other bytes, not holding it: each passed over, in order,
    // with its reason; the origin serves.
    let f = fetcher(&format!(
        "{policy}[[mirrors]]\nurl_prefix = \"{base}/origin/\"\n\
         hosts = [\"{base}/outside/\", \"{base}/bad/\", \"{base}/gone/\"]\n"
    ));
    let (fetched, bytes) = fetch(&f, &a).await.unwrap();
    assert!(bytes == good, "the origin's bytes");
    assert_eq!(fetched.source, a.url);
    let why: Vec<&str> = fetched.skipped.iter().map(String::as_str).collect();
    assert_eq!(why.len(), 3, "{why:#?}");
    assert!(
        why[0].starts_with(&format!("mirror {base}/outside/k.raw: "))
            && why[0].contains("not under an allowed URL prefix"),
        "{why:#?}"
    );
    assert!(
        why[1].starts_with(&format!("mirror {base}/bad/k.raw: sha256 is ")),
        "{why:#?}"
    );
    assert!(
        why[2].starts_with(&format!("mirror {base}/gone/k.raw: ")) && why[2].contains("HTTP 404"),
        "{why:#?}"
    );
    let asked: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert!(
        !asked.iter().any(|p| p.starts_with("/outside/")),
        "a mirror outside the policy is never reached: {asked:?}"
    );
    let first = |p: &str| asked.iter().position(|a| a == p).unwrap();
    assert!(first("/bad/k.raw") < first("/gone/k.raw"));
    assert!(first("/gone/k.raw") < first("/origin/k.raw"));

    // A good mirror serves, and the origin is not asked.
    server.clear_requests();
    let f = fetcher(&format!(
        "{policy}[[mirrors]]\nurl_prefix = \"{base}/origin/\"\nhosts = [\"{base}/good/\"]\n"
    ));
    let (fetched, bytes) = fetch(&f, &a).await.unwrap();
    assert!(bytes == good);
    assert_eq!(fetched.source, server.url("/good/k.raw"));
    assert!(fetched.skipped.is_empty());
    assert!(server.requests_for("/origin/k.raw").is_empty());

    // Every source failing: the origin's reason, and the mirrors named with theirs.
    server.remove("/origin/k.raw");
    let f = fetcher(&format!(
        "{policy}[[mirrors]]\nurl_prefix = \"{base}/origin/\"\nhosts = [\"{base}/bad/\"]\n"
    ));
    let e = fetch(&f, &a).await.unwrap_err();
    assert_eq!(e.reason(), Reason::DownloadFailed, "{e}");
    let text = e.to_string();
    assert!(text.contains("HTTP 404"), "{text}");
    assert!(
        text.contains(&format!(
            "mirrors tried first: mirror {base}/bad/k.raw: sha256 is"
        )),
        "{text}"
    );
}

/// The pull-only user's password on both registries.
const PASSWORD: &str = "pw-mirrors-3b9d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_mirrors_pass_over_a_down_or_corrupt_one() {
    let file: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    let good = Registry::start_distribution("puller", PASSWORD)
        .await
        .unwrap();
    let corrupt = Registry::start_distribution("puller", PASSWORD)
        .await
        .unwrap();
    let pushed = tokio::task::block_in_place(|| {
        corrupt.push_file("sysext/kubernetes", "v1", "kubernetes.raw", &file)?;
        good.push_file("sysext/kubernetes", "v1", "kubernetes.raw", &file)
    })
    .unwrap();
    corrupt.corrupt_blob(&pushed.sha256).unwrap();
    let (down, stopped) = (free_addr().to_string(), free_addr().to_string());
    let logins = tempfile::tempdir().unwrap();
    for r in [&good, &corrupt] {
        crane_login(logins.path(), &r.host(), "puller", PASSWORD).unwrap();
    }
    let (g, c) = (good.host(), corrupt.host());
    let node = format!(
        "[policy]\nallow_http = true\nallowed_url_prefixes = [\"http://{g}/v2/sysext/\", \
         \"http://{c}/v2/sysext/\", \"http://{down}/v2/sysext/\", \"http://{stopped}/v2/sysext/\"]\n\
         [credentials]\ndocker_config = \"{}\"\n",
        logins.path().join("config.json").display(),
    );
    let config = |origin: &str, hosts: &[&str]| {
        let hosts: Vec<String> = hosts.iter().map(|h| format!("\"http://{h}\"")).collect();
        format!(
            "{node}[[mirrors]]\nregistry = \"{origin}\"\nhosts = [{}]\n",
            hosts.join(", ")
        )
    };
    let reference = |registry: &str| {
        let url = format!(
            "oci://{registry}/sysext/kubernetes@sha256:{}",
            pushed.manifest_digest
        );
        artifact(url, &file)
    };
    let blob = |registry: &str| {
        format!(
            "http://{registry}/v2/sysext/kubernetes/blobs/sha256:{}",
            pushed.sha256
        )
    };

    // The origin stopped, the mirrors as registries.md writes them: the corrupt mirror is
    // passed over, the good one serves.
    let f = fetcher_with_documented_mirrors(&node, &stopped, [&c, &g]);
    let (fetched, bytes) = fetch(&f, &reference(&stopped)).await.unwrap();
    assert!(bytes == file, "the pushed file");
    assert_eq!(fetched.source, blob(&g), "the good mirror served it");
    assert_eq!(fetched.skipped.len(), 1, "{:#?}", fetched.skipped);
    assert!(
        fetched.skipped[0].starts_with(&format!(
            "mirror http://{c}/v2/sysext/kubernetes/: sha256 is "
        )),
        "{:#?}",
        fetched.skipped
    );

    // Both mirrors failing (nothing listens on the first): the origin serves.
    let f = fetcher(&config(&g, &[&down, &c]));
    let (fetched, bytes) = fetch(&f, &reference(&g)).await.unwrap();
    assert!(bytes == file);
    assert_eq!(fetched.source, blob(&g), "the origin served it");
    let why = &fetched.skipped;
    assert_eq!(why.len(), 2, "{why:#?}");
    assert!(
        why[0].starts_with(&format!("mirror http://{down}/")),
        "{why:#?}"
    );
    assert!(
        why[1].starts_with(&format!("mirror http://{c}/")),
        "{why:#?}"
    );

    // Nothing serves the plan's bytes: HashMismatch is not the verdict (the origin's
    // failure is), and every mirror is named.
    let f = fetcher(&config(&stopped, &[&c]));
    let e = fetch(&f, &reference(&stopped)).await.unwrap_err();
    assert_eq!(e.reason(), Reason::DownloadFailed, "{e}");
    let text = e.to_string();
    assert!(text.contains(&stopped) && text.contains(&c), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}
