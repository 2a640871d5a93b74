//! The binary: check-config, the single-instance lock, clear-degraded.

use std::path::Path;
use std::process::Command;

use inplace_agent::journal::{Failure, Journal, JournalFile};
use inplace_proto::Reason;
use nix::fcntl::{Flock, FlockArg};

fn agent(config: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_inplace-agent"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let root = dir.display();
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "node_name = \"worker-1\"\nstate_dir = \"{root}/state\"\n[paths]\nlock_file = \"{root}/run/agent.lock\"\n{extra}"
        ),
    )
    .unwrap();
    path
}

#[test]
fn check_config_refuses_a_url_prefix_that_reads_two_ways() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(
        dir.path(),
        "[policy]\nallowed_url_prefixes = [\"https://dl.example/kube-\"]\n",
    );
    let (ok, text) = agent(&path, &["check-config"]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("policy.allowed_url_prefixes")
            && text.contains("https://dl.example/kube-")
            && text.contains("end it with `/`"),
        "{text}"
    );
}

#[test]
fn check_config_reports_unknown_keys_with_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "");
    let (ok, text) = agent(&path, &["check-config"]);
    assert!(ok, "{text}");
    assert!(text.contains("worker-1"), "{text}");
    std::fs::create_dir(dir.path().join("agent.d")).unwrap();
    std::fs::write(
        dir.path().join("agent.d/10-x.toml"),
        "[policy]\nallow_htps = true\n",
    )
    .unwrap();
    let (ok, text) = agent(&path, &["check-config"]);
    assert!(!ok);
    assert!(
        text.contains("10-x.toml") && text.contains("allow_htps"),
        "{text}"
    );
}

#[tokio::test]
async fn second_instance_exits_with_a_clear_message_and_clear_degraded_works() {
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), "");
    let file = JournalFile::new(&dir.path().join("state"));
    let mut degraded = Journal::default();
    degraded.mark_degraded(Failure {
        reason: Reason::RollbackFailed,
        message: "kubelet did not come back".into(),
    });
    file.save(&degraded).await.unwrap();

    std::fs::create_dir_all(dir.path().join("run")).unwrap();
    let held = std::fs::File::create(dir.path().join("run/agent.lock")).unwrap();
    let lock = Flock::lock(held, FlockArg::LockExclusiveNonblock).unwrap();
    let (ok, text) = agent(&path, &["clear-degraded"]);
    assert!(!ok);
    assert!(text.contains("another inplace-agent is running"), "{text}");
    assert!(file.load().await.unwrap().degraded().is_some());

    drop(lock);
    let (ok, text) = agent(&path, &["clear-degraded"]);
    assert!(ok, "{text}");
    assert!(text.contains("kubelet did not come back"), "{text}");
    assert!(file.load().await.unwrap().degraded().is_none());
}

#[test]
fn check_config_checks_the_trusted_keys_when_signatures_are_required() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let path = config(
        dir.path(),
        &format!(
            "[policy]\nrequire_signatures = true\ntrusted_keys_dir = \"{}\"\n",
            keys.display()
        ),
    );
    let (ok, text) = agent(&path, &["check-config"]);
    assert!(!ok);
    assert!(
        text.contains(&keys.display().to_string()) && text.contains("does not exist"),
        "{text}"
    );
    std::fs::create_dir(&keys).unwrap();
    let (ok, text) = agent(&path, &["check-config"]);
    assert!(!ok);
    assert!(text.contains("no minisign public key"), "{text}");
    std::fs::write(keys.join("broken.pub"), "untrusted comment: x\nAAAA\n").unwrap();
    let (ok, text) = agent(&path, &["check-config"]);
    assert!(!ok);
    assert!(text.contains("broken.pub"), "{text}");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/minisign/release.pub"
        ),
        keys.join("broken.pub"),
    )
    .unwrap();
    let (ok, text) = agent(&path, &["check-config"]);
    assert!(ok, "{text}");
    assert!(text.contains("broken.pub ("), "{text}");
}
