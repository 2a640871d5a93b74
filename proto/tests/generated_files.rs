//! The committed CRDs and examples must match the code: generated files come from a
//! command (`make crds`), and CI fails on drift.

use std::path::{Path, PathBuf};

use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan};
use inplace_strict_yaml::object_from_yaml;
use serde::Deserialize;

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes")
}

#[test]
fn committed_crds_match_the_types() {
    let dir = packaging().join("crds");
    let mut expected_files: Vec<String> = Vec::new();
    for (file_name, crd) in inplace_proto::crd::all() {
        expected_files.push(file_name.to_owned());
        let committed = std::fs::read_to_string(dir.join(file_name))
            .unwrap_or_else(|e| panic!("{file_name} is missing ({e}); run `make crds`"));
        assert!(
            committed == inplace_proto::crd::to_yaml(&crd),
            "packaging/kubernetes/crds/{file_name} differs from the types; run `make crds` and commit"
        );
    }
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    expected_files.sort();
    assert_eq!(
        present, expected_files,
        "stale files in packaging/kubernetes/crds"
    );
}

#[test]
fn examples_parse_strictly_and_validate() {
    let dir = packaging().join("examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let kind = text
            .lines()
            .find_map(|l| l.strip_prefix("kind: "))
            .unwrap_or_else(|| panic!("{} has no kind", path.display()));
        let result = match kind.trim() {
            "NodeRelease" => object_from_yaml::<NodeRelease>(&text).map(|o| o.validate()),
            "NodeRollout" => object_from_yaml::<NodeRollout>(&text).map(|o| o.validate()),
            "NodeUpdatePlan" => object_from_yaml::<NodeUpdatePlan>(&text).map(|o| o.validate()),
            other => panic!("{}: unexpected kind {other}", path.display()),
        };
        match result {
            Ok(Ok(())) => seen += 1,
            Ok(Err(problems)) => panic!("{} is invalid: {problems}", path.display()),
            Err(e) => panic!("{} does not parse: {e}", path.display()),
        }
    }
    assert!(seen >= 3, "expected an example of each kind, found {seen}");
}

#[test]
fn troubleshooting_guide_lists_every_reason() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/troubleshooting.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let begin = text.find("<!-- reasons:begin -->\n").expect("begin marker")
        + "<!-- reasons:begin -->\n".len();
    let end = text.find("<!-- reasons:end -->").expect("end marker");
    assert!(
        text[begin..end] == inplace_proto::reason::markdown_table(),
        "docs/usage/troubleshooting.md's reason table is stale; run `make docs` and commit"
    );
}

#[test]
fn every_manifest_is_a_well_formed_kubernetes_object() {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&packaging(), &mut files);
    assert!(files.len() >= 10, "found only {} manifests", files.len());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if value.is_null() {
                continue;
            }
            for field in ["apiVersion", "kind"] {
                assert!(
                    value
                        .get(field)
                        .and_then(|v| v.as_str())
                        .is_some_and(|v| !v.is_empty()),
                    "{}: a document has no {field}",
                    file.display()
                );
            }
        }
    }
}

/// docs/design/api.md's "Status and conditions" names every status field each CRD has (it
/// left out the plan's `observedGeneration`).
#[test]
fn the_api_design_names_every_status_field() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/design/api.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let section = text
        .split("## Status and conditions")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Status and conditions section");
    for (_, crd) in inplace_proto::crd::all() {
        let kind = crd.spec.names.kind.trim_start_matches("Node");
        let kind = kind.strip_suffix("UpdatePlan").map_or(kind, |_| "Plan");
        let entry = section
            .split("\n- ")
            .find(|entry| entry.starts_with(&format!("{kind}:")))
            .unwrap_or_else(|| panic!("no `- {kind}:` entry in the section"));
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap();
        let status = &schema.properties.as_ref().unwrap()["status"];
        for field in status.properties.as_ref().unwrap().keys() {
            assert!(
                entry.contains(&format!("`{field}`")),
                "docs/design/api.md's {kind} status does not name `{field}`"
            );
        }
    }
}
