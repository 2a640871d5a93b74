//! The commands docs/usage documents, read from the page itself so that a test runs them
//! as written: a page that changes changes what its test runs.

use std::path::Path;

use crate::{Error, Result};

/// The first ```` ```sh ```` block after the line `heading` (e.g. `## Installing with
/// Butane / Ignition`) in the Markdown file at `page`, without its fences.
pub fn shell_block(page: &Path, heading: &str) -> Result<String> {
    let text = std::fs::read_to_string(page).map_err(|source| Error::Io {
        context: format!("reading {}", page.display()),
        source,
    })?;
    let missing = || {
        Error::Invalid(format!(
            "{}: no ```sh block after {heading:?}",
            page.display()
        ))
    };
    let mut lines = text.lines().skip_while(|l| l.trim_end() != heading);
    lines.next().ok_or_else(missing)?;
    let mut lines = lines.skip_while(|l| l.trim_end() != "```sh");
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
}
