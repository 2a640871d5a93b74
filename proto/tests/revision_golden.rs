//! A controller upgrade must never re-roll the fleet: a plan's revision is `revision_of`
//! its release's content, and a controller that computed another revision for the same
//! release would restage and reactivate every node. So the revisions of every example
//! release in the repository, and of a release with each field set, are pinned here: a
//! change of `revision_of`, of a field's name, of a default that serializes, or of the
//! order the hash sees must fail this test. Changing a pinned value is only right together
//! with a migration that keeps existing plans' revisions (and its test).
// A missing or unreadable example should fail the test loudly.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use inplace_proto::{NodeRelease, revision_of};
use inplace_strict_yaml::object_from_yaml;
use kube::CustomResourceExt;
use serde_json::Value;

/// (where, release name) → revision, as computed when each example was written.
const PINNED: &[(&str, &str, &str)] = &[
    (
        "packaging/kubernetes/examples/noderelease.yaml",
        "kubernetes-v1.31.2",
        "a94e32a9b09c",
    ),
    (
        "docs/usage/standalone-rollouts.md",
        "kubernetes-v1.31.2",
        "c12d0dd10e88",
    ),
    (
        "docs/usage/standalone-rollouts.md",
        "kubernetes-v1.31.2-multiarch",
        "638d386923cc",
    ),
    (
        "docs/usage/cluster-api.md",
        "kubernetes-v1.31.2",
        "7a343a180f93",
    ),
    ("docs/usage/agent-updates.md", "agent-0.4.0", "bb42af4f9c11"),
    (
        "proto/tests/revision_golden/every_field.yaml",
        "every-field",
        "e699ae981ce1",
    ),
    (
        "proto/tests/revision_golden/agent_every_field.yaml",
        "agent-every-field",
        "bb42af4f9c11",
    ),
];

/// The files searched for example releases (`kind: NodeRelease`).
const EXAMPLE_DIRS: &[&str] = &[
    "packaging/kubernetes/examples",
    "docs",
    "proto/tests/revision_golden",
];

/// The values the documented shell commands fill into a templated example
/// (docs/usage/agent-updates.md), as the shell would with these settings.
const SHELL_VALUES: &[(&str, &str)] = &[
    (
        r#""$(sha256sum "$image" | cut -d' ' -f1)""#,
        "0c3d4f1b8e2a9d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29180f1e2d3c4b5a6978",
    ),
    (r#"$(stat -c %s "$image")"#, "12582912"),
    ("$base_url", "https://dl.example/agent"),
    ("$image", "inplace-agent-0.4.0-x86-64.raw"),
    ("$version", "0.4.0"),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| e == "md" || e == "yaml" || e == "yml")
        {
            out.push(path);
        }
    }
}

/// Each NodeRelease object written out in `text`: from its `apiVersion` line to the end of
/// its YAML document, its heredoc (`EOF`) or its code block, shell values filled in.
fn releases_in(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (start, pair) in lines.windows(2).enumerate() {
        if pair[0] != "apiVersion: inplace.dev/v1alpha1" || pair[1] != "kind: NodeRelease" {
            continue;
        }
        let end = lines[start..]
            .iter()
            .position(|l| matches!(*l, "EOF" | "```" | "---"))
            .map_or(lines.len(), |n| start + n);
        let mut object = lines[start..end].join("\n");
        for (shell, value) in SHELL_VALUES {
            object = object.replace(shell, value);
        }
        found.push(object);
    }
    found
}

/// Every example release in the repository: (file, name) → revision.
fn example_revisions() -> BTreeMap<(String, String), String> {
    let mut files = Vec::new();
    for dir in EXAMPLE_DIRS {
        files_under(&repo().join(dir), &mut files);
    }
    let mut revisions = BTreeMap::new();
    for file in files {
        let where_ = file.strip_prefix(repo()).unwrap().display().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        for object in releases_in(&text) {
            let release: NodeRelease = object_from_yaml(&object).unwrap_or_else(|e| {
                panic!("an example release in {where_} does not parse: {e}\n{object}")
            });
            let name = release.metadata.name.clone().unwrap();
            revisions.insert((where_.clone(), name), revision_of(&release.spec.content));
        }
    }
    revisions
}

#[test]
fn every_example_release_keeps_its_revision() {
    let found = example_revisions();
    let pinned: BTreeMap<(String, String), String> = PINNED
        .iter()
        .map(|(file, name, revision)| {
            (
                ((*file).to_owned(), (*name).to_owned()),
                (*revision).to_owned(),
            )
        })
        .collect();
    assert_eq!(
        found.keys().collect::<Vec<_>>(),
        pinned.keys().collect::<Vec<_>>(),
        "the example releases changed: pin the revision of each new one in PINNED"
    );
    for (key, revision) in &found {
        assert_eq!(
            revision, &pinned[key],
            "the revision of {key:?} changed: every plan of that release would be restaged on a controller upgrade"
        );
    }
}

/// Every field path of the release spec's schema (`artifacts[].size`, ...), so that a new
/// field fails [`the_every_field_releases_set_every_field`] until it is set there, and its
/// revision is pinned with it.
fn schema_fields(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in properties {
            let path = format!("{prefix}{name}");
            out.insert(path.clone());
            schema_fields(child, &format!("{path}."), out);
        }
    }
    if let Some(items) = schema.get("items") {
        schema_fields(items, &format!("{}[].", prefix.trim_end_matches('.')), out);
    }
}

fn set_fields(value: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (name, child) in map {
                let path = format!("{prefix}{name}");
                out.insert(path.clone());
                set_fields(child, &format!("{path}."), out);
            }
        }
        Value::Array(items) => {
            for item in items {
                set_fields(item, &format!("{}[].", prefix.trim_end_matches('.')), out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_every_field_releases_set_every_field() {
    let crd = serde_json::to_value(NodeRelease::crd()).unwrap();
    let spec_schema =
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut schema = BTreeSet::new();
    schema_fields(spec_schema, "", &mut schema);
    let mut set = BTreeSet::new();
    for file in ["every_field.yaml", "agent_every_field.yaml"] {
        let path = repo().join("proto/tests/revision_golden").join(file);
        let text = std::fs::read_to_string(path).unwrap();
        let object: Value = serde_yaml::from_str(&text).unwrap();
        set_fields(&object["spec"], "", &mut set);
    }
    let missing: Vec<&String> = schema.difference(&set).collect();
    assert!(
        missing.is_empty(),
        "fields no pinned release sets: {missing:?}; set them in proto/tests/revision_golden and pin the revision"
    );
}
