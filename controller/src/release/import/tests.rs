#![allow(clippy::unwrap_used)]

use super::*;
use crate::release::extension::{KUBELET_UNIT, to_json, to_yaml};
use inplace_proto::ArtifactType;

const DIGEST_A: &str = "b806fe313ea409569badef99d400992176702e5feed3b4e5459d1881b19a06c2";
const DIGEST_B: &str = "6c80df84d4374594f33519cf7de9b740681e3ff62bdb2e05efab9029a430bcee";

fn bakery() -> String {
    format!(
        "{DIGEST_A}  kubernetes-v1.31.2-x86-64.raw\n\
         {DIGEST_B}  kubernetes-v1.31.2-arm64.raw\n\
         {DIGEST_B}  kubernetes-v1.30.6-x86-64.raw\n\
         {DIGEST_A}  docker-24.0.9-x86-64.raw\n\
         {DIGEST_A}  kubernetes.conf\n"
    )
}

fn kubernetes(version: &str, arch: &str) -> Wanted {
    Wanted::new("kubernetes", version, arch).unwrap()
}

fn sums_url() -> Url {
    parse_sums_url("https://extensions.example/kubernetes/SHA256SUMS").unwrap()
}

#[test]
fn parses_text_and_binary_mode_lines_and_lowercases_digests() {
    let text = format!(
        "{}  a.raw\n\n{DIGEST_B} *b.raw\r\n",
        DIGEST_A.to_ascii_uppercase()
    );
    let entries = parse_sha256sums(&text).unwrap();
    assert_eq!(
        entries,
        vec![
            ChecksumEntry {
                line: 1,
                sha256: DIGEST_A.into(),
                file: "a.raw".into()
            },
            ChecksumEntry {
                line: 3,
                sha256: DIGEST_B.into(),
                file: "b.raw".into()
            },
        ]
    );
}

#[test]
fn malformed_lines_are_refused_naming_the_line() {
    let cases = [
        (
            format!("{DIGEST_A}  ok.raw\nnot-a-digest  x.raw\n"),
            2,
            "hex",
        ),
        (
            format!("{}  short.raw\n", &DIGEST_A[..63]),
            1,
            "63 characters",
        ),
        (format!("{DIGEST_A}x  long.raw\n"), 1, "65 characters"),
        (format!("{DIGEST_A}\n"), 1, "expected"),
        (format!("{DIGEST_A} one-space.raw\n"), 1, "two spaces"),
        (format!("{DIGEST_A}  \n"), 1, "not a file name"),
        (
            format!("{DIGEST_A}  name with trailing space \n"),
            1,
            "not a file name",
        ),
        (format!("\\{DIGEST_A}  a\\nb.raw\n"), 1, "escaped"),
    ];
    for (text, line, words) in cases {
        let error = parse_sha256sums(&text).unwrap_err();
        assert_eq!(error.kind(), "malformed_line", "{text:?}");
        let message = error.to_string();
        assert!(
            message.starts_with(&format!("SHA256SUMS line {line}:")),
            "{message}"
        );
        assert!(message.contains(words), "{message} lacks {words:?}");
    }
}

#[test]
fn a_file_listed_twice_is_refused_naming_both_lines() {
    let text = format!("{DIGEST_A}  a.raw\n{DIGEST_B}  b.raw\n{DIGEST_B}  a.raw\n");
    let error = parse_sha256sums(&text).unwrap_err();
    assert_eq!(error.kind(), "duplicate_file");
    assert_eq!(
        error.to_string(),
        "SHA256SUMS line 3: a.raw is listed again (first on line 1)"
    );
}

#[test]
fn selects_by_name_version_and_arch_in_any_spelling() {
    let entries = parse_sha256sums(&bakery()).unwrap();
    for (version, arch) in [
        ("v1.31.2", "x86-64"),
        ("1.31.2", "amd64"),
        ("v1.31.2", "x86_64"),
    ] {
        let entry = select(&entries, &kubernetes(version, arch)).unwrap();
        assert_eq!(entry.file, "kubernetes-v1.31.2-x86-64.raw");
    }
    let arm = select(&entries, &kubernetes("v1.31.2", "aarch64")).unwrap();
    assert_eq!(arm.file, "kubernetes-v1.31.2-arm64.raw");
    let docker = Wanted::new("docker", "v24.0.9", "x86-64").unwrap();
    assert_eq!(
        select(&entries, &docker).unwrap().file,
        "docker-24.0.9-x86-64.raw"
    );
}

#[test]
fn no_match_lists_the_extensions_other_images() {
    let entries = parse_sha256sums(&bakery()).unwrap();
    let error = select(&entries, &kubernetes("v1.32.0", "x86-64")).unwrap_err();
    assert_eq!(error.kind(), "no_match");
    assert_eq!(
        error.to_string(),
        "no image in SHA256SUMS matches kubernetes-v1.32.0-x86-64.raw; it lists \
         kubernetes-v1.31.2-x86-64.raw, kubernetes-v1.31.2-arm64.raw, \
         kubernetes-v1.30.6-x86-64.raw"
    );
}

#[test]
fn no_match_of_an_unknown_extension_lists_every_image_up_to_a_limit() {
    let entries = parse_sha256sums(&bakery()).unwrap();
    let wasm = Wanted::new("wasmtime", "v1", "x86-64").unwrap();
    let message = select(&entries, &wasm).unwrap_err().to_string();
    assert!(message.contains("docker-24.0.9-x86-64.raw"), "{message}");
    assert!(!message.contains("kubernetes.conf"), "{message}");

    let many: String = (0..25)
        .map(|i| format!("{DIGEST_A}  other-{i}-x86-64.raw\n"))
        .collect();
    let entries = parse_sha256sums(&many).unwrap();
    let message = select(&entries, &wasm).unwrap_err().to_string();
    assert!(
        message.ends_with("other-19-x86-64.raw and 5 more"),
        "{message}"
    );

    let none = parse_sha256sums(&format!("{DIGEST_A}  kubernetes.conf\n")).unwrap();
    let message = select(&none, &wasm).unwrap_err().to_string();
    assert!(message.ends_with("it lists no .raw images"), "{message}");
}

#[test]
fn several_matches_are_listed_unless_one_is_spelled_exactly_as_asked() {
    let text = format!(
        "{DIGEST_A}  kubernetes-1.31.2-amd64.raw\n{DIGEST_B}  kubernetes-1.31.2-x86_64.raw\n"
    );
    let entries = parse_sha256sums(&text).unwrap();
    let error = select(&entries, &kubernetes("v1.31.2", "x86-64")).unwrap_err();
    assert_eq!(error.kind(), "several_matches");
    assert_eq!(
        error.to_string(),
        "several images in SHA256SUMS match kubernetes-v1.31.2-x86-64.raw: \
         kubernetes-1.31.2-amd64.raw, kubernetes-1.31.2-x86_64.raw; \
         give --version and --arch exactly as one of them spells them"
    );

    let text = format!("{text}{DIGEST_B}  kubernetes-v1.31.2-x86-64.raw\n");
    let entries = parse_sha256sums(&text).unwrap();
    let entry = select(&entries, &kubernetes("v1.31.2", "amd64")).unwrap();
    assert_eq!(entry.file, "kubernetes-v1.31.2-x86-64.raw");
}

#[test]
fn bad_flags_are_refused_naming_the_flag() {
    for (name, version, arch, flag) in [
        ("../etc", "v1", "x86-64", "--name"),
        ("kubernetes", "v1/../../x", "x86-64", "--version"),
        ("kubernetes", "", "x86-64", "--version"),
        ("kubernetes", "v1.31.2", "x86 64", "--arch"),
    ] {
        let error = Wanted::new(name, version, arch).unwrap_err();
        assert_eq!(error.kind(), "invalid_argument");
        assert!(error.to_string().starts_with(flag), "{error}");
    }
    for url in [
        "ftp://example/SHA256SUMS",
        "https://user:pw@example/SHA256SUMS",
        "https://example/dir/",
        "not a url",
    ] {
        let error = parse_sums_url(url).unwrap_err();
        assert_eq!(error.kind(), "invalid_argument", "{url}");
        assert!(error.to_string().starts_with("URL "), "{error}");
    }
}

#[test]
fn builds_a_valid_kubernetes_release_next_to_the_sums_file() {
    let release = release_from_sha256sums(
        &sums_url(),
        &bakery(),
        &kubernetes("1.31.2", "amd64"),
        &ReleaseOptions::default(),
    )
    .unwrap();
    assert_eq!(release.metadata.name.as_deref(), Some("kubernetes-1.31.2"));
    let content = &release.spec.content;
    assert_eq!(release.spec.version, "1.31.2");
    assert_eq!(content.kubernetes_version.as_deref(), Some("v1.31.2"));
    let artifact = &content.artifacts[0];
    assert_eq!(artifact.name, "kubernetes");
    assert_eq!(artifact.kind, ArtifactType::Sysext);
    assert_eq!(
        artifact.url,
        "https://extensions.example/kubernetes/kubernetes-v1.31.2-x86-64.raw"
    );
    assert_eq!(artifact.sha256, DIGEST_A);
    assert_eq!(content.activation.restart_units, vec![KUBELET_UNIT]);
    assert!(content.daemon_reload(), "a sysext implies daemon-reload");
    assert_eq!(content.health_checks.units, vec![KUBELET_UNIT]);
    assert!(content.health_checks.node_kubelet_version);
    assert!(content.health_checks.node_ready);
    assert!(release.validate().is_ok());
}

#[test]
fn a_signature_suffix_sets_the_signature_url_next_to_the_image() {
    let signed = ReleaseOptions {
        signature_suffix: Some(".minisig".into()),
        ..ReleaseOptions::default()
    };
    let release = release_from_sha256sums(
        &sums_url(),
        &bakery(),
        &kubernetes("v1.31.2", "x86-64"),
        &signed,
    )
    .unwrap();
    assert_eq!(
        release.spec.content.artifacts[0].signature_url.as_deref(),
        Some("https://extensions.example/kubernetes/kubernetes-v1.31.2-x86-64.raw.minisig")
    );
    assert!(release.validate().is_ok());
    // Without the option there is none.
    let unsigned = release_from_sha256sums(
        &sums_url(),
        &bakery(),
        &kubernetes("v1.31.2", "x86-64"),
        &ReleaseOptions::default(),
    )
    .unwrap();
    assert_eq!(unsigned.spec.content.artifacts[0].signature_url, None);
    for bad in ["", "/../x.minisig", ".sig?x=1", ".mini sig"] {
        let error = check_signature_suffix(bad).unwrap_err();
        assert_eq!(error.kind(), "invalid_argument");
        assert!(
            error.to_string().starts_with("--signature-suffix"),
            "{error}"
        );
    }
}

#[test]
fn other_extensions_get_no_kubernetes_version() {
    let docker = Wanted::new("docker", "24.0.9", "x86-64").unwrap();
    let release =
        release_from_sha256sums(&sums_url(), &bakery(), &docker, &ReleaseOptions::default())
            .unwrap();
    assert_eq!(release.spec.content.kubernetes_version, None);
    assert!(!release.spec.content.health_checks.node_kubelet_version);
    assert!(!release.spec.content.health_checks.node_ready);
}

#[test]
fn a_release_name_that_is_no_object_name_is_refused() {
    let text = format!("{DIGEST_A}  docker-24.0.9_rc.1-x86-64.raw\n");
    let wanted = Wanted::new("docker", "24.0.9_rc.1", "x86-64").unwrap();
    let error = release_from_sha256sums(&sums_url(), &text, &wanted, &ReleaseOptions::default())
        .unwrap_err();
    assert_eq!(error.kind(), "invalid_argument");
    assert!(error.to_string().starts_with("--release-name"), "{error}");

    let named = ReleaseOptions {
        release_name: Some("docker-rc1".into()),
        ..ReleaseOptions::default()
    };
    let release = release_from_sha256sums(&sums_url(), &text, &wanted, &named).unwrap();
    assert_eq!(release.metadata.name.as_deref(), Some("docker-rc1"));
}

#[test]
fn a_version_the_api_refuses_is_reported_by_field() {
    // `kubernetesVersion` must look like v1.31.2; the image name does not have to.
    let text = format!("{DIGEST_A}  kubernetes-latest-x86-64.raw\n");
    let error = release_from_sha256sums(
        &sums_url(),
        &text,
        &kubernetes("latest", "x86-64"),
        &ReleaseOptions::default(),
    )
    .unwrap_err();
    assert_eq!(error.kind(), "invalid_release");
    assert!(
        error.to_string().contains("spec.kubernetesVersion"),
        "{error}"
    );
}

#[test]
fn yaml_output_parses_back_strictly_and_names_its_source() {
    let release = release_from_sha256sums(
        &sums_url(),
        &bakery(),
        &kubernetes("v1.31.2", "x86-64"),
        &ReleaseOptions::default(),
    )
    .unwrap();
    let yaml = to_yaml(&release, &format!("from-sha256sums {}", sums_url()));
    assert!(yaml.starts_with(
        "# Generated by inplace-controller release from-sha256sums \
         https://extensions.example/kubernetes/SHA256SUMS\n"
    ));
    let parsed: NodeRelease = inplace_strict_yaml::object_from_yaml(&yaml).unwrap();
    assert_eq!(parsed.spec, release.spec);
    assert_eq!(parsed.metadata.name, release.metadata.name);
    let from_json: NodeRelease = serde_json::from_str(&to_json(&release)).unwrap();
    assert_eq!(from_json.spec, release.spec);
}
