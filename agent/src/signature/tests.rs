use super::*;

fn keypair() -> minisign::KeyPair {
    minisign::KeyPair::generate_unencrypted_keypair().expect("a key pair")
}

fn sign(pair: &minisign::KeyPair, bytes: &[u8], comment: &str) -> String {
    minisign::sign(Some(&pair.pk), &pair.sk, bytes, Some(comment), None)
        .expect("a signature")
        .into_string()
}

fn trusted(pair: &minisign::KeyPair) -> (tempfile::TempDir, Vec<TrustedKey>) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let text = pair.pk.to_box().expect("a key box").into_string();
    std::fs::write(dir.path().join("release.pub"), text).expect("written");
    let keys = load_trusted_keys(dir.path()).expect("keys");
    (dir, keys)
}

fn subject<'a>(file: &'a str, version: Option<&'a str>, required: bool) -> Subject<'a> {
    Subject {
        file,
        version,
        version_required: required,
    }
}

/// minisign's default comment names no version. Under `require_signatures` that is
/// refused for a plan with a kubernetesVersion (it would vouch for any release of the
/// file name); without it, it is accepted, as the docs say.
#[test]
fn a_comment_without_a_version_is_refused_only_where_signatures_are_required() {
    let default = "timestamp:1\tfile:k.raw\thashed";
    let err = check_trusted_comment(default, subject("k.raw", Some("v1.31.2"), true))
        .expect_err("no version under require_signatures");
    assert_eq!(err.kind(), "VersionMissing");
    assert!(
        err.to_string()
            .contains("does not name the version (version:v1.31.2)"),
        "{err}"
    );
    check_trusted_comment(default, subject("k.raw", Some("v1.31.2"), false))
        .expect("no version, signatures not required");
    check_trusted_comment(default, subject("k.raw", None, true)).expect("no version to name");
    check_trusted_comment(
        "file:k.raw version:v1.31.2",
        subject("k.raw", Some("v1.31.2"), true),
    )
    .expect("file and version");
}

#[test]
fn trusted_comment_must_name_the_file_and_the_version_when_it_has_one() {
    let ok = |c: &str| check_trusted_comment(c, subject("k.raw", Some("v1.31.2"), false));
    ok("file:k.raw").expect("file only");
    ok("timestamp:1\tfile:k.raw\thashed").expect("minisign's default");
    ok("file:k.raw version:v1.31.2").expect("file and version");
    for bad in [
        "",
        "timestamp:1",
        "file:other.raw",
        "file:k.raw file:other.raw",
        "file:k.raw version:v1.30.0",
        "file:k.raw version:",
        "filek.raw",
        "file:k.raw.minisig",
    ] {
        let err = ok(bad).expect_err(bad);
        assert_eq!(err.kind(), "WrongSubject", "{bad}");
    }
    let err = check_trusted_comment("file:k.raw version:v1.31.2", subject("k.raw", None, true))
        .expect_err("a version the plan does not name");
    assert!(
        err.to_string().contains("names no kubernetesVersion"),
        "{err}"
    );
}

#[test]
fn parse_refuses_what_is_not_a_prehashed_minisign_signature() {
    let pair = keypair();
    let good = sign(&pair, b"bytes", "file:k.raw");
    parse(good.as_bytes()).expect("a good signature parses");
    let mut lines: Vec<String> = good.lines().map(str::to_owned).collect();
    // The same signature marked legacy ("Ed": signed over the raw bytes).
    let mut raw = base64::engine::general_purpose::STANDARD
        .decode(&lines[1])
        .expect("base64");
    raw[1] = b'd';
    lines[1] = base64::engine::general_purpose::STANDARD.encode(raw);
    let legacy = lines.join("\n");
    let long = "x".repeat(MAX_SIGNATURE_BYTES + 1);
    for (bad, why) in [
        (&b""[..], "empty"),
        (&b"\xff\xfe"[..], "not UTF-8"),
        (
            &b"untrusted comment: x\nnot base64\ntrusted comment: y\nAAAA\n"[..],
            "garbage",
        ),
        (&good.as_bytes()[..good.len() / 2], "truncated"),
        (legacy.as_bytes(), "legacy"),
        (long.as_bytes(), "too long"),
    ] {
        let err = parse(bad).err().unwrap_or_else(|| panic!("{why} parsed"));
        assert_eq!(err.kind(), "Malformed", "{why}: {err}");
    }
    assert!(
        parse(legacy.as_bytes())
            .err()
            .is_some_and(|e| e.to_string().contains("legacy")),
    );
}

#[test]
fn verifies_the_bytes_with_the_key_that_made_the_signature() {
    let pair = keypair();
    let (dir, keys) = trusted(&pair);
    let signature = sign(&pair, b"the artifact", "file:k.raw version:v1.31.2");
    let checked = check(
        signature.as_bytes(),
        subject("k.raw", Some("v1.31.2"), true),
        &keys,
        dir.path(),
    )
    .expect("checked");
    checked
        .verify_reader(&b"the artifact"[..])
        .expect("verified");
    let err = checked
        .verify_reader(&b"the artifacT"[..])
        .expect_err("other bytes");
    assert_eq!(err.kind(), "Mismatch");

    let stranger = sign(&keypair(), b"the artifact", "file:k.raw");
    let err = check(
        stranger.as_bytes(),
        subject("k.raw", None, false),
        &keys,
        dir.path(),
    )
    .err()
    .expect("an untrusted key");
    assert_eq!(err.kind(), "UntrustedKey");
    assert!(err.to_string().contains("release.pub"), "{err}");
    let err = check(
        stranger.as_bytes(),
        subject("k.raw", None, false),
        &[],
        dir.path(),
    )
    .err()
    .expect("no keys");
    assert!(err.to_string().contains("no *.pub key in"), "{err}");
}

#[test]
fn a_forged_trusted_comment_fails_verification() {
    let pair = keypair();
    let (dir, keys) = trusted(&pair);
    let signature = sign(&pair, b"bytes", "file:old.raw");
    let forged = signature.replace("file:old.raw", "file:k.raw");
    let checked = check(
        forged.as_bytes(),
        subject("k.raw", None, false),
        &keys,
        dir.path(),
    )
    .expect("passes the checks that need no bytes");
    let err = checked.verify_reader(&b"bytes"[..]).expect_err("forged");
    assert_eq!(err.kind(), "Mismatch");
}

#[test]
fn trusted_keys_are_the_pub_files_and_a_broken_one_is_an_error() {
    let missing = tempfile::tempdir().expect("a temp dir");
    let keys = load_trusted_keys(&missing.path().join("none")).expect("no dir: no keys");
    assert!(keys.is_empty());
    let pair = keypair();
    let (dir, keys) = trusted(&pair);
    assert_eq!(keys.len(), 1);
    std::fs::write(dir.path().join("notes.txt"), "not a key").expect("written");
    assert_eq!(load_trusted_keys(dir.path()).expect("keys").len(), 1);
    std::fs::write(
        dir.path().join("broken.pub"),
        "untrusted comment: x\nAAAA\n",
    )
    .expect("written");
    let err = load_trusted_keys(dir.path())
        .err()
        .expect("a broken key file");
    assert!(err.to_string().contains("broken.pub"), "{err}");
}

/// Made with the minisign 0.11 CLI (Debian's package), so the agent is proven against
/// the tool people sign with, not only against the Rust port the other tests use. In
/// `agent/tests/fixtures/minisign/`, the secret key thrown away afterwards:
///
/// ```sh
/// minisign -G -W -p release.pub -s release.key
/// minisign -S -s release.key -m kubernetes-v1.31.2.raw \
///   -t "file:kubernetes-v1.31.2.raw version:v1.31.2"
/// minisign -S -s release.key -m kubernetes-v1.31.2.raw -x default-comment.minisig
/// ```
#[test]
fn signatures_made_by_the_minisign_cli_verify() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minisign");
    let keys = load_trusted_keys(&dir).expect("the fixture key");
    assert_eq!(keys.len(), 1);
    // The id `minisign -G` printed in the key's untrusted comment.
    assert_eq!(keys[0].id(), "6203DB16E330565B");
    let file = "kubernetes-v1.31.2.raw";
    let bytes = std::fs::read(dir.join(file)).expect("the fixture file");
    for signature in [format!("{file}.minisig"), "default-comment.minisig".into()] {
        let text = std::fs::read(dir.join(&signature)).expect("the fixture signature");
        let checked =
            check(&text, subject(file, Some("v1.31.2"), false), &keys, &dir).expect(&signature);
        checked.verify_reader(&bytes[..]).expect(&signature);
        let mut tampered = bytes.clone();
        tampered[0] ^= 1;
        assert!(checked.verify_reader(&tampered[..]).is_err(), "{signature}");
    }
    // Under require_signatures minisign's default comment names no version.
    let text = std::fs::read(dir.join("default-comment.minisig")).expect("the fixture");
    let err = check(&text, subject(file, Some("v1.31.2"), true), &keys, &dir)
        .err()
        .expect("the default comment under require_signatures");
    assert_eq!(err.kind(), "VersionMissing");
}
