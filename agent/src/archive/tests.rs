use super::*;
use std::io::Cursor;

const LIMITS: Limits = Limits {
    max_entries: 100,
    max_bytes: 1 << 20,
    reserved_disk_space: 0,
};

fn header(path: &str, kind: EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    // Write the name bytes directly so that malicious names survive.
    let name = &mut h.as_old_mut().name;
    name[..path.len()].copy_from_slice(path.as_bytes());
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_cksum();
    h
}

fn tar_of(entries: &[(tar::Header, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (h, data) in entries {
        b.append(h, Cursor::new(*data)).unwrap();
    }
    b.into_inner().unwrap()
}

fn file(path: &str, data: &'static [u8]) -> (tar::Header, &'static [u8]) {
    (
        header(path, EntryType::Regular, data.len() as u64, 0o755),
        data,
    )
}

fn run(
    bytes: &[u8],
    members: &[&str],
) -> (tempfile::TempDir, Result<Vec<Extracted>, ArchiveError>) {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("a.tar");
    fs::write(&archive, bytes).unwrap();
    let staging = dir.path().join("staging");
    let result = extract_members(&archive, members, &staging, LIMITS);
    if result.is_err() {
        assert!(!staging.exists(), "staging must be removed on refusal");
    }
    // Nothing outside the staging directory but the archive itself.
    let names: HashSet<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| n == "a.tar" || n == "staging"),
        "{names:?}"
    );
    (dir, result)
}

#[test]
fn extracts_only_named_members() {
    let bytes = tar_of(&[
        (header("kubernetes/", EntryType::Directory, 0, 0o755), b""),
        file("kubernetes/node/bin/kubeadm", b"kubeadm!"),
        file("kubernetes/node/bin/kubelet", b"kubelet!"),
    ]);
    let (_dir, out) = run(&bytes, &["./kubernetes/node/bin/kubeadm"]);
    let out = out.unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].from, "./kubernetes/node/bin/kubeadm");
    assert_eq!(fs::read(&out[0].path).unwrap(), b"kubeadm!");
    assert_eq!(out[0].sha256, hex::encode(Sha256::digest(b"kubeadm!")));
}

#[test]
fn gzip_works() {
    let bytes = tar_of(&[file("bin/x", b"x")]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&bytes).unwrap();
    let (_dir, out) = run(&gz.finish().unwrap(), &["bin/x"]);
    assert_eq!(out.unwrap().len(), 1);
}

fn refused(entries: &[(tar::Header, &[u8])], why: &str) {
    let mut all = vec![file("bin/x", b"wanted")];
    all.extend_from_slice(entries);
    let (_dir, out) = run(&tar_of(&all), &["bin/x"]);
    match out {
        Err(ArchiveError::Refused { why: w, .. }) => assert!(w.contains(why), "{w} vs {why}"),
        other => panic!("{why}: {other:?}"),
    }
}

#[test]
fn malicious_entries_refuse_the_whole_archive() {
    refused(&[file("../evil", b"e")], "..");
    refused(&[file("a/../../evil", b"e")], "..");
    refused(&[file("/etc/evil", b"e")], "absolute");
    let mut link = header("bin/link", EntryType::Symlink, 0, 0o777);
    link.set_link_name("/etc/shadow").unwrap();
    link.set_cksum();
    refused(&[(link, b"")], "symbolic");
    let mut hard = header("bin/hard", EntryType::Link, 0, 0o644);
    hard.set_link_name("bin/x").unwrap();
    hard.set_cksum();
    refused(&[(hard, b"")], "hard");
    refused(
        &[(header("dev/sda", EntryType::Block, 0, 0o600), b"")],
        "device",
    );
    refused(
        &[(header("dev/tty", EntryType::Char, 0, 0o600), b"")],
        "device",
    );
    refused(&[(header("fifo", EntryType::Fifo, 0, 0o600), b"")], "fifo");
    refused(
        &[(header("bin/su", EntryType::Regular, 1, 0o4755), b"s")],
        "setuid",
    );
    refused(
        &[(header("bin/sg", EntryType::Regular, 1, 0o2755), b"s")],
        "setuid/setgid",
    );
    refused(&[file("bin/x", b"again")], "duplicate");
    refused(&[file("./bin/x", b"again")], "duplicate");
}

#[test]
fn sparse_entry_refuses_the_whole_archive() {
    // The tar crate already fails on a malformed GNU sparse header; a well-formed one
    // reaches our entry-type check. Either way nothing is installed.
    let bytes = tar_of(&[
        file("bin/x", b"wanted"),
        (header("sparse", EntryType::GNUSparse, 0, 0o644), b""),
    ]);
    let (_dir, out) = run(&bytes, &["bin/x"]);
    assert!(out.is_err(), "{out:?}");
}

#[test]
fn pax_size_record_is_refused() {
    let mut b = tar::Builder::new(Vec::new());
    b.append_pax_extensions([("size", b"1".as_slice())])
        .unwrap();
    let (h, d) = file("bin/x", b"wanted");
    b.append(&h, Cursor::new(d)).unwrap();
    let (_dir, out) = run(&b.into_inner().unwrap(), &["bin/x"]);
    assert!(matches!(out, Err(ArchiveError::Refused { .. })), "{out:?}");
}

#[test]
fn too_many_entries() {
    let names: Vec<String> = (0..101).map(|i| format!("f{i}")).collect();
    let entries: Vec<_> = names
        .iter()
        .map(|n| (header(n, EntryType::Regular, 0, 0o644), b"".as_slice()))
        .collect();
    let (_dir, out) = run(&tar_of(&entries), &["f0"]);
    assert!(matches!(out, Err(ArchiveError::TooBig(_))), "{out:?}");
}

#[test]
fn gzip_bomb_stops_at_the_byte_limit() {
    // 8 MiB of zeros compresses to a few KiB; the limit is 1 MiB uncompressed.
    let zeros = vec![0u8; 8 << 20];
    let mut h = header("bomb", EntryType::Regular, zeros.len() as u64, 0o644);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, Cursor::new(&zeros)).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&b.into_inner().unwrap()).unwrap();
    let compressed = gz.finish().unwrap();
    assert!(compressed.len() < 64 << 10);
    let (_dir, out) = run(&compressed, &["bomb"]);
    // Refused at the member's header, before any of it is written.
    match out {
        Err(ArchiveError::TooBig(why)) => assert!(
            why.contains("member \"bomb\" (8388608 bytes) ends past the limit of 1048576"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_member_that_would_eat_into_the_reserve_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("a.tar");
    std::fs::write(&archive, tar_of(&[file("bin/x", b"x")])).unwrap();
    let staging = dir.path().join("staging");
    let limits = Limits {
        reserved_disk_space: u64::MAX,
        ..LIMITS
    };
    let out = extract_members(&archive, &["bin/x"], &staging, limits);
    match out {
        Err(e @ ArchiveError::NoRoom { .. }) => {
            let text = e.to_string();
            assert!(text.contains("\"bin/x\" (1 bytes)"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!staging.exists(), "the staging directory is removed");
}

#[test]
fn missing_member() {
    let (_dir, out) = run(&tar_of(&[file("bin/x", b"x")]), &["bin/y"]);
    assert!(
        matches!(out, Err(ArchiveError::MissingMember(_))),
        "{out:?}"
    );
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    let (_dir, out) = run(
        b"this is not a tar archive at all, not even close.......",
        &["x"],
    );
    assert!(out.is_err());
}

#[test]
fn a_tree_is_every_entry_at_its_own_path_with_its_mode() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("a.tar");
    fs::write(
        &archive,
        tar_of(&[
            (header("./", EntryType::Directory, 0, 0o700), b""),
            (header("conf.d/", EntryType::Directory, 0, 0o700), b""),
            (
                header("conf.d/50-pods.conf", EntryType::Regular, 12, 0o640),
                b"maxPods: 150",
            ),
            (header("README", EntryType::Regular, 2, 0o644), b"hi"),
            (header("empty/", EntryType::Directory, 0, 0o755), b""),
        ]),
    )
    .unwrap();
    let staging = dir.path().join("tree");
    assert_eq!(extract_tree(&archive, &staging, LIMITS).unwrap().len(), 2);
    let mode = |p: &str| {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(staging.join(p)).unwrap().permissions().mode() & 0o7777
    };
    assert_eq!(
        fs::read(staging.join("conf.d/50-pods.conf")).unwrap(),
        b"maxPods: 150"
    );
    assert_eq!(mode("conf.d/50-pods.conf"), 0o640);
    assert_eq!(mode("README"), 0o644);
    assert_eq!(mode("conf.d"), 0o755, "a tree's directories are 0755");
    assert!(staging.join("empty").is_dir());

    // One bad entry anywhere refuses the whole tree and leaves nothing.
    let bad = dir.path().join("bad.tar");
    fs::write(
        &bad,
        tar_of(&[
            file("conf.d/50-pods.conf", b"x"),
            (header("conf.d/link", EntryType::Symlink, 0, 0o777), b""),
        ]),
    )
    .unwrap();
    let staging = dir.path().join("bad-tree");
    let e = extract_tree(&bad, &staging, LIMITS).unwrap_err();
    assert!(
        e.to_string().contains("symbolic links are not allowed"),
        "{e}"
    );
    assert!(!staging.exists());
}
