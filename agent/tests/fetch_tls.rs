//! faults.md § Downloads, "TLS failure → fail closed, no insecure fallback": the real
//! fetcher against an https server on 127.0.0.1 whose certificate no trusted root signed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use inplace_agent::fetch::{Fetcher, HttpFetcher};
use inplace_agent::settings::{DownloadSettings, Policy};
use inplace_proto::{Artifact, ArtifactType, Reason};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const BODY: &[u8] = b"an artifact behind a certificate nobody trusts";

/// Serves `BODY` over TLS with a fresh self-signed certificate for 127.0.0.1; counts
/// the handshakes that completed and the HTTP requests that were read.
async fn serve_untrusted() -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let cert = CertificateDer::from(generated.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        generated.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let handshakes = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (h, r) = (handshakes.clone(), requests.clone());
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, h, r) = (acceptor.clone(), h.clone(), r.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                h.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                if tls.read(&mut buf).await.unwrap_or(0) > 0 {
                    r.fetch_add(1, Ordering::SeqCst);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        BODY.len()
                    );
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(BODY).await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    (base, handshakes, requests)
}

fn settings() -> DownloadSettings {
    DownloadSettings {
        attempts: 3,
        connect_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_secs(2),
        min_speed: 0,
        artifact_deadline: Duration::from_secs(3600),
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(20),
    }
}

/// Plain http allowed too: an https URL must still never fall back to it.
fn policy(base: &str) -> Policy {
    Policy {
        allowed_url_prefixes: vec![format!("{base}/ok/").parse().unwrap()],
        allow_http: true,
        allowed_target_dirs: vec![],
        allowed_config_roots: vec![],
        allowed_units: vec![],
        max_artifact_size: 1 << 20,
        reserved_disk_space: 0,
        allow_remote_health_checks: false,
        require_signatures: false,
        trusted_keys_dir: "/etc/inplace/keys".into(),
    }
}

fn artifact(base: &str) -> Artifact {
    Artifact {
        size: Some(BODY.len() as u64),
        ..Artifact::new(
            "kubernetes",
            ArtifactType::Sysext,
            format!("{base}/ok/kubernetes.raw"),
            hex::encode(Sha256::digest(BODY)),
        )
    }
}

#[tokio::test]
async fn untrusted_certificate_fails_closed_without_fallback() {
    let (base, handshakes, requests) = serve_untrusted().await;
    let fetcher = HttpFetcher::new(&settings(), &policy(&base)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let error = fetcher
        .fetch(&artifact(&base), dir.path(), &|_| {})
        .await
        .expect_err("an untrusted certificate must fail the download");
    assert_eq!(error.reason(), Reason::DownloadFailed, "{error}");
    assert_eq!(
        handshakes.load(Ordering::SeqCst),
        0,
        "no handshake completed"
    );
    assert_eq!(requests.load(Ordering::SeqCst), 0, "no request was sent");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The fetcher offers HTTP/1.1 alone in its TLS ClientHello (ALPN, read here before any
/// certificate check): the agent links no HTTP/2 stack (security-model.md).
#[tokio::test]
async fn the_fetcher_offers_only_http1_in_its_client_hello() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        let hello =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), socket)
                .await
                .unwrap();
        hello
            .client_hello()
            .alpn()
            .map(|offered| {
                offered
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect()
            })
            .unwrap_or_else(Vec::new)
    });
    let fetcher = HttpFetcher::new(&settings(), &policy(&base)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _ = fetcher.fetch(&artifact(&base), dir.path(), &|_| {}).await;
    let offered: Vec<String> = server.await.unwrap();
    assert_eq!(offered, vec!["http/1.1".to_owned()]);
}
