//! Directories below a target directory the node's policy allows, reached without
//! following a symlink. `allowed_target_dirs` says where a plan may put links; a symlink
//! inside one (`/opt/bin/sub -> /etc/extensions`) would carry a plan's link anywhere the
//! agent can write. The allowed directory itself is resolved normally: it is the
//! administrator's choice (on Fedora CoreOS `/opt` is a link to `/var/opt`).
//!
//! Every directory below the base is opened with `O_NOFOLLOW`, one component at a time,
//! and the link is then written relative to that descriptor, so a symlink swapped in
//! after the check is refused too. Blocking; call through `spawn_blocking`.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, RenameFlags, openat, renameat, renameat2};
use nix::sys::stat::{Mode, fchmod, mkdirat};
use nix::unistd::{UnlinkatFlags, fsync, symlinkat, unlinkat};

/// Directories the agent creates below a target directory: 0755 whatever the umask, so
/// what is linked there runs for every user (`/opt/bin/sub/tool`).
const DIR_MODE: u32 = 0o755;

/// The directory `link` is reached from: the allowed target directory holding it, else
/// its own directory (a sysext link in the configured extensions directory).
pub fn base_of<'a>(link: &'a Path, allowed_target_dirs: &'a [PathBuf]) -> &'a Path {
    allowed_target_dirs
        .iter()
        .find(|dir| link.starts_with(dir))
        .map_or_else(|| link.parent().unwrap_or(link), PathBuf::as_path)
}

/// The first component of `dir` below `base` that is a symlink, if any (`dir` must be
/// below or equal to `base`). Components that do not exist yet are fine: the agent
/// creates them as directories.
pub fn symlink_below(base: &Path, dir: &Path) -> io::Result<Option<PathBuf>> {
    let mut at = base.to_path_buf();
    for name in components_below(base, dir)? {
        at.push(name);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => return Ok(Some(at)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Opens `dir` (below or equal to `base`), creating missing directories (mode 0755),
/// refusing any symlink below `base` with an error naming it.
pub fn open_dir(base: &Path, dir: &Path) -> io::Result<OwnedFd> {
    let flags = OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    if !base.exists() {
        // Made at boot by the tmpfiles entry; when missing, as tmpfiles would.
        std::fs::create_dir_all(base)?;
        std::fs::set_permissions(base, std::fs::Permissions::from_mode(DIR_MODE))?;
    }
    let mut fd = openat(nix::fcntl::AT_FDCWD, base, flags, Mode::empty())
        .map_err(|e| errno(e, "opening", base))?;
    let mut at = base.to_path_buf();
    for name in components_below(base, dir)? {
        at.push(name);
        let next = match openat(&fd, name, flags | OFlag::O_NOFOLLOW, Mode::empty()) {
            Err(Errno::ENOENT) => {
                create_dir(&fd, name, &at)?;
                openat(&fd, name, flags | OFlag::O_NOFOLLOW, Mode::empty())
            }
            other => other,
        };
        fd = next.map_err(|e| match e {
            // O_NOFOLLOW on a symlink fails ELOOP; O_DIRECTORY on a file, ENOTDIR.
            Errno::ELOOP => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is a symlink; links are never made through one below {}",
                    at.display(),
                    base.display()
                ),
            ),
            e => errno(e, "opening", &at),
        })?;
    }
    Ok(fd)
}

fn create_dir(parent: &impl AsFd, name: &Path, at: &Path) -> io::Result<()> {
    match mkdirat(parent, name, Mode::from_bits_truncate(DIR_MODE)) {
        Ok(()) => {}
        Err(Errno::EEXIST) => return Ok(()),
        Err(e) => return Err(errno(e, "creating", at)),
    }
    let flags = OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_RDONLY | OFlag::O_NOFOLLOW;
    let created =
        openat(parent, name, flags, Mode::empty()).map_err(|e| errno(e, "opening", at))?;
    // mkdir's mode is masked by the umask (the unit's is 0077).
    fchmod(&created, Mode::from_bits_truncate(DIR_MODE)).map_err(|e| errno(e, "chmod", at))?;
    fsync(parent.as_fd()).map_err(|e| errno(e, "flushing", at))
}

/// Points `link` at `target` atomically, `link`'s directory reached from `base` with no
/// symlink followed: symlink under a temporary name, rename over `link`, flush.
pub fn swap_symlink(base: &Path, link: &Path, target: &Path) -> io::Result<()> {
    let (dir, name) = split(link)?;
    let fd = open_dir(base, dir)?;
    let temp = PathBuf::from(format!(".{}.inplace-new", name.to_string_lossy()));
    match unlinkat(&fd, &temp, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        // The directory a swap had exchanged out and not yet removed (its copy is in the
        // backups).
        Err(Errno::EISDIR) => fs::remove_dir_all(dir.join(&temp))?,
        Err(e) => return Err(errno(e, "removing", &dir.join(&temp))),
    }
    symlinkat(target, &fd, &temp).map_err(|e| errno(e, "creating", &dir.join(&temp)))?;
    match renameat(&fd, &temp, &fd, name) {
        Ok(()) => {}
        // A directory is there (a Config tree's first swap): a link cannot be renamed over
        // it, so the two are exchanged atomically, and then the directory (now at the
        // temporary name; its copy is in the backups) is removed.
        Err(Errno::EISDIR) => {
            renameat2(&fd, &temp, &fd, name, RenameFlags::RENAME_EXCHANGE)
                .map_err(|e| errno(e, "exchanging a link with the directory", link))?;
            fsync(&fd).map_err(|e| errno(e, "flushing", dir))?;
            fs::remove_dir_all(dir.join(&temp))?;
        }
        Err(e) => return Err(errno(e, "renaming over", link)),
    }
    fsync(&fd).map_err(|e| errno(e, "flushing", dir))
}

fn split(link: &Path) -> io::Result<(&Path, &Path)> {
    match (link.parent(), link.file_name()) {
        (Some(dir), Some(name)) if !dir.as_os_str().is_empty() => Ok((dir, Path::new(name))),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no directory", link.display()),
        )),
    }
}

/// The plain names of `dir` below `base`; anything else (`..`, not below) is refused.
fn components_below<'a>(base: &Path, dir: &'a Path) -> io::Result<Vec<&'a Path>> {
    let outside = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not below {}", dir.display(), base.display()),
        )
    };
    let rest = dir.strip_prefix(base).map_err(|_| outside())?;
    rest.components()
        .map(|c| match c {
            Component::Normal(name) => Ok(Path::new(name)),
            _ => Err(outside()),
        })
        .collect()
}

fn errno(e: Errno, doing: &str, path: &Path) -> io::Error {
    io::Error::new(
        io::Error::from(e).kind(),
        format!("{doing} {}: {e}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_symlinked_subdirectory_is_found_and_refused_and_nothing_is_written() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("bin");
        let elsewhere = root.path().join("etc");
        fs::create_dir_all(&base).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        symlink(&elsewhere, base.join("sub")).unwrap();
        let link = base.join("sub/tool");

        assert_eq!(
            symlink_below(&base, link.parent().unwrap()).unwrap(),
            Some(base.join("sub"))
        );
        let err = swap_symlink(&base, &link, Path::new("/x")).unwrap_err();
        assert!(
            err.to_string()
                .contains(&*base.join("sub").to_string_lossy()),
            "{err}"
        );
        assert_eq!(
            fs::read_dir(&elsewhere).unwrap().count(),
            0,
            "nothing written"
        );
    }

    #[test]
    fn the_base_itself_may_be_a_symlink_and_missing_directories_are_created_0755() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("real")).unwrap();
        let base = root.path().join("bin");
        symlink(root.path().join("real"), &base).unwrap();
        let link = base.join("a/b/tool");
        assert_eq!(symlink_below(&base, link.parent().unwrap()).unwrap(), None);

        swap_symlink(&base, &link, Path::new("/x")).unwrap();
        swap_symlink(&base, &link, Path::new("/y")).unwrap();
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("/y"));
        for dir in ["real/a", "real/a/b"] {
            let mode = fs::metadata(root.path().join(dir))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o755, "{dir}");
        }
        assert_eq!(
            fs::read_dir(root.path().join("real/a/b")).unwrap().count(),
            1
        );
    }

    #[test]
    fn a_path_not_below_the_base_is_refused() {
        let base = Path::new("/opt/bin");
        assert!(symlink_below(base, Path::new("/etc")).is_err());
        assert!(open_dir(base, Path::new("/opt/bin/../../etc")).is_err());
    }
}
