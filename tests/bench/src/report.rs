//! Rows, the table, and docs/benchmarks.md.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::Opts;

/// One measured figure.
#[derive(Debug, Clone)]
pub struct Row {
    /// The section: `download`, `footprint`, `swap`, `fleet`, `plan`, `real node`.
    pub section: &'static str,
    /// What was measured.
    pub name: String,
    /// The measured value, formatted.
    pub value: String,
    /// Its unit.
    pub unit: String,
    /// The target it is held against (empty when it is a reference figure).
    pub target: String,
    /// `ok`, `MISSED`, or `ref` for a reference (a limit or a peer).
    pub verdict: String,
    /// A command reproducing the figure with public tools.
    pub reproduce: String,
}

impl Row {
    /// A reference row (a limit or a peer), no target.
    pub fn reference(
        section: &'static str,
        name: impl Into<String>,
        value: impl Into<String>,
        unit: impl Into<String>,
        reproduce: impl Into<String>,
    ) -> Self {
        Row {
            section,
            name: name.into(),
            value: value.into(),
            unit: unit.into(),
            target: String::new(),
            verdict: "ref".into(),
            reproduce: reproduce.into(),
        }
    }

    /// A row held against a target.
    pub fn target(mut self, target: impl Into<String>, met: bool) -> Self {
        self.target = target.into();
        self.verdict = if met { "ok" } else { "MISSED" }.into();
        self
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The table as markdown.
pub fn markdown_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| # | measurement | value | unit | target | verdict | reproduce |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | `{}` |",
            r.section,
            cell(&r.name),
            cell(&r.value),
            cell(&r.unit),
            cell(&r.target),
            r.verdict,
            r.reproduce.replace('|', "\\|").replace('`', "'"),
        );
    }
    out
}

/// Prints the table (markdown, readable in a terminal).
pub fn print_table(rows: &[Row]) {
    println!("{}", markdown_table(rows));
}

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `p` relative to the repository root unless absolute.
pub fn repo_path(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        repo_root().join(p)
    }
}

/// Writes docs/benchmarks.md: machine, options, the table, notes.
pub fn write_markdown(
    out: &Path,
    opts: &Opts,
    rows: &[Row],
    notes: &[String],
    load_before: &str,
) -> Result<()> {
    let mut doc = String::new();
    doc.push_str("# Benchmarks\n\n");
    doc.push_str(
        "Written by `make bench` (`scripts/bench.sh` → `inplace-bench all`). Not a timed test: \
         CI does not gate on it. Every figure below comes from the run described here; each \
         row names a command that reproduces it with public tools.\n\n",
    );
    doc.push_str("## Machine\n\n");
    doc.push_str(&crate::machine::describe());
    let _ = writeln!(doc, "- load average before the run: {load_before}");
    let _ = writeln!(
        doc,
        "- load average after the run: {}",
        crate::machine::load_average()
    );
    let _ = writeln!(
        doc,
        "- options: artifact {} MiB, {} repetitions (medians), idle sampling {} s, fleet {} nodes{}{}\n",
        opts.size_mib,
        opts.reps,
        opts.idle_seconds,
        opts.fleet_nodes
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" and "),
        if opts.quick { ", --quick" } else { "" },
        if opts.drop_caches {
            ", page cache dropped before each download run"
        } else {
            ""
        }
    );
    doc.push_str("## Results\n\n");
    doc.push_str(&markdown_table(rows));
    doc.push_str("\n## Notes\n\n");
    doc.push_str(include_str!("notes.md"));
    for n in notes {
        let _ = writeln!(doc, "- {n}");
    }
    std::fs::write(out, doc).with_context(|| format!("writing {}", out.display()))
}
