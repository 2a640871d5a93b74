//! The real fetcher against a real OCI registry (go-containerregistry's, `crane registry
//! serve` on loopback) holding files the real `crane` pushed as artifacts: fetched by the
//! manifest digest, resumed from what an earlier process left, and refused when the plan's
//! sha256, size or the reference's digest do not match what the registry holds. And the
//! CNCF Distribution registry with htpasswd authentication: the credentials docs/usage/
//! registries.md has a node keep, used as written; a missing or wrong one refused naming the
//! registry, with the secret in no error and no log line.

use std::path::Path;

use base64::Engine;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use inplace_agent::fetch::{FetchError, Fetcher, HttpFetcher, partial_names};
use inplace_agent::settings::{DownloadSettings, Policy};
use inplace_proto::{Artifact, ArtifactType, Reason};
use inplace_tests::docs;
use inplace_tests::registry::{Pushed, Registry, crane_login};
use inplace_tests::tools::tool;

fn fetcher(registry: &Registry) -> HttpFetcher {
    let settings = DownloadSettings {
        attempts: 3,
        connect_timeout: Duration::from_secs(10),
        stall_timeout: Duration::from_secs(30),
        min_speed: 0,
        artifact_deadline: Duration::from_secs(300),
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
    };
    let policy = Policy {
        // A registry on the node's own network, reached over plain http as its owner wrote.
        allowed_url_prefixes: vec![
            format!("http://{}/v2/sysext/", registry.host())
                .parse()
                .unwrap(),
        ],
        allow_http: true,
        allowed_target_dirs: vec![],
        allowed_config_roots: vec![],
        allowed_units: vec![],
        max_artifact_size: 64 << 20,
        reserved_disk_space: 0,
        allow_remote_health_checks: false,
        require_signatures: false,
        trusted_keys_dir: "/etc/inplace/keys".into(),
    };
    HttpFetcher::new(&settings, &policy).unwrap()
}

fn artifact(registry: &Registry, pushed: &Pushed) -> Artifact {
    Artifact::new(
        "kubernetes",
        ArtifactType::Sysext,
        format!(
            "oci://{}/sysext/kubernetes@sha256:{}",
            registry.host(),
            pushed.manifest_digest
        ),
        pushed.sha256.clone(),
    )
}

async fn pushed(len: usize) -> (Registry, Pushed, Vec<u8>) {
    push_to(Registry::start().await.unwrap(), len)
}

/// `len` bytes pushed to `registry` as the kubernetes sysext.
fn push_to(registry: Registry, len: usize) -> (Registry, Pushed, Vec<u8>) {
    let file = inplace_tests::sysext::incompressible(len);
    let pushed = tokio::task::block_in_place(|| {
        registry.push_file("sysext/kubernetes", "v1.31.2", "kubernetes.raw", &file)
    })
    .unwrap();
    (registry, pushed, file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_crane_pushed_is_fetched_by_its_manifest_digest_and_resumed() {
    let (registry, pushed, file) = pushed(3 << 20).await;
    let fetcher = fetcher(&registry);
    let artifact = artifact(&registry, &pushed);

    let dir = tempfile::tempdir().unwrap();
    let path = fetcher
        .fetch(&artifact, dir.path(), &|_| {})
        .await
        .unwrap()
        .path;
    assert!(
        std::fs::read(&path).unwrap() == file,
        "the fetched bytes are the pushed file"
    );

    // What a killed agent left: the first half and the blob's validator (its digest).
    let dir = tempfile::tempdir().unwrap();
    let [data, validator] = partial_names(&artifact);
    let half = file.len() / 2;
    std::fs::write(dir.path().join(&data), &file[..half]).unwrap();
    std::fs::write(
        dir.path().join(&validator),
        format!("sha256:{}", pushed.sha256),
    )
    .unwrap();
    let seen = Mutex::new(Vec::new());
    let path = fetcher
        .fetch(&artifact, dir.path(), &|done| {
            seen.lock().unwrap().push(done)
        })
        .await
        .unwrap()
        .path;
    assert!(
        std::fs::read(&path).unwrap() == file,
        "the resumed file is whole"
    );
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.first(), Some(&(half as u64)), "it resumed at the half");
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "never started again from zero: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_registry_does_not_hold_is_refused_naming_it() {
    let (registry, pushed, _) = pushed(64 << 10).await;
    let fetcher = fetcher(&registry);
    let dir = tempfile::tempdir().unwrap();

    // The plan's sha256 is not the file the manifest holds.
    let mut wrong_sha = artifact(&registry, &pushed);
    wrong_sha.sha256 = "0".repeat(64);
    let e = fetcher
        .fetch(&wrong_sha, dir.path(), &|_| {})
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Reason::HashMismatch, "{e}");
    assert!(
        matches!(&e, FetchError::HashMismatch { actual, .. } if *actual == pushed.sha256),
        "{e}"
    );

    // The plan's size is not the layer's.
    let mut wrong_size = artifact(&registry, &pushed);
    wrong_size.size = Some(pushed.size + 1);
    let e = fetcher
        .fetch(&wrong_size, dir.path(), &|_| {})
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Reason::SizeMismatch, "{e}");

    // A digest the registry has no manifest for.
    let mut wrong_digest = artifact(&registry, &pushed);
    wrong_digest.url = format!(
        "oci://{}/sysext/kubernetes@sha256:{}",
        registry.host(),
        "1".repeat(64)
    );
    let e = fetcher
        .fetch(&wrong_digest, dir.path(), &|_| {})
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Reason::DownloadFailed, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&registry.host()),
        "names the registry: {text}"
    );
    assert!(text.contains("HTTP 404"), "{text}");

    // A repository outside the node's prefixes is not reached at all.
    let mut elsewhere = artifact(&registry, &pushed);
    elsewhere.url = elsewhere.url.replace("/sysext/", "/private/");
    let e = fetcher
        .fetch(&elsewhere, dir.path(), &|_| {})
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Reason::PolicyDenied, "{e}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing left behind"
    );
}

/// The pull-only user's password on the Distribution registry.
const PASSWORD: &str = "pw-7f3c2a-never-printed";

async fn pushed_with_auth(len: usize) -> (Registry, Pushed, Vec<u8>) {
    let registry = Registry::start_distribution("puller", PASSWORD)
        .await
        .unwrap();
    push_to(registry, len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_credentials_fetch_from_a_registry_that_wants_them() {
    let (registry, pushed, file) = pushed_with_auth(1 << 20).await;
    let node = tempfile::tempdir().unwrap();
    let password_file = node.path().join("puller.password");
    std::fs::write(&password_file, PASSWORD).unwrap();
    let conf = node.path().join("etc-inplace");
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/registries.md");
    let mut block = docs::shell_block(&page, "## Credentials").unwrap();
    for (name, value) in [
        ("REGISTRY", registry.host()),
        ("PASSWORD_FILE", password_file.display().to_string()),
        ("CONF_DIR", conf.display().to_string()),
    ] {
        block = docs::with_assignment(&block, name, &value).unwrap();
    }
    let crane_dir = tool("crane").unwrap().parent().unwrap().to_owned();
    let path = format!(
        "{}:{}",
        crane_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    docs::run_as_a_person(&block, node.path(), &[("PATH", path.as_ref())]).unwrap();

    let settings =
        inplace_agent::settings::load(&conf.join("agent.toml"), || Some("node".into())).unwrap();
    let fetcher = fetcher(&registry).with_credentials(settings.credentials);
    let dir = tempfile::tempdir().unwrap();
    let fetched = fetcher
        .fetch(&artifact(&registry, &pushed), dir.path(), &|_| {})
        .await
        .unwrap();
    assert!(
        std::fs::read(&fetched.path).unwrap() == file,
        "the fetched bytes are the pushed file"
    );
}

/// A Docker config.json for `registry` that the real `crane auth login` wrote with
/// `password`.
fn logged_in(
    dir: &Path,
    registry: &Registry,
    password: &str,
) -> inplace_agent::credentials::CredentialSettings {
    crane_login(dir, &registry.host(), "puller", password).unwrap();
    inplace_agent::credentials::CredentialSettings {
        docker_config: Some(dir.join("config.json")),
        token_files: vec![],
    }
}

/// Every log line of this process, from the agent's code and the libraries below it.
fn capture_logs() -> Arc<Mutex<Vec<u8>>> {
    #[derive(Clone)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Arc::new(Mutex::new(Vec::new()));
    let sink = Sink(logs.clone());
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || sink.clone())
        .init();
    logs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_wrong_credential_names_the_registry_never_the_secret() {
    let logs = capture_logs();
    let (registry, pushed, _) = pushed_with_auth(64 << 10).await;
    let artifact = artifact(&registry, &pushed);
    let dir = tempfile::tempdir().unwrap();

    let anonymous = fetcher(&registry);
    let e = anonymous
        .fetch(&artifact, dir.path(), &|_| {})
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Reason::DownloadFailed, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&registry.host()),
        "names the registry: {text}"
    );
    assert!(text.contains("no credentials"), "{text}");

    let wrong = "wrong-4d1e9b-never-printed";
    let config = tempfile::tempdir().unwrap();
    let fetcher = fetcher(&registry).with_credentials(logged_in(config.path(), &registry, wrong));
    let e = fetcher
        .fetch(&artifact, dir.path(), &|_| {})
        .await
        .unwrap_err();
    assert_eq!(e.reason(), Reason::DownloadFailed, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&registry.host()),
        "names the registry: {text}"
    );
    assert!(text.contains("refused the node's credentials"), "{text}");

    let said = format!(
        "{text}\n{e:?}\n{}",
        String::from_utf8_lossy(&logs.lock().unwrap())
    );
    for secret in [wrong, PASSWORD] {
        let encoded = base64::engine::general_purpose::STANDARD.encode(format!("puller:{secret}"));
        assert!(
            !said.contains(secret) && !said.contains(&encoded),
            "a secret was printed: {said}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing left behind"
    );
}
