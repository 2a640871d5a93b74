//! Atomic file-system updates: a new name is created beside the old one, flushed, renamed
//! over it, and the directory flushed, so after a power loss the path holds the old or the
//! new version, both complete. Blocking; call through `spawn_blocking`.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::owner::Owner;

/// Flushes a directory, making renames and new names in it durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn parent(path: &Path) -> io::Result<&Path> {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no directory"))
}

/// A sibling name for building the new version; dot-prefixed so globs skip it.
fn temp_sibling(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    Ok(parent(path)?.join(format!(".{}.inplace-new", name.to_string_lossy())))
}

/// Points `link` at `target` atomically: symlink under a temporary name, rename over
/// `link`, flush the directory. Creates the directory when missing.
pub fn swap_symlink(link: &Path, target: &Path) -> io::Result<()> {
    let dir = parent(link)?;
    fs::create_dir_all(dir)?;
    let temp = temp_sibling(link)?;
    match fs::remove_file(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    symlink(target, &temp)?;
    fs::rename(&temp, link)?;
    fsync_dir(dir)
}

/// The file-system steps a durable replacement is made of, so a test can record their
/// order (a missing fsync loses nothing until the power fails, so only the order shows it).
pub trait DurableOps: Send + Sync {
    /// Creates or truncates `path` and writes `bytes` to it.
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Flushes `path`'s data and metadata to the disk.
    fn fsync_file(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` over `to` (atomic on one file system).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Flushes `dir`, making a rename in it durable.
    fn fsync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The real file system, through plain `std::fs`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdFs;

impl DurableOps for StdFs {
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        File::create(path)?.write_all(bytes)
    }

    fn fsync_file(&self, path: &Path) -> io::Result<()> {
        // fsync flushes the file's dirty pages whichever descriptor asks.
        File::open(path)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn fsync_dir(&self, dir: &Path) -> io::Result<()> {
        fsync_dir(dir)
    }
}

/// Writes `bytes` to `path` atomically (temp + fsync + rename + fsync dir).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomically_with(&StdFs, path, bytes)
}

/// [`write_atomically`] through `ops`: the content is on disk before the rename makes it
/// the file (or a power loss could leave the new name on empty data), and the rename is on
/// disk before this returns (or the old version could come back).
pub fn write_atomically_with(ops: &dyn DurableOps, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = parent(path)?;
    fs::create_dir_all(dir)?;
    let temp = temp_sibling(path)?;
    ops.write(&temp, bytes)?;
    ops.fsync_file(&temp)?;
    ops.rename(&temp, path)?;
    ops.fsync_dir(dir)
}

/// Removes `path` (a link or file) durably; absent is fine.
pub fn remove_durably(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => fsync_dir(parent(path)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// What a managed path held before the agent changed it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Prior {
    /// Nothing was there.
    Absent,
    /// A symlink to this target.
    Symlink {
        /// The link's target, as read.
        target: PathBuf,
    },
    /// A regular file, saved at `backup` (in the agent's state directory) before the swap.
    File {
        /// Where the agent kept a copy.
        backup: PathBuf,
        /// The file's owner: a copy (where the file could not be hard-linked) is the
        /// agent's, and the owner is given back through PID 1 after a restore. Absent in
        /// journals written before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<Owner>,
    },
    /// A directory (what a Config tree replaces), copied to `backup` before the swap.
    Directory {
        /// Where the agent kept a copy of the tree.
        backup: PathBuf,
    },
}

/// Reads what `path` is now. A regular file is copied to `backup_dir` (hard link when on
/// the same file system) so it can be restored.
pub fn capture_prior(path: &Path, backup_dir: &Path) -> io::Result<Prior> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Prior::Absent),
        Err(e) => Err(e),
        Ok(meta) if meta.file_type().is_symlink() => Ok(Prior::Symlink {
            target: fs::read_link(path)?,
        }),
        Ok(meta) if meta.is_file() => {
            fs::create_dir_all(backup_dir)?;
            let backup = backup_dir.join(backup_name(path));
            let _ = fs::remove_file(&backup);
            if fs::hard_link(path, &backup).is_err() {
                fs::copy(path, &backup)?;
                File::open(&backup)?.sync_all()?;
            }
            fsync_dir(backup_dir)?;
            Ok(Prior::File {
                backup,
                owner: Some(Owner {
                    uid: meta.uid(),
                    gid: meta.gid(),
                }),
            })
        }
        Ok(meta) if meta.is_dir() => {
            fs::create_dir_all(backup_dir)?;
            let backup = backup_dir.join(backup_name(path));
            remove_any(&backup)?;
            copy_tree(path, &backup)?;
            fsync_dir(backup_dir)?;
            Ok(Prior::Directory { backup })
        }
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is neither a file, a directory nor a symlink",
                path.display()
            ),
        )),
    }
}

/// Copies the tree at `from` to the new directory `to`: directories with their mode, files
/// as hard links where the file system allows (else copies, flushed), symlinks as they are.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir(to)?;
    fs::set_permissions(to, fs::metadata(from)?.permissions())?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let (source, copy) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&source, &copy)?;
        } else if kind.is_symlink() {
            symlink(fs::read_link(&source)?, &copy)?;
        } else if fs::hard_link(&source, &copy).is_err() {
            fs::copy(&source, &copy)?;
            File::open(&copy)?.sync_all()?;
        }
    }
    fsync_dir(to)
}

/// Removes whatever is at `path` (a tree too); absent is fine.
fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// One file name per managed path, distinct for distinct paths: `%` and `/` are escaped
/// (`%25`, `%2F`), so `/opt/bin/a_b`, `/opt/bin/a/b` and `/opt/bin/a%2Fb` never share a
/// backup. (Replacing `/` with `_` did: a rollback restored one file's content into the other.)
fn backup_name(path: &Path) -> String {
    let path = path.to_string_lossy();
    let mut name = String::with_capacity(path.len());
    for c in path.trim_start_matches('/').chars() {
        match c {
            '%' => name.push_str("%25"),
            '/' => name.push_str("%2F"),
            c => name.push(c),
        }
    }
    name
}

/// Puts `path` back to what it was, atomically.
pub fn restore_prior(path: &Path, prior: &Prior) -> io::Result<()> {
    match prior {
        Prior::Absent => remove_durably(path),
        Prior::Symlink { target } => swap_symlink(path, target),
        Prior::File { backup, .. } => {
            let temp = temp_sibling(path)?;
            let _ = fs::remove_file(&temp);
            if fs::hard_link(backup, &temp).is_err() {
                fs::copy(backup, &temp)?;
                File::open(&temp)?.sync_all()?;
            }
            fs::rename(&temp, path)?;
            fsync_dir(parent(path)?)
        }
        Prior::Directory { backup } => {
            let temp = temp_sibling(path)?;
            remove_any(&temp)?;
            copy_tree(backup, &temp)?;
            put_in_place(&temp, path)?;
            fsync_dir(parent(path)?)
        }
    }
}

/// The owner `prior` recorded for the file now restored at `path`, when that file has
/// another one: the agent's copy of a file it could not hard-link (another user's, or
/// across file systems), which only PID 1 may give back its owner.
pub fn owner_to_give_back(path: &Path, prior: &Prior) -> io::Result<Option<Owner>> {
    let Prior::File {
        owner: Some(owner), ..
    } = prior
    else {
        return Ok(None);
    };
    let meta = fs::symlink_metadata(path)?;
    Ok((meta.uid() != owner.uid || meta.gid() != owner.gid).then_some(*owner))
}

/// Renames the directory `temp` to `path`; when something is at `path` (the link to a
/// tree), the two are exchanged atomically and that is removed from `temp`.
fn put_in_place(temp: &Path, path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path).is_err() {
        return fs::rename(temp, path);
    }
    nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        temp,
        nix::fcntl::AT_FDCWD,
        path,
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    )
    .map_err(io::Error::from)?;
    remove_any(temp)
}

/// Whether `link` is a symlink pointing exactly at `target`.
pub fn points_at(link: &Path, target: &Path) -> bool {
    fs::read_link(link).is_ok_and(|t| t == target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_kept_exchanged_for_a_link_and_restored() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("etc/kubelet.conf.d");
        fs::create_dir_all(conf.join("sub")).unwrap();
        fs::write(conf.join("50-pods.conf"), b"maxPods: 110").unwrap();
        fs::set_permissions(conf.join("50-pods.conf"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::write(conf.join("sub/x"), b"x").unwrap();
        let tree = dir.path().join("store/tree");
        fs::create_dir_all(&tree).unwrap();
        let prior = capture_prior(&conf, &dir.path().join("backup")).unwrap();
        assert!(matches!(prior, Prior::Directory { .. }), "{prior:?}");

        crate::beneath::swap_symlink(dir.path(), &conf, &tree).unwrap();
        assert!(points_at(&conf, &tree));
        let names: Vec<_> = fs::read_dir(dir.path().join("etc"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["kubelet.conf.d"], "the old tree is gone");

        restore_prior(&conf, &prior).unwrap();
        assert!(fs::symlink_metadata(&conf).unwrap().is_dir());
        assert_eq!(
            fs::read(conf.join("50-pods.conf")).unwrap(),
            b"maxPods: 110"
        );
        assert_eq!(fs::read(conf.join("sub/x")).unwrap(), b"x");
        let mode = fs::metadata(conf.join("50-pods.conf"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        assert!(
            tree.is_dir(),
            "the stored tree stays for the store to collect"
        );
        let names: Vec<_> = fs::read_dir(dir.path().join("etc"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["kubelet.conf.d"], "no temporary name left");
    }

    #[test]
    fn swap_replaces_link_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("ext/kubernetes.raw");
        swap_symlink(&link, Path::new("/opt/a")).unwrap();
        assert!(points_at(&link, Path::new("/opt/a")));
        swap_symlink(&link, Path::new("/opt/b")).unwrap();
        assert!(points_at(&link, Path::new("/opt/b")));
        let names: Vec<_> = fs::read_dir(dir.path().join("ext"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["kubernetes.raw"]);
    }

    #[test]
    fn stale_temp_from_a_crash_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("k.raw");
        symlink("/garbage", dir.path().join(".k.raw.inplace-new")).unwrap();
        swap_symlink(&link, Path::new("/opt/new")).unwrap();
        assert!(points_at(&link, Path::new("/opt/new")));
    }

    #[test]
    fn write_atomically_replaces_content() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j.json");
        write_atomically(&p, b"one").unwrap();
        write_atomically(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn capture_and_restore_each_kind() {
        let dir = tempfile::tempdir().unwrap();
        let backups = dir.path().join("backup");
        let bin = dir.path().join("bin");
        fs::create_dir(&bin).unwrap();

        let absent = bin.join("absent");
        let prior = capture_prior(&absent, &backups).unwrap();
        assert_eq!(prior, Prior::Absent);
        swap_symlink(&absent, Path::new("/x")).unwrap();
        restore_prior(&absent, &prior).unwrap();
        assert!(fs::symlink_metadata(&absent).is_err());

        let link = bin.join("link");
        symlink("/old", &link).unwrap();
        let prior = capture_prior(&link, &backups).unwrap();
        swap_symlink(&link, Path::new("/new")).unwrap();
        restore_prior(&link, &prior).unwrap();
        assert!(points_at(&link, Path::new("/old")));

        let file = bin.join("file");
        fs::write(&file, b"original").unwrap();
        let prior = capture_prior(&file, &backups).unwrap();
        assert!(matches!(prior, Prior::File { .. }));
        swap_symlink(&file, Path::new("/new")).unwrap();
        restore_prior(&file, &prior).unwrap();
        assert!(
            !fs::symlink_metadata(&file)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(&file).unwrap(), b"original");
    }

    #[test]
    fn paths_that_differ_only_by_slash_or_underscore_keep_their_own_backups() {
        let dir = tempfile::tempdir().unwrap();
        let backups = dir.path().join("backup");
        let flat = dir.path().join("bin/a_b");
        let nested = dir.path().join("bin/a/b");
        let escaped = dir.path().join("bin/a%2Fb");
        fs::create_dir_all(nested.parent().unwrap()).unwrap();
        let paths = [&flat, &nested, &escaped];
        let mut priors = Vec::new();
        for path in paths {
            fs::write(path, path.to_string_lossy().as_bytes()).unwrap();
            priors.push(capture_prior(path, &backups).unwrap());
        }
        for (path, prior) in paths.iter().zip(&priors) {
            swap_symlink(path, Path::new("/new")).unwrap();
            restore_prior(path, prior).unwrap();
        }
        for path in paths {
            assert_eq!(fs::read(path).unwrap(), path.to_string_lossy().as_bytes());
        }
    }
}
