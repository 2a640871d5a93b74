//! Where files live on the node, and the blocking file operations on them.
//!
//! - Sysext images: `<images_dir>/<name>/<file-name-from-url>` (Flatcar's
//!   `/opt/extensions/<name>/...`), linked as `<extensions_dir>/<name>.raw`. When that file
//!   name is taken by different bytes (the same URL name re-published), the image is stored
//!   as `<digest[..16]>-<file>` instead, so a file a link points at is never overwritten.
//! - Binary files and archive members: `<state>/store/sha256/<digest>`, mode 0755, in
//!   directories of mode 0711 (run by every user through their links, listed by none).
//! - Config files: `<state>/store/config/<digest>.<mode>.<uid>.<gid>`, with that mode and
//!   owner: one copy per mode and owner of the same bytes (a link's target carries them,
//!   and one file has one of each).
//! - Downloads in progress: dot-files ending in `.partial` in the target directory.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::links::fsync_dir;
use crate::owner::FileAttributes;
use crate::settings::{Paths, Settings};

/// The link that activates sysext `name`.
pub fn sysext_link(paths: &Paths, name: &str) -> PathBuf {
    paths.extensions_dir.join(format!("{name}.raw"))
}

/// The directory holding sysext `name`'s images.
pub fn sysext_dir(paths: &Paths, name: &str) -> PathBuf {
    paths.images_dir.join(name)
}

/// The content-addressed store.
pub fn cas_dir(settings: &Settings) -> PathBuf {
    settings.state_dir.join("store").join("sha256")
}

/// Where a Config file with `sha256`'s bytes and `attributes` is stored.
pub fn config_file(settings: &Settings, sha256: &str, attributes: FileAttributes) -> PathBuf {
    let FileAttributes { mode, uid, gid } = attributes;
    config_dir(settings).join(format!("{sha256}.{mode:04o}.{uid}.{gid}"))
}

/// The store's directory of Config files and trees.
fn config_dir(settings: &Settings) -> PathBuf {
    settings.state_dir.join("store").join("config")
}

/// Where a Config directory extracted from the archive `sha256` with `attributes` (its
/// owner: its files keep their own modes) is stored.
pub fn config_tree(settings: &Settings, sha256: &str, attributes: FileAttributes) -> PathBuf {
    let FileAttributes { uid, gid, .. } = attributes;
    config_dir(settings).join(format!("{sha256}.tree.{uid}.{gid}"))
}

/// Whether the Config file at `path` is there with `sha256`'s bytes and `mode`. (Its owner
/// is not seen: to the agent's user namespace every user but root is nobody. The name
/// says it, and a file gets its name only once it has its owner.) A file the agent may
/// not read (another user's, mode 0600) is not verified: it is stored again.
pub fn is_config_in_place(path: &Path, sha256: &str, mode: u32) -> bool {
    fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o7777 == mode)
        && is_verified(path, sha256)
}

/// Gives a verified download its permission bits and flushes it, before its owner (which
/// only PID 1 can change) and its place in the store.
pub fn set_config_mode(temp: &Path, mode: u32) -> io::Result<()> {
    fs::set_permissions(temp, fs::Permissions::from_mode(mode))?;
    fs::File::open(temp)?.sync_all()
}

/// Moves a Config file (or directory) that has its mode and owner to `target` in the store.
pub fn place_config(temp: &Path, target: &Path) -> io::Result<PathBuf> {
    let dir = target
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no store directory"))?;
    fs::create_dir_all(dir)?;
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        fs::set_permissions(d, fs::Permissions::from_mode(CAS_DIR_MODE))?;
    }
    fs::rename(temp, target)?;
    fsync_dir(dir)?;
    Ok(target.to_path_buf())
}

/// Temporary downloads and extractions for the state filesystem.
pub fn tmp_dir(settings: &Settings) -> PathBuf {
    settings.state_dir.join("tmp")
}

/// Copies of regular files replaced during activation of `revision`.
pub fn backup_dir(settings: &Settings, revision: &str) -> PathBuf {
    settings.state_dir.join("backup").join(revision)
}

/// Where systemd-sysext's merged tree shows that extension `name` is active.
pub fn extension_release(paths: &Paths, name: &str) -> PathBuf {
    paths
        .merged_root
        .join("usr/lib/extension-release.d")
        .join(format!("extension-release.{name}"))
}

/// Where a merged configuration extension's release file is (`/etc/extension-release.d`).
pub fn confext_release(paths: &Paths, name: &str) -> PathBuf {
    paths
        .merged_root
        .join("etc/extension-release.d")
        .join(format!("extension-release.{name}"))
}

/// The sha256 of a file, lowercase hex.
pub fn hash_file(path: &Path) -> io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Whether `path` exists and hashes to `sha256`.
pub fn is_verified(path: &Path, sha256: &str) -> bool {
    hash_file(path).is_ok_and(|h| h == sha256)
}

/// Whether a staged `target` still holds what was staged: a file, `sha256`'s bytes. A Config
/// directory, and a Config file the agent may not read (another user's, mode 0600), are
/// taken as stored: each got its name in the store only once complete.
pub fn still_staged(target: &Path, sha256: &str) -> bool {
    match fs::File::open(target) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => target.exists(),
        Ok(file) if file.metadata().is_ok_and(|m| m.is_dir()) => true,
        _ => is_verified(target, sha256),
    }
}

/// Where an already-verified copy of a sysext image is, if any.
pub fn find_sysext(dir: &Path, file: &str, sha256: &str) -> Option<PathBuf> {
    [dir.join(file), dir.join(alt_name(file, sha256))]
        .into_iter()
        .find(|p| is_verified(p, sha256))
}

fn alt_name(file: &str, sha256: &str) -> String {
    format!("{}-{file}", &sha256[..16.min(sha256.len())])
}

/// Moves a verified download into place as a sysext image and returns its final path.
pub fn place_sysext(temp: &Path, dir: &Path, file: &str, sha256: &str) -> io::Result<PathBuf> {
    if let Some(existing) = find_sysext(dir, file, sha256) {
        fs::remove_file(temp)?;
        return Ok(existing);
    }
    let plain = dir.join(file);
    let target = if fs::symlink_metadata(&plain).is_ok() {
        dir.join(alt_name(file, sha256))
    } else {
        plain
    };
    fs::set_permissions(temp, fs::Permissions::from_mode(0o644))?;
    fs::rename(temp, &target)?;
    fsync_dir(dir)?;
    Ok(target)
}

/// The store's directories: other users may reach a file by name (the links in
/// `/opt/bin` name them), never list them. Set whatever the umask (the unit's is 0077).
const CAS_DIR_MODE: u32 = 0o711;

/// Moves a verified file into the content-addressed store (mode 0755) and returns its path.
pub fn place_cas(temp: &Path, cas: &Path, sha256: &str) -> io::Result<PathBuf> {
    fs::create_dir_all(cas)?;
    for dir in [Some(cas), cas.parent()].into_iter().flatten() {
        fs::set_permissions(dir, fs::Permissions::from_mode(CAS_DIR_MODE))?;
    }
    let target = cas.join(sha256);
    if is_verified(&target, sha256) {
        fs::remove_file(temp)?;
        return Ok(target);
    }
    fs::set_permissions(temp, fs::Permissions::from_mode(0o755))?;
    fs::rename(temp, &target)?;
    fsync_dir(cas)?;
    Ok(target)
}

/// Takes from other users what an agent of an older unit (state directory 0700, umask
/// 0022) left them once the directory became 0711: the journal (it holds the plan's
/// URLs, which may carry a presigned token), downloads in progress and backups become
/// the agent's own; the store stays reachable, not listable. Top level only: a 0700
/// directory hides what is below it.
pub fn restrict_state(state_dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(state_dir)? {
        let entry = entry?;
        let path = entry.path();
        let meta = fs::symlink_metadata(&path)?;
        let mode = if entry.file_name() == "store" {
            for dir in [path.clone(), path.join("sha256"), path.join("config")] {
                if dir.is_dir() {
                    fs::set_permissions(&dir, fs::Permissions::from_mode(CAS_DIR_MODE))?;
                }
            }
            continue;
        } else if meta.is_dir() {
            0o700
        } else if meta.is_file() {
            0o600
        } else {
            continue;
        };
        if meta.permissions().mode() & 0o777 != mode {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        }
    }
    Ok(())
}

/// Removes each of `candidates` that is not in `keep`: files, and a Config tree's
/// directory with what it holds; errors are logged.
pub fn remove_unreferenced(candidates: &[PathBuf], keep: &HashSet<PathBuf>) {
    for path in candidates {
        if keep.contains(path) {
            continue;
        }
        let removed = match fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
            _ => fs::remove_file(path),
        };
        match removed {
            Ok(()) => tracing::info!(path = %path.display(), "removed unreferenced file"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove file"),
        }
    }
}

/// Removes leftover `.partial` downloads in `dirs` (from a crash or an abandoned staging),
/// except those named in `keep`.
pub fn remove_partials(dirs: &[PathBuf], keep: &std::collections::HashSet<String>) {
    for dir in dirs {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".partial") && !keep.contains(&*name) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// Whether an I/O error means the disk is full.
pub fn is_disk_full(e: &io::Error) -> bool {
    e.raw_os_error() == Some(nix::libc::ENOSPC) || e.kind() == io::ErrorKind::StorageFull
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    #[test]
    fn sysext_name_clash_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let images = dir.path().join("k");
        fs::create_dir(&images).unwrap();
        fs::write(images.join("k.raw"), b"old").unwrap();
        let temp = images.join(".k.partial");
        fs::write(&temp, b"new").unwrap();
        let placed = place_sysext(&temp, &images, "k.raw", &sha(b"new")).unwrap();
        assert_ne!(placed, images.join("k.raw"));
        assert_eq!(fs::read(images.join("k.raw")).unwrap(), b"old");
        assert_eq!(fs::read(&placed).unwrap(), b"new");
        assert_eq!(find_sysext(&images, "k.raw", &sha(b"new")), Some(placed));
        assert_eq!(
            find_sysext(&images, "k.raw", &sha(b"old")),
            Some(images.join("k.raw"))
        );
    }

    #[test]
    fn cas_is_idempotent_and_executable() {
        let dir = tempfile::tempdir().unwrap();
        let cas = dir.path().join("cas");
        for _ in 0..2 {
            let temp = dir.path().join("t");
            fs::write(&temp, b"bin").unwrap();
            let placed = place_cas(&temp, &cas, &sha(b"bin")).unwrap();
            assert_eq!(placed, cas.join(sha(b"bin")));
            assert!(!temp.exists());
            let mode = fs::metadata(&placed).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o755);
            let mode = fs::metadata(&cas).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o711);
        }
    }

    #[test]
    fn state_an_older_unit_left_readable_becomes_the_agents_own() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path();
        let mode = |p: &str| fs::metadata(state.join(p)).unwrap().permissions().mode() & 0o777;
        fs::write(state.join("journal.json"), b"{}").unwrap();
        fs::create_dir_all(state.join("tmp")).unwrap();
        fs::create_dir_all(state.join("backup/r1")).unwrap();
        fs::create_dir_all(state.join("store/sha256")).unwrap();
        fs::create_dir_all(state.join("store/config")).unwrap();
        for p in [
            "journal.json",
            "tmp",
            "backup",
            "store",
            "store/sha256",
            "store/config",
        ] {
            let m = if p.ends_with("json") { 0o644 } else { 0o755 };
            fs::set_permissions(state.join(p), fs::Permissions::from_mode(m)).unwrap();
        }
        restrict_state(state).unwrap();
        assert_eq!(mode("journal.json"), 0o600);
        assert_eq!(mode("tmp"), 0o700);
        assert_eq!(mode("backup"), 0o700);
        assert_eq!(mode("store"), 0o711);
        assert_eq!(mode("store/sha256"), 0o711);
        assert_eq!(mode("store/config"), 0o711);
    }

    #[test]
    fn a_config_file_is_in_place_with_its_bytes_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("store/config/f");
        let temp = dir.path().join("t");
        fs::write(&temp, b"maxPods: 150").unwrap();
        set_config_mode(&temp, 0o640).unwrap();
        assert!(!is_config_in_place(&target, &sha(b"maxPods: 150"), 0o640));
        place_config(&temp, &target).unwrap();
        assert!(is_config_in_place(&target, &sha(b"maxPods: 150"), 0o640));
        assert!(!is_config_in_place(&target, &sha(b"maxPods: 150"), 0o644));
        assert!(!is_config_in_place(&target, &sha(b"maxPods: 110"), 0o640));
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(target.parent().unwrap()), 0o711);
        assert_eq!(mode(&dir.path().join("store")), 0o711);
    }

    #[test]
    fn partials_and_unreferenced_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".a.123.partial"), b"").unwrap();
        fs::write(dir.path().join("keep"), b"").unwrap();
        fs::write(dir.path().join("drop"), b"").unwrap();
        remove_partials(&[dir.path().to_path_buf()], &Default::default());
        let keep: HashSet<PathBuf> = [dir.path().join("keep")].into();
        remove_unreferenced(&[dir.path().join("keep"), dir.path().join("drop")], &keep);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["keep"]);
    }
}
