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

#[test]
fn an_index_gives_the_linux_manifest_of_the_architecture() {
    let entry = |hex: char, arch: &str, os: &str| {
        serde_json::json!({"digest": format!("sha256:{}", hex.to_string().repeat(64)), "size": 9,
            "platform": {"architecture": arch, "os": os}})
    };
    let index = manifest(serde_json::json!({"manifests": [
        entry('a', "amd64", "linux"), entry('b', "arm64", "windows"), entry('c', "arm64", "linux"),
    ]}));
    assert_eq!(
        platform_manifest(&index, oci_arch("arm64"))
            .unwrap()
            .sha256(),
        "c".repeat(64)
    );
    assert_eq!(
        platform_manifest(&index, oci_arch("x86-64"))
            .unwrap()
            .sha256(),
        "a".repeat(64)
    );
    assert_eq!(
        platform_manifest(&index, "riscv64").unwrap_err(),
        ["linux/amd64", "windows/arm64", "linux/arm64"]
    );
}

#[test]
fn only_this_machines_registry_is_reached_over_http_unasked() {
    assert!(is_loopback("localhost:5000") && is_loopback("127.0.0.1:41234"));
    assert!(!is_loopback("registry.example") && !is_loopback("10.0.0.1:5000"));
}
