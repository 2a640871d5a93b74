//! `inplace-controller release from-sha256sums` as a person runs it: the real binary
//! against a local artifact server laid out like sysext-bakery, its output applied to the
//! API server (the real kube-apiserver by default) and validated by the controller; and each
//! way it can fail, with the stable kind and a message naming the URL, line or candidates,
//! and nothing written.
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::process::Output;
use std::time::Duration;

use inplace_proto::{ArtifactType, NodeRelease};
use inplace_tests::artifact_server::{ArtifactServer, Fault};
use inplace_tests::sysext::sha256_hex;
use kube::api::PostParams;
use support::{Bed, failure, release_command};

const V31_X86: &str = "/kubernetes/kubernetes-v1.31.2-x86-64.raw";
const V31_ARM: &str = "/kubernetes/kubernetes-v1.31.2-arm64.raw";
const V30_X86: &str = "/kubernetes/kubernetes-v1.30.6-x86-64.raw";
const SUMS: &str = "/kubernetes/SHA256SUMS";

/// A server with three kubernetes images and their SHA256SUMS, as the bakery publishes them.
async fn bakery() -> ArtifactServer {
    let server = ArtifactServer::start().await.unwrap();
    for (i, path) in [V31_X86, V31_ARM, V30_X86].into_iter().enumerate() {
        server.put_bytes(path, vec![i as u8 + 1; 4096]);
    }
    server
        .put_sha256sums(SUMS, &[V31_X86, V31_ARM, V30_X86])
        .unwrap();
    server
}

/// Runs `release from-sha256sums <url> --name kubernetes --version <version> <extra>`.
async fn kubernetes(url: &str, version: &str, extra: &[&str]) -> Output {
    release_command("from-sha256sums", url, version, extra).await
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_release_is_accepted_and_validated_by_the_controller() {
    let server = bakery().await;
    let sums_url = server.url(SUMS);
    let output = kubernetes(&sums_url, "v1.31.2", &[]).await;
    let yaml = stdout(&output);

    let release: NodeRelease = inplace_strict_yaml::object_from_yaml(&yaml).unwrap();
    assert_eq!(release.metadata.name.as_deref(), Some("kubernetes-v1.31.2"));
    assert_eq!(
        release.spec.content.kubernetes_version.as_deref(),
        Some("v1.31.2")
    );
    let artifact = &release.spec.content.artifacts[0];
    assert_eq!(artifact.kind, ArtifactType::Sysext);
    assert_eq!(artifact.name, "kubernetes");
    assert_eq!(artifact.url, server.url(V31_X86));
    // The digest is the image's, and the URL serves exactly those bytes.
    let bytes = served_bytes(&server, V31_X86).await;
    assert_eq!(artifact.sha256, sha256_hex(&bytes));
    assert_eq!(
        release.spec.content.activation.restart_units,
        ["kubelet.service"]
    );
    assert_eq!(
        release.spec.content.health_checks.units,
        ["kubelet.service"]
    );

    // The API server's schema accepts it and the controller finds it valid.
    let bed = Bed::start().await;
    bed.releases()
        .create(&PostParams::default(), &release)
        .await
        .unwrap();
    let condition = bed.release_validity("kubernetes-v1.31.2").await;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "ValidRelease"),
        "{}",
        condition.message
    );
}

/// The bytes served at `path`, read with a bare HTTP/1.1 request.
async fn served_bytes(server: &ArtifactServer, path: &str) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let body_at = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(answer.starts_with(b"HTTP/1.1 200"), "not served");
    answer.split_off(body_at)
}

#[tokio::test]
async fn json_to_a_file_for_another_arch() {
    let server = bakery().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("release.json");
    let output = kubernetes(
        &server.url(SUMS),
        "1.31.2",
        &[
            "--arch",
            "aarch64",
            "--output",
            "json",
            "-o",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(stdout(&output), "");
    let release: NodeRelease =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(release.spec.content.artifacts[0].url, server.url(V31_ARM));
    assert!(release.validate().is_ok());
}

#[tokio::test]
async fn a_missing_sha256sums_names_the_status_and_url_and_writes_nothing() {
    let server = bakery().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("release.yaml");
    let url = server.url("/nothing/SHA256SUMS");
    let output = kubernetes(&url, "v1.31.2", &["-o", file.to_str().unwrap()]).await;
    let stderr = failure(&output, "http_status");
    assert!(
        stderr.contains(&format!("GET {url} answered 404 Not Found")),
        "{stderr}"
    );
    assert!(!file.exists(), "wrote a file on failure");
}

#[tokio::test]
async fn a_malformed_line_is_named_by_number() {
    let server = bakery().await;
    let good = server.put_sha256sums(SUMS, &[V31_X86]).unwrap();
    server.put_bytes(
        SUMS,
        format!("{good}0123abcd  kubernetes-v1.32.0-x86-64.raw\n"),
    );
    let output = kubernetes(&server.url(SUMS), "v1.31.2", &[]).await;
    let stderr = failure(&output, "malformed_line");
    assert!(
        stderr.contains("SHA256SUMS line 2: the digest has 8 characters"),
        "{stderr}"
    );
}

#[tokio::test]
async fn no_match_lists_the_candidates() {
    let server = bakery().await;
    let output = kubernetes(&server.url(SUMS), "v1.32.0", &[]).await;
    let stderr = failure(&output, "no_match");
    assert!(
        stderr.contains(
            "no image in SHA256SUMS matches kubernetes-v1.32.0-x86-64.raw; it lists \
             kubernetes-v1.31.2-x86-64.raw, kubernetes-v1.31.2-arm64.raw, \
             kubernetes-v1.30.6-x86-64.raw"
        ),
        "{stderr}"
    );
}

#[tokio::test]
async fn several_matches_are_listed() {
    let server = ArtifactServer::start().await.unwrap();
    let (amd64, x86_64) = (
        "/k/kubernetes-1.31.2-amd64.raw",
        "/k/kubernetes-1.31.2-x86_64.raw",
    );
    server.put_bytes(amd64, vec![1u8; 64]);
    server.put_bytes(x86_64, vec![2u8; 64]);
    server
        .put_sha256sums("/k/SHA256SUMS", &[amd64, x86_64])
        .unwrap();
    let output = kubernetes(&server.url("/k/SHA256SUMS"), "v1.31.2", &[]).await;
    let stderr = failure(&output, "several_matches");
    assert!(
        stderr.contains("kubernetes-1.31.2-amd64.raw, kubernetes-1.31.2-x86_64.raw"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_server_that_does_not_answer_times_out() {
    let server = bakery().await;
    server.fault(SUMS, Fault::DelayHeaders(Duration::from_secs(60)));
    let url = server.url(SUMS);
    let output = kubernetes(&url, "v1.31.2", &["--timeout", "1s"]).await;
    let stderr = failure(&output, "timeout");
    assert!(
        stderr.contains(&format!("GET {url}: no complete answer within 1s")),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_endless_body_is_cut_at_the_size_cap() {
    let server = bakery().await;
    server.fault(SUMS, Fault::Endless);
    let output = kubernetes(&server.url(SUMS), "v1.31.2", &[]).await;
    let stderr = failure(&output, "too_large");
    assert!(stderr.contains("larger than 4194304 bytes"), "{stderr}");
}

#[tokio::test]
async fn bad_flags_are_refused_before_any_request() {
    let server = bakery().await;
    let output = kubernetes(&server.url(SUMS), "v1.31.2/../../etc", &[]).await;
    let stderr = failure(&output, "invalid_argument");
    assert!(
        stderr.contains("--version \"v1.31.2/../../etc\""),
        "{stderr}"
    );
    assert!(server.requests().is_empty(), "a request was made");
}

#[tokio::test]
async fn images_are_next_to_the_url_given_even_when_it_redirects() {
    // As GitHub release downloads do: the SHA256SUMS URL redirects to a signed one-off
    // URL, but the images are published beside the URL people use.
    let server = bakery().await;
    let given = "/releases/download/latest/SHA256SUMS";
    server.fault(
        given,
        Fault::Redirect {
            code: 302,
            location: server.url(SUMS),
        },
    );
    let output = kubernetes(&server.url(given), "v1.31.2", &["--output", "json"]).await;
    let release: NodeRelease = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(
        release.spec.content.artifacts[0].url,
        server.url("/releases/download/latest/kubernetes-v1.31.2-x86-64.raw")
    );
}

#[tokio::test]
async fn a_signature_suffix_points_signature_url_next_to_the_image() {
    let server = bakery().await;
    let output = kubernetes(
        &server.url(SUMS),
        "v1.31.2",
        &["--signature-suffix", ".minisig"],
    )
    .await;
    let release: NodeRelease = inplace_strict_yaml::object_from_yaml(&stdout(&output)).unwrap();
    let artifact = &release.spec.content.artifacts[0];
    assert_eq!(
        artifact.signature_url.as_deref(),
        Some(format!("{}.minisig", server.url(V31_X86)).as_str())
    );
    assert!(release.validate().is_ok());

    // A suffix that would leave the image's directory is refused before any request.
    let before = server.requests().len();
    let output = kubernetes(
        &server.url(SUMS),
        "v1.31.2",
        &["--signature-suffix", "/../keys.pub"],
    )
    .await;
    let stderr = failure(&output, "invalid_argument");
    assert!(stderr.contains("--signature-suffix"), "{stderr}");
    assert_eq!(server.requests().len(), before, "a request was made");
}
