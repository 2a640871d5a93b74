//! The emulator serves HTTP/2 with prior knowledge (as kube-apiserver does over TLS with ALPN):
//! the scale benchmark multiplexes its watches over few connections.

use inplace_api_emulator::{Emulator, EmulatorConfig};
use serde_json::Value;

#[tokio::test]
async fn http2_prior_knowledge_is_served() {
    use http_body_util::BodyExt;
    let h = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let crds =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes/crds");
    h.apply_crd_dir(&crds).await.unwrap();
    let stream = tokio::net::TcpStream::connect(h.addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(format!("{}/apis/inplace.dev/v1alpha1", h.url()))
        .header("Authorization", "Bearer admin-token")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["kind"], "APIResourceList");
}
