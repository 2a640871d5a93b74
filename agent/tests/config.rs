//! Config artifacts (issue 38 item 2) through the whole per-revision flow, against the fake
//! edges of `common/mod.rs` and a real file system: the file a Config replaces comes back
//! byte for byte on rollback, a path that did not exist is removed again, the file has the
//! plan's mode and owner, and a path outside the configuration roots or an owner the node
//! does not know is refused before anything is fetched or changed.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use common::Bed;
use inplace_proto::{Artifact, ArtifactType, NodeUpdatePlan, Phase};
use sha2::{Digest, Sha256};

/// The bed's plan (sysext `image`, kubectl v1) with a Config artifact of `bytes` at `path`.
fn with_config(bed: &Bed, image: &str, path: &Path, bytes: &str) -> NodeUpdatePlan {
    let mut plan = bed.plan(image, "kubectl v1", "Active");
    let sha256 = hex::encode(Sha256::digest(bytes));
    let url = format!("https://dl.example/config/{}/kubelet.conf", &sha256[..8]);
    bed.fetcher
        .objects
        .lock()
        .unwrap()
        .insert(url.clone(), bytes.as_bytes().to_vec());
    plan.spec.content.artifacts.push(Artifact {
        size: Some(bytes.len() as u64),
        path: Some(path.display().to_string()),
        ..Artifact::new("kubelet-config", ArtifactType::Config, url, sha256)
    });
    plan
}

/// The mode, uid and gid of the file `path` leads to.
fn attributes(path: &Path) -> (u32, u32, u32) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.mode() & 0o7777, meta.uid(), meta.gid())
}

/// The calls the bed's systemd was asked, those that start with `prefix`.
fn systemd_calls(bed: &Bed, prefix: &str) -> Vec<String> {
    let calls = bed.systemd.calls.lock().unwrap();
    calls
        .iter()
        .filter(|c| c.starts_with(prefix))
        .cloned()
        .collect()
}

fn kubelet_conf(bed: &Bed) -> PathBuf {
    bed.root().join("etc/kubernetes/kubelet.conf")
}

#[tokio::test]
async fn a_config_change_commits_and_a_failed_one_restores_the_previous_bytes() {
    let bed = Bed::new();
    let conf = kubelet_conf(&bed);
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    let original = "kind: KubeletConfiguration\nmaxPods: 110\n";
    std::fs::write(&conf, original).unwrap();
    let mut agent = bed.agent().await;

    // Broken: the kubelet fails its health check after the swap.
    let broken = with_config(&bed, "OK v1 unhealthy", &conf, "maxPods: 250\n");
    agent.handle(Some(&broken)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), original);
    assert!(std::fs::symlink_metadata(&conf).unwrap().is_file());

    // Working: the new file is what the path reads, and the kubelet was restarted after it.
    let bed = Bed::new();
    let conf = kubelet_conf(&bed);
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    std::fs::write(&conf, original).unwrap();
    let mut agent = bed.agent().await;
    let good = with_config(&bed, "OK v1", &conf, "maxPods: 250\n");
    agent.handle(Some(&good)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "maxPods: 250\n");
    assert!(systemd_calls(&bed, "restart").contains(&"restart kubelet.service".to_owned()));
}

/// A replaced file the agent cannot keep as a hard link (here: on another file system than
/// its state directory; on a node also another user's file, which the hardened unit may
/// not link) is kept as the agent's copy; the rollback puts it back with its owner, through
/// PID 1. (Before, it came back root's.)
#[tokio::test]
async fn a_replaced_file_the_agent_had_to_copy_comes_back_with_its_owner() {
    let etc = tempfile::tempdir_in("/dev/shm").unwrap();
    let bed = Bed::with_config_root(Some(etc.path()));
    let device = |path: &Path| std::fs::metadata(path).unwrap().dev();
    assert_ne!(
        device(etc.path()),
        device(bed.root()),
        "/dev/shm is another file system than the bed's state directory"
    );
    let conf = etc.path().join("kubelet.conf");
    std::fs::write(&conf, "maxPods: 110\n").unwrap();
    std::os::unix::fs::chown(&conf, Some(1234), Some(2345)).unwrap();
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o640)).unwrap();
    let mut agent = bed.agent().await;

    let broken = with_config(&bed, "OK v1 unhealthy", &conf, "maxPods: 250\n");
    agent.handle(Some(&broken)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "maxPods: 110\n");
    assert_eq!(attributes(&conf), (0o640, 1234, 2345));
    assert!(systemd_calls(&bed, "chown").contains(&"chown 1234:2345".to_owned()));
}

#[tokio::test]
async fn a_config_file_that_did_not_exist_is_removed_on_rollback() {
    let bed = Bed::new();
    let dropin = bed
        .root()
        .join("etc/kubernetes/kubelet.conf.d/50-pods.conf");
    let mut agent = bed.agent().await;
    let broken = with_config(&bed, "OK v1 unhealthy", &dropin, "maxPods: 250\n");
    agent.handle(Some(&broken)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert!(std::fs::symlink_metadata(&dropin).is_err());
}

#[tokio::test]
async fn a_config_outside_the_roots_is_refused_and_changes_nothing() {
    let bed = Bed::new();
    let outside = bed.root().join("etc/containerd/config.toml");
    std::fs::create_dir_all(outside.parent().unwrap()).unwrap();
    std::fs::write(&outside, "version = 2\n").unwrap();
    let mut agent = bed.agent().await;
    let plan = with_config(&bed, "OK v1", &outside, "version = 3\n");
    agent.handle(Some(&plan)).await.unwrap();
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "PolicyDenied");
    assert!(message.contains("spec.artifacts[2].path"), "{message}");
    assert!(
        message.contains("Config artifact kubelet-config"),
        "{message}"
    );
    assert!(message.contains("etc/containerd/config.toml"), "{message}");
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), 0);
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "version = 2\n");
    assert!(!bed.settings.state_dir.join("store").exists());
}

#[tokio::test]
async fn a_config_file_has_the_plans_mode_and_owner_and_else_0644_root() {
    let bed = Bed::new();
    let conf = kubelet_conf(&bed);
    let mut agent = bed.agent().await;
    let plain = with_config(&bed, "OK v1", &conf, "maxPods: 150\n");
    agent.handle(Some(&plain)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(attributes(&conf), (0o644, 0, 0));
    let chowns = |bed: &Bed| systemd_calls(bed, "chown");
    assert!(chowns(&bed).is_empty(), "root's file needs no chown");

    // The same bytes, the kubelet's group may read them, no one else: another stored copy.
    let mut private = with_config(&bed, "OK v1", &conf, "maxPods: 150\n");
    let artifact = private.spec.content.artifacts.last_mut().unwrap();
    artifact.mode = Some("0640".into());
    artifact.owner = Some("0:990".into());
    agent.handle(Some(&private)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(attributes(&conf), (0o640, 0, 990));
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "maxPods: 150\n");
    assert_eq!(chowns(&bed), ["chown 0:990"]);

    // Rolled back to the previous revision's file: 0644 root's again.
    let mut broken = with_config(&bed, "OK v1 unhealthy", &conf, "maxPods: 150\n");
    let artifact = broken.spec.content.artifacts.last_mut().unwrap();
    artifact.mode = Some("0600".into());
    agent.handle(Some(&broken)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(attributes(&conf), (0o640, 0, 990));
}

#[tokio::test]
async fn an_owner_the_node_does_not_know_is_refused_before_anything_is_fetched() {
    let bed = Bed::new();
    let conf = kubelet_conf(&bed);
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    std::fs::write(&conf, "maxPods: 110\n").unwrap();
    let mut agent = bed.agent().await;
    let mut plan = with_config(&bed, "OK v1", &conf, "maxPods: 150\n");
    plan.spec.content.artifacts.last_mut().unwrap().owner = Some("no-such-user-here:root".into());
    agent.handle(Some(&plan)).await.unwrap();
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "StagingFailed");
    assert!(message.contains("spec.artifacts[2].owner"), "{message}");
    assert!(message.contains("kubelet-config"), "{message}");
    assert!(
        message.contains("user \"no-such-user-here\" is not known on this node"),
        "{message}"
    );
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), 0);
    assert_eq!(std::fs::read_to_string(&conf).unwrap(), "maxPods: 110\n");
}

/// A tar of `files` (path, bytes, mode) below directory `conf.d/`.
fn tree_tar(files: &[(&str, &str, u32)]) -> String {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, bytes, mode) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(*mode);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, bytes.as_bytes())
            .unwrap();
    }
    // The fetcher fake serves strings: a tar of text files is one.
    String::from_utf8(builder.into_inner().unwrap()).unwrap()
}

#[tokio::test]
async fn a_config_directory_replaces_the_tree_and_a_rollback_brings_the_old_one_back() {
    let bed = Bed::new();
    let dropins = bed.root().join("etc/kubernetes/kubelet.conf.d");
    std::fs::create_dir_all(&dropins).unwrap();
    std::fs::write(dropins.join("10-old.conf"), "maxPods: 110\n").unwrap();
    let mut agent = bed.agent().await;
    let tree = tree_tar(&[
        ("50-pods.conf", "maxPods: 150\n", 0o640),
        ("sub/60-more.conf", "more\n", 0o600),
    ]);
    let with_tree = |image: &str| {
        let mut plan = with_config(&bed, image, &dropins, &tree);
        let artifact = plan.spec.content.artifacts.last_mut().unwrap();
        artifact.directory = true;
        artifact.owner = Some("0:990".into());
        plan
    };

    let broken = with_tree("OK v1 unhealthy");
    agent.handle(Some(&broken)).await.unwrap();
    assert_eq!(
        bed.last().phase,
        Some(Phase::RolledBack),
        "{:?}",
        bed.ready()
    );
    assert!(std::fs::symlink_metadata(&dropins).unwrap().is_dir());
    let names: Vec<_> = std::fs::read_dir(&dropins)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, ["10-old.conf"], "the old tree, and only it");

    let good = with_tree("OK v1");
    agent.handle(Some(&good)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert!(std::fs::symlink_metadata(&dropins).unwrap().is_symlink());
    assert!(!dropins.join("10-old.conf").exists());
    assert_eq!(
        std::fs::read_to_string(dropins.join("50-pods.conf")).unwrap(),
        "maxPods: 150\n"
    );
    assert_eq!(attributes(&dropins.join("50-pods.conf")), (0o640, 0, 990));
    assert_eq!(
        attributes(&dropins.join("sub/60-more.conf")),
        (0o600, 0, 990)
    );
    assert_eq!(attributes(&dropins.join("sub")), (0o755, 0, 0));
}
