//! The commands docs/usage documents, read from the page itself so that a test runs them
//! as written: a page that changes changes what its test runs.

use std::path::Path;

use crate::{Error, Result};

/// The first ```` ```sh ```` block after the line `heading` (e.g. `## Installing with
/// Butane / Ignition`) in the Markdown file at `page`, without its fences.
pub fn shell_block(page: &Path, heading: &str) -> Result<String> {
    fenced_block(page, heading, "sh")
}

/// The first block fenced as ```` ```LANGUAGE ```` (`toml`, `ini`, `yaml`...) after the line
/// `heading` in the Markdown file at `page`, without its fences: a file a page shows, which
/// a test writes as shown.
pub fn fenced_block(page: &Path, heading: &str, language: &str) -> Result<String> {
    let text = std::fs::read_to_string(page).map_err(|source| Error::Io {
        context: format!("reading {}", page.display()),
        source,
    })?;
    let missing = || {
        Error::Invalid(format!(
            "{}: no ```{language} block after {heading:?}",
            page.display()
        ))
    };
    let fence = format!("```{language}");
    let mut lines = text.lines().skip_while(|l| l.trim_end() != heading);
    lines.next().ok_or_else(missing)?;
    let mut lines = lines.skip_while(|l| l.trim_end() != fence);
    lines.next().ok_or_else(missing)?;
    let mut block = String::new();
    for line in lines {
        if line.trim_end() == "```" {
            return Ok(block);
        }
        block.push_str(line);
        block.push('\n');
    }
    Err(missing())
}

/// `block` with the one line starting `name=` replaced by `name=value` (a documented
/// placeholder, such as a download address, that a test must point at its own server).
pub fn with_assignment(block: &str, name: &str, value: &str) -> Result<String> {
    let prefix = format!("{name}=");
    let count = block.lines().filter(|l| l.starts_with(&prefix)).count();
    if count != 1 {
        return Err(Error::Invalid(format!(
            "{count} lines assign {name} in {block:?}"
        )));
    }
    Ok(block
        .lines()
        .map(|l| {
            if l.starts_with(&prefix) {
                format!("{prefix}{value}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n")
}

/// Runs `script` (a documented block) with bash `-euo pipefail` in `dir`, in a person's shell
/// rather than the test runner's: without what cargo, nextest and make set for this process
/// (they would make a documented `make` look for a jobserver and its `cargo build` rebuild:
/// [`crate::workspace_build::cargo`]),
/// with `$INPLACE` set to the checkout and `envs` on top. Its standard output, or an error
/// with the script and both outputs.
pub fn run_as_a_person(
    script: &str,
    dir: &Path,
    envs: &[(&str, &std::ffi::OsStr)],
) -> Result<String> {
    let mut command = std::process::Command::new("bash");
    let output = crate::workspace_build::without_the_test_runners_env(&mut command)
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("INPLACE", crate::apiserver::repo_root())
        .envs(envs.iter().copied())
        .output()
        .map_err(|source| Error::Io {
            context: "running bash".into(),
            source,
        })?;
    if !output.status.success() {
        return Err(Error::Invalid(format!(
            "{script}failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_block_after_its_heading_and_replaces_one_assignment() {
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("p.md");
        std::fs::write(
            &page,
            "# A\n```sh\nno\n```\n## B\ntext\n```sh\nx=1\necho $x\n```\n",
        )
        .unwrap();
        let block = shell_block(&page, "## B").unwrap();
        assert_eq!(block, "x=1\necho $x\n");
        assert_eq!(with_assignment(&block, "x", "2").unwrap(), "x=2\necho $x\n");
        assert!(with_assignment(&block, "y", "2").is_err());
        assert!(shell_block(&page, "## C").is_err());
    }

    #[test]
    fn reads_a_block_of_another_language_and_skips_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("p.md");
        std::fs::write(&page, "## B\n```sh\nno\n```\n```toml\n[a]\nb = 1\n```\n").unwrap();
        assert_eq!(fenced_block(&page, "## B", "toml").unwrap(), "[a]\nb = 1\n");
        assert!(fenced_block(&page, "## B", "ini").is_err());
    }
}
