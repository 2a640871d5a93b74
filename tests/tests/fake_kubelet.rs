//! The stand-in kubelet on the host: version, health answers, crash, and its client mode.

use std::time::{Duration, Instant};

use inplace_tests::fake_kubelet::{FakeKubeletConfig, Healthz};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_fake-kubelet");

fn free_port() -> u16 {
    inplace_tests::ports::free_port().expect("free port")
}

fn config_file(dir: &tempfile::TempDir, cfg: &FakeKubeletConfig) -> String {
    let path = dir.path().join("config");
    std::fs::write(&path, cfg.render()).expect("write config");
    path.display().to_string()
}

async fn get(url: &str) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["get", url])
        .output()
        .await
        .expect("client runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

async fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "fake kubelet never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn reports_version_and_health_as_configured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = FakeKubeletConfig::healthy("v1.31.2");
    cfg.port = free_port();
    let path = config_file(&dir, &cfg);
    let version = Command::new(BIN)
        .args(["--config", &path, "--version"])
        .output()
        .await
        .expect("runs");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        "Kubernetes v1.31.2\n"
    );

    let mut server = Command::new(BIN)
        .args(["--config", &path])
        .kill_on_drop(true)
        .spawn()
        .expect("serve");
    wait_listening(cfg.port).await;
    let base = format!("http://127.0.0.1:{}", cfg.port);
    assert_eq!(
        get(&format!("{base}/healthz")).await,
        (true, "ok".to_owned())
    );
    let (ok, body) = get(&format!("{base}/version")).await;
    assert!(ok && body.contains("\"gitVersion\":\"v1.31.2\""), "{body}");
    assert!(!get(&format!("{base}/nope")).await.0);
    server.kill().await.expect("kill");

    cfg.healthz = Healthz::Fail;
    cfg.port = free_port();
    let path = config_file(&dir, &cfg);
    let _unhealthy = Command::new(BIN)
        .args(["--config", &path])
        .kill_on_drop(true)
        .spawn()
        .expect("serve");
    wait_listening(cfg.port).await;
    let (ok, body) = get(&format!("http://127.0.0.1:{}/healthz", cfg.port)).await;
    assert!(!ok);
    assert_eq!(body, "unhealthy");
}

#[tokio::test]
async fn crashing_build_exits_non_zero_soon_after_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = FakeKubeletConfig::crashing("v1.31.3");
    cfg.port = free_port();
    cfg.crash_after_ms = 200;
    let path = config_file(&dir, &cfg);
    let status = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(BIN).args(["--config", &path]).status(),
    )
    .await
    .expect("exits by itself")
    .expect("runs");
    assert_eq!(status.code(), Some(1));

    let broken = dir.path().join("broken");
    std::fs::write(&broken, "colour=blue\n").expect("write");
    let out = Command::new(BIN)
        .args(["--config", &broken.display().to_string()])
        .output()
        .await
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown key"));
}
