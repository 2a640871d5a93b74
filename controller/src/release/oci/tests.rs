#![allow(clippy::unwrap_used)]

use super::*;

fn manifest(json: serde_json::Value) -> Manifest {
    serde_json::from_value(json).unwrap()
}

fn layer_json(hex: char, title: Option<&str>) -> serde_json::Value {
    let mut layer =
        serde_json::json!({"digest": format!("sha256:{}", hex.to_string().repeat(64)), "size": 7});
    if let Some(title) = title {
        layer["annotations"] = serde_json::json!({"org.opencontainers.image.title": title});
    }
    layer
}

#[test]
fn the_only_layer_or_the_one_titled_is_the_file() {
    let one = manifest(serde_json::json!({"layers": [layer_json('a', None)]}));
    assert_eq!(layer(&one, None).unwrap().sha256(), "a".repeat(64));
    let two = manifest(serde_json::json!({"layers": [
        layer_json('a', Some("kubernetes-v1.31.2-x86-64.raw")),
        layer_json('b', Some("kubernetes-v1.31.2-arm64.raw")),
    ]}));
    assert_eq!(
        layer(&two, Some("kubernetes-v1.31.2-arm64.raw"))
            .unwrap()
            .sha256(),
        "b".repeat(64)
    );
    let e = layer(&two, None).unwrap_err();
    assert!(e.contains("2 layers") && e.contains("--file"), "{e}");
    assert!(e.contains("kubernetes-v1.31.2-arm64.raw"), "{e}");
    let e = layer(&two, Some("other.raw")).unwrap_err();
    assert!(e.contains("no layer is titled \"other.raw\""), "{e}");
    let e = layer(&manifest(serde_json::json!({"layers": []})), None).unwrap_err();
    assert!(e.contains("no layers"), "{e}");
}

fn entry(hex: char, os: &str, arch: &str, variant: Option<&str>) -> serde_json::Value {
    let mut platform = serde_json::json!({"architecture": arch, "os": os});
    if let Some(variant) = variant {
        platform["variant"] = variant.into();
    }
    serde_json::json!({"digest": format!("sha256:{}", hex.to_string().repeat(64)), "size": 9,
        "platform": platform})
}

fn taken(platforms: &Platforms<'_>) -> Vec<(Architecture, String)> {
    platforms
        .usable
        .iter()
        .map(|(a, d)| (*a, d.sha256()[..1].to_owned()))
        .collect()
}

#[test]
fn an_index_gives_each_linux_architecture_a_release_names_once_in_its_order() {
    let index = manifest(serde_json::json!({"manifests": [
        entry('a', "linux", "arm64", Some("v8")),
        entry('b', "windows", "amd64", None),
        entry('c', "linux", "amd64", None),
        entry('d', "linux", "arm", Some("v7")),
        entry('e', "linux", "arm64", None),
        {"digest": format!("sha256:{}", "f".repeat(64)), "size": 9},
        entry('g', "linux", "s390x", None),
    ]}));
    let platforms = linux_platforms(&index, None);
    assert_eq!(
        taken(&platforms),
        [
            (Architecture::Arm64, "a".to_owned()),
            (Architecture::Amd64, "c".to_owned()),
            (Architecture::S390x, "g".to_owned()),
        ],
        "the first usable entry gives the artifact's url"
    );
    let skipped = platforms.skipped.join("\n");
    for why in [
        "windows/amd64 (sha256:bbbb",
        "): not linux",
        "linux/arm/v7 (sha256:dddd",
        "not an architecture a release names (amd64, arm64, riscv64, ppc64le, s390x)",
        "linux/arm64 (sha256:eeee",
        "a second arm64 entry; the first is taken",
        "sha256:ffff",
        "an entry without a platform",
    ] {
        assert!(skipped.contains(why), "{why} in {skipped}");
    }
    assert_eq!(platforms.skipped.len(), 4, "{skipped}");
}

#[test]
fn arch_takes_one_platform_and_other_architectures_are_not_noted() {
    let index = manifest(serde_json::json!({"manifests": [
        entry('a', "linux", "amd64", None), entry('b', "windows", "arm64", None),
        entry('c', "linux", "arm64", None),
    ]}));
    let platforms = linux_platforms(&index, Some(Architecture::Arm64));
    assert_eq!(taken(&platforms), [(Architecture::Arm64, "c".to_owned())]);
    assert_eq!(
        platforms.skipped.len(),
        1,
        "only windows/arm64: {:?}",
        platforms.skipped
    );
    let none = linux_platforms(&index, Some(Architecture::Riscv64));
    assert!(none.usable.is_empty());
    assert_eq!(
        platform_names(&index),
        ["linux/amd64", "windows/arm64", "linux/arm64"]
    );
}

#[test]
fn arch_accepts_the_bakery_and_kernel_spellings() {
    for (name, architecture) in [
        ("x86-64", Architecture::Amd64),
        ("x86_64", Architecture::Amd64),
        ("amd64", Architecture::Amd64),
        ("aarch64", Architecture::Arm64),
        ("arm64", Architecture::Arm64),
        ("ppc64le", Architecture::Ppc64le),
    ] {
        assert_eq!(architecture_named(name), Some(architecture), "{name}");
    }
    assert_eq!(architecture_named("arm"), None);
}

#[test]
fn only_this_machines_registry_is_reached_over_http_unasked() {
    assert!(is_loopback("localhost:5000") && is_loopback("127.0.0.1:41234"));
    assert!(!is_loopback("registry.example") && !is_loopback("10.0.0.1:5000"));
}
