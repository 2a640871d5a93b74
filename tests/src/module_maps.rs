//! The module maps in the docs (docs/development/agent.md § Module map, docs/design/
//! controller.md's code map) checked against the source tree, so that they stay true: every
//! `.rs` file or directory a map names in backticks exists, and every source file is named
//! (a directory's `mod.rs` by the directory). Test files (`tests.rs`, anything under a
//! `tests/` directory) need not be named.

use std::collections::BTreeSet;
use std::path::Path;

/// The part of `doc` from the line that starts with `start` to the next `## ` heading.
pub fn section<'a>(doc: &'a str, start: &str) -> Option<&'a str> {
    let from = doc.lines().position(|line| line.starts_with(start))?;
    let offset: usize = doc.lines().take(from).map(|l| l.len() + 1).sum();
    let rest = &doc[offset..];
    let first_line = rest.find('\n').map_or(rest.len(), |i| i + 1);
    let end = rest[first_line..]
        .find("\n## ")
        .map_or(rest.len(), |i| first_line + i + 1);
    Some(&rest[..end])
}

/// What is wrong with `map` as a map of the sources under `src`, one line each.
pub fn problems(map: &str, src: &Path) -> Vec<String> {
    let named = named_paths(map);
    let mut problems: Vec<String> = named
        .iter()
        .filter(|name| !src.join(name.trim_end_matches('/')).exists())
        .map(|name| format!("`{name}` is named but {} has no such file", src.display()))
        .collect();
    for file in source_files(src, Path::new("")) {
        let directory = file.strip_suffix("mod.rs");
        if !named.contains(&file) && !directory.is_some_and(|d| named.contains(d)) {
            problems.push(format!("{file} is not named in the map"));
        }
    }
    problems
}

/// Every backticked `path.rs` or `directory/` of this crate's in `map`.
fn named_paths(map: &str) -> BTreeSet<String> {
    map.split('`')
        .skip(1)
        .step_by(2)
        .filter(|token| token.ends_with(".rs") || token.ends_with('/'))
        // A path from the repository's root (`proto/src/reason.rs`) is another crate's.
        .filter(|token| !token.contains("src/"))
        .filter(|token| {
            token
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_./".contains(c))
        })
        .map(str::to_owned)
        .collect()
}

/// The non-test `.rs` files under `src/relative`, as paths relative to `src`.
fn source_files(src: &Path, relative: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(src.join(relative)) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = relative.join(&name);
        if entry.path().is_dir() {
            if name != "tests" {
                files.extend(source_files(src, &path));
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            files.push(path.to_string_lossy().into_owned());
        }
    }
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::repo_root;

    fn check(doc: &str, start: &str, src: &str) {
        let root = repo_root();
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let map = section(&text, start).unwrap_or_else(|| panic!("{doc}: no {start:?}"));
        let problems = problems(map, &root.join(src));
        assert!(problems.is_empty(), "{doc}:\n{}", problems.join("\n"));
    }

    #[test]
    fn the_agent_module_map_names_every_source_file_and_nothing_else() {
        check(
            "docs/development/agent.md",
            "## Module map (`agent/src`)",
            "agent/src",
        );
    }

    #[test]
    fn the_controller_code_map_names_every_source_file_and_nothing_else() {
        check(
            "docs/design/controller.md",
            "Code map (`controller/src/`):",
            "controller/src",
        );
    }

    #[test]
    fn a_missing_file_and_an_unnamed_one_are_both_reported() {
        let src = tempfile::tempdir().unwrap();
        for file in [
            "lib.rs",
            "a.rs",
            "b/mod.rs",
            "b/c.rs",
            "b/tests.rs",
            "d/tests/e.rs",
        ] {
            let path = src.path().join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        let doc = "intro `gone.rs`\n## Map\n| `lib.rs` | `b/` and `b/c.rs` |\n| `gone.rs` | `sh` |\n## Next\n`a.rs`\n";
        let map = section(doc, "## Map").unwrap();
        assert!(!map.contains("Next") && map.contains("`gone.rs`"), "{map}");
        assert_eq!(
            problems(map, src.path()),
            [
                format!(
                    "`gone.rs` is named but {} has no such file",
                    src.path().display()
                ),
                "a.rs is not named in the map".to_owned(),
            ]
        );
    }
}
