//! systemd-sysupdate on the same node. Flatcar's sysext-bakery ships transfer files that
//! make `systemd-sysupdate` download extension images into `/opt/extensions/<name>/`, prune
//! old ones (`InstancesMax=`) and point `/etc/extensions/<name>.raw` at the newest
//! (`CurrentSymlink=`). Two updaters on one link undo each other's swaps and delete each
//! other's images, so a plan whose system extension a transfer also manages is refused
//! before anything is touched (docs/usage/flatcar.md, "systemd-sysupdate on the node").

use std::path::{Path, PathBuf};

use inplace_proto::validate::FieldError;
use inplace_proto::{ArtifactType, Reason, UpdateContent};

use crate::settings::Paths;
use crate::store;

/// Where systemd-sysupdate reads transfer files, below the host's root: the default set
/// (`sysupdate.d`) and each component's (`sysupdate.<component>.d`, `-C <component>`).
const SEARCH_DIRS: [&str; 4] = ["etc", "run", "usr/local/lib", "usr/lib"];

/// What one transfer file writes to: its `[Target]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// The transfer file.
    pub file: PathBuf,
    /// `Path=`: the directory its images go to.
    pub target_dir: Option<PathBuf>,
    /// `CurrentSymlink=`, made absolute: the link it points at the newest image.
    pub current_symlink: Option<PathBuf>,
}

/// Every transfer file below `root` (`*.transfer`, and `*.conf` as sysext-bakery and
/// systemd before 257 name them), in a stable order. Unreadable files and directories are
/// skipped: the check is a guard against a known conflict, not a parser of record.
pub fn transfers(root: &Path) -> Vec<Transfer> {
    let mut files = Vec::new();
    for base in SEARCH_DIRS {
        let Ok(entries) = std::fs::read_dir(root.join(base)) else {
            continue;
        };
        for dir in entries.flatten().map(|e| e.path()) {
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name == "sysupdate.d" || (name.starts_with("sysupdate.") && name.ends_with(".d")) {
                let Ok(inner) = std::fs::read_dir(&dir) else {
                    continue;
                };
                files.extend(inner.flatten().map(|e| e.path()).filter(|p| {
                    p.extension()
                        .is_some_and(|ext| ext == "transfer" || ext == "conf")
                }));
            }
        }
    }
    files.sort();
    files
        .into_iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(&file).ok()?;
            Some(parse(file, &text))
        })
        .collect()
}

/// The `[Target]` section of a transfer file's `text`.
fn parse(file: PathBuf, text: &str) -> Transfer {
    let mut section = "";
    let (mut target_dir, mut symlink) = (None, None);
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name;
            continue;
        }
        if section != "Target" || line.starts_with(['#', ';']) {
            continue;
        }
        match line.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
            Some(("Path", v)) if !v.is_empty() => target_dir = Some(PathBuf::from(v)),
            Some(("CurrentSymlink", v)) if !v.is_empty() => symlink = Some(PathBuf::from(v)),
            _ => {}
        }
    }
    // A relative CurrentSymlink= is relative to the target directory.
    let current_symlink = match (symlink, &target_dir) {
        (Some(link), Some(dir)) if link.is_relative() => Some(dir.join(link)),
        (link, _) => link,
    };
    Transfer {
        file,
        target_dir,
        current_symlink,
    }
}

/// The plan's system extensions that a transfer also manages: each one's link or image
/// directory, as a `PolicyDenied` problem naming the artifact, the transfer file and what
/// to do.
pub fn conflicts(
    content: &UpdateContent,
    paths: &Paths,
    transfers: &[Transfer],
) -> Vec<FieldError> {
    let mut problems = Vec::new();
    for (i, artifact) in content.artifacts.iter().enumerate() {
        if artifact.kind != ArtifactType::Sysext {
            continue;
        }
        let link = store::sysext_link(paths, &artifact.name);
        let dir = store::sysext_dir(paths, &artifact.name);
        for transfer in transfers {
            let what = if transfer.current_symlink.as_deref() == Some(link.as_path()) {
                format!("its CurrentSymlink= is {}", link.display())
            } else if transfer.target_dir.as_deref() == Some(dir.as_path()) {
                format!("it keeps its images in {}", dir.display())
            } else {
                continue;
            };
            problems.push(FieldError {
                path: format!("spec.artifacts[{i}]"),
                reason: Reason::PolicyDenied,
                message: format!(
                    "system extension {} is also updated by systemd-sysupdate ({what}: {}); \
                     two updaters would undo each other's swaps, so nothing was changed. \
                     Remove that transfer file (and stop systemd-sysupdate.timer if nothing \
                     else uses it) to let inplace update it, or leave it to sysupdate",
                    artifact.name,
                    transfer.file.display()
                ),
            });
        }
    }
    problems
}

#[cfg(test)]
mod tests;
