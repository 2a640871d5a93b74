use std::path::Path;

use super::*;

/// A transfer as sysext-bakery lays one out: images under `/opt/extensions/kubernetes`,
/// the link in `/etc/extensions` (the real-node suite writes the same file).
const KUBERNETES: &str = include_str!("../../tests/fixtures/sysupdate-kubernetes.conf");

fn paths() -> Paths {
    Paths {
        extensions_dir: "/etc/extensions".into(),
        images_dir: "/opt/extensions".into(),
        merged_root: "/".into(),
        lock_file: "/run/inplace/agent.lock".into(),
    }
}

fn write(root: &Path, file: &str, text: &str) {
    let path = root.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn content(artifacts: serde_json::Value) -> UpdateContent {
    serde_json::from_value(serde_json::json!({ "artifacts": artifacts })).unwrap()
}

fn sysext(name: &str) -> serde_json::Value {
    serde_json::json!({"name": name, "type": "Sysext",
        "url": format!("https://x.example/{name}.raw"), "sha256": "a".repeat(64)})
}

#[test]
fn finds_the_transfer_files_sysupdate_reads_and_their_targets() {
    let root = tempfile::tempdir().unwrap();
    write(
        root.path(),
        "etc/sysupdate.kubernetes.d/kubernetes-v1.34.conf",
        KUBERNETES,
    );
    write(
        root.path(),
        "usr/lib/sysupdate.d/50-os.transfer",
        "[Target]\nPath=/usr\n",
    );
    write(root.path(), "etc/sysupdate.d/README", "not a transfer");
    write(
        root.path(),
        "etc/other.d/x.conf",
        "[Target]\nPath=/opt/extensions/x\n",
    );
    let found = transfers(root.path());
    assert_eq!(
        found,
        vec![
            Transfer {
                file: root
                    .path()
                    .join("etc/sysupdate.kubernetes.d/kubernetes-v1.34.conf"),
                target_dir: Some("/opt/extensions/kubernetes".into()),
                current_symlink: Some("/etc/extensions/kubernetes.raw".into()),
            },
            Transfer {
                file: root.path().join("usr/lib/sysupdate.d/50-os.transfer"),
                target_dir: Some("/usr".into()),
                current_symlink: None,
            },
        ]
    );
    assert!(transfers(&root.path().join("nothing-here")).is_empty());
}

#[test]
fn a_plan_for_an_extension_sysupdate_manages_is_refused_naming_the_file() {
    let transfer = parse("/etc/sysupdate.kubernetes.d/k.conf".into(), KUBERNETES);
    let problems = conflicts(
        &content(serde_json::json!([
            sysext("containerd"),
            sysext("kubernetes")
        ])),
        &paths(),
        &[transfer],
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].path, "spec.artifacts[1]");
    assert_eq!(problems[0].reason, Reason::PolicyDenied);
    let message = &problems[0].message;
    assert!(
        message.starts_with("system extension kubernetes is also updated by systemd-sysupdate")
            && message.contains("CurrentSymlink= is /etc/extensions/kubernetes.raw")
            && message.contains("/etc/sysupdate.kubernetes.d/k.conf")
            && message.contains("nothing was changed"),
        "{message}"
    );
}

#[test]
fn the_image_directory_alone_is_a_conflict_and_a_relative_link_is_below_it() {
    let relative = parse(
        "/etc/sysupdate.d/k.transfer".into(),
        "[Target]\nPath=/opt/extensions/kubernetes\nCurrentSymlink=current.raw\n",
    );
    assert_eq!(
        relative.current_symlink.as_deref(),
        Some(Path::new("/opt/extensions/kubernetes/current.raw"))
    );
    let problems = conflicts(
        &content(serde_json::json!([sysext("kubernetes")])),
        &paths(),
        &[relative],
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0]
            .message
            .contains("it keeps its images in /opt/extensions/kubernetes"),
        "{}",
        problems[0].message
    );
}

#[test]
fn other_sections_comments_and_other_artifact_types_do_not_count() {
    let transfer = parse(
        "/etc/sysupdate.d/k.conf".into(),
        "[Source]\nPath=/opt/extensions/kubernetes\n[Target]\n# CurrentSymlink=/etc/extensions/kubernetes.raw\nPath=/var/lib/other\n",
    );
    assert_eq!(transfer.current_symlink, None);
    let binary = serde_json::json!({"name": "kubernetes", "type": "Binary",
        "url": "https://x.example/kubelet", "sha256": "a".repeat(64), "path": "/opt/bin/kubelet"});
    let everything = content(serde_json::json!([sysext("kubernetes"), binary]));
    assert!(conflicts(&everything, &paths(), &[transfer]).is_empty());
    let bakery = parse("/etc/sysupdate.kubernetes.d/k.conf".into(), KUBERNETES);
    let binary_only = content(serde_json::json!([{"name": "kubernetes", "type": "Binary",
        "url": "https://x.example/kubelet", "sha256": "a".repeat(64), "path": "/opt/bin/kubelet"}]));
    assert!(conflicts(&binary_only, &paths(), &[bakery]).is_empty());
}
