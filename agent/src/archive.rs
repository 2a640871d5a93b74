//! Hardened extraction of named members from a tar or tar.gz archive. The whole archive is
//! read and judged: one bad entry anywhere (`..`, absolute path, link, device, fifo,
//! setuid/setgid, duplicate path, sparse file, unusual PAX records, too many entries or
//! bytes) refuses all of it, and the fresh staging directory is removed. Only the members
//! the plan names are written, each to a new file in that directory. Blocking.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use tar::EntryType;

/// Limits on what an archive may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most entries (of any kind).
    pub max_entries: u64,
    /// Most bytes of the uncompressed tar stream (headers included): the bomb guard. A
    /// member whose header says it is larger than what is left is refused before a byte of
    /// it is written.
    pub max_bytes: u64,
    /// Free bytes a member may not eat into on the staging directory's file system (the
    /// kubelet and containerd usually share it; disk pressure evicts pods).
    pub reserved_disk_space: u64,
}

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// An entry breaks a rule; nothing was installed.
    #[error("archive refused: entry {entry:?}: {why}")]
    Refused {
        /// The entry's path as written.
        entry: String,
        /// The rule it breaks.
        why: String,
    },
    /// A limit was crossed; nothing was installed.
    #[error("archive refused: {0}")]
    TooBig(String),
    /// Writing a member would leave less free space than the node reserves.
    #[error(
        "archive refused: member {member:?} ({size} bytes) would leave less than the reserved {reserved} bytes free on {dir} ({available} available)"
    )]
    NoRoom {
        /// The member's name in the archive.
        member: String,
        /// Its size, as its header says.
        size: u64,
        /// The directory written to.
        dir: PathBuf,
        /// Free bytes there (for an unprivileged user, as `df` shows).
        available: u64,
        /// `policy.reserved_disk_space`.
        reserved: u64,
    },
    /// A member the plan names is not in the archive.
    #[error("archive has no member {0:?}")]
    MissingMember(String),
    /// The file could not be read or the output written.
    #[error("archive: {0}")]
    Io(#[from] io::Error),
}

/// One extracted member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// The member name as the plan gives it.
    pub from: String,
    /// Where it was written (inside the staging directory).
    pub path: PathBuf,
    /// Its sha256, lowercase hex.
    pub sha256: String,
    /// Its size.
    pub size: u64,
}

/// PAX keys that only describe metadata; anything else (size, linkpath, GNU.sparse.*,
/// SCHILY.*, LIBARCHIVE.*, ...) refuses the archive.
const HARMLESS_PAX_KEYS: &[&str] = &[
    "path", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "comment",
];

/// Errors once more than `left` bytes have been read through it.
struct LimitedReader<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for LimitedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                "uncompressed archive larger than the limit",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// A plan member name without a leading `./`.
fn normalize_member(name: &str) -> &str {
    name.strip_prefix("./").unwrap_or(name)
}

/// Extracts `members` (plan names) of `archive` into `staging` (must not exist yet; it is
/// created, and removed again on any error).
pub fn extract_members(
    archive: &Path,
    members: &[&str],
    staging: &Path,
    limits: Limits,
) -> Result<Vec<Extracted>, ArchiveError> {
    fs::create_dir(staging)?;
    let result = extract_into(archive, members, staging, limits);
    if result.is_err() {
        let _ = fs::remove_dir_all(staging);
    }
    result
}

/// Extracts every entry of `archive` into `staging` (must not exist yet; it is created, and
/// removed again on any error), at its own path: a directory tree. Directories are 0755
/// (the tree's files are what its mode and owner are for), each file has its entry's
/// permission bits. Returns the files written.
pub fn extract_tree(
    archive: &Path,
    staging: &Path,
    limits: Limits,
) -> Result<Vec<PathBuf>, ArchiveError> {
    fs::create_dir(staging)?;
    let mut files = Vec::new();
    let result = fs::set_permissions(staging, fs::Permissions::from_mode(TREE_DIR_MODE))
        .map_err(ArchiveError::from)
        .and_then(|()| {
            judge_entries(archive, limits, |entry, judged| {
                let (dirs, file) = match judged.kind {
                    EntryType::Directory => (judged.key.as_str(), None),
                    _ => match judged.key.rsplit_once('/') {
                        Some((dirs, name)) => (dirs, Some(name)),
                        None => ("", Some(judged.key.as_str())),
                    },
                };
                let dir = make_tree_dirs(staging, dirs)?;
                let Some(name) = file else {
                    return Ok(());
                };
                let target = dir.join(name);
                let reserved = limits.reserved_disk_space;
                write_entry(entry, judged, &target, judged.mode & 0o777, reserved)?;
                // Whatever the umask: the mode is the archive's.
                fs::set_permissions(&target, fs::Permissions::from_mode(judged.mode & 0o777))?;
                files.push(target);
                Ok(())
            })
        });
    if result.is_err() {
        let _ = fs::remove_dir_all(staging);
    }
    result.map(|()| files)
}

/// A tree's directories: 0755 whatever the archive and the umask say.
const TREE_DIR_MODE: u32 = 0o755;

/// Creates `staging/dirs` one component at a time, each [`TREE_DIR_MODE`].
fn make_tree_dirs(staging: &Path, dirs: &str) -> io::Result<PathBuf> {
    let mut dir = staging.to_path_buf();
    for part in dirs.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
        match fs::create_dir(&dir) {
            Ok(()) => fs::set_permissions(&dir, fs::Permissions::from_mode(TREE_DIR_MODE))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(dir)
}

fn extract_into(
    archive: &Path,
    members: &[&str],
    staging: &Path,
    limits: Limits,
) -> Result<Vec<Extracted>, ArchiveError> {
    let wanted: HashMap<&str, &str> = members.iter().map(|m| (normalize_member(m), *m)).collect();
    let mut out = Vec::new();
    judge_entries(archive, limits, |entry, judged| {
        let Some(plan_name) = wanted.get(judged.key.as_str()) else {
            // Read past it (the limit still counts it).
            io::copy(entry, &mut io::sink()).map_err(|e| judged.too_big(e))?;
            return Ok(());
        };
        if judged.kind == EntryType::Directory {
            return Err(judged.refuse("the plan names a directory, not a file"));
        }
        let target = staging.join(format!("member-{}", out.len()));
        let reserved = limits.reserved_disk_space;
        let (sha256, size) = write_entry(entry, judged, &target, 0o755, reserved)?;
        out.push(Extracted {
            from: (*plan_name).to_owned(),
            path: target,
            sha256,
            size,
        });
        Ok(())
    })?;
    for member in members {
        if !out.iter().any(|e| e.from == *member) {
            return Err(ArchiveError::MissingMember((*member).to_owned()));
        }
    }
    Ok(out)
}

/// An entry that passed every rule, as `judge_entries` hands it on.
struct Judged {
    /// Its normalized path, without a trailing `/`.
    key: String,
    /// Its path as written, for messages.
    shown: String,
    kind: EntryType,
    /// Its header's mode (no setuid or setgid bit: refused).
    mode: u32,
    /// Its size, as its header says.
    size: u64,
    /// The limit on uncompressed bytes, for a read error past it.
    max_bytes: u64,
}

impl Judged {
    /// A read error inside the entry: past the byte limit it is [`ArchiveError::TooBig`].
    fn too_big(&self, e: io::Error) -> ArchiveError {
        too_big(self.max_bytes, e)
    }

    fn refuse(&self, why: &str) -> ArchiveError {
        ArchiveError::Refused {
            entry: self.shown.clone(),
            why: why.to_owned(),
        }
    }
}

/// Reads the whole archive (tar or tar.gz), judges every entry by the module's rules and
/// hands each one that passes, within the limits, to `write`; the first refusal stops it.
fn judge_entries(
    archive: &Path,
    limits: Limits,
    mut write: impl FnMut(&mut dyn Read, &Judged) -> Result<(), ArchiveError>,
) -> Result<(), ArchiveError> {
    let mut file = BufReader::new(File::open(archive)?);
    let mut magic = [0u8; 2];
    let gz = file.read(&mut magic)? == 2 && magic == [0x1f, 0x8b];
    drop(file);
    let raw = BufReader::new(File::open(archive)?);
    let stream: Box<dyn Read> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(raw))
    } else {
        Box::new(raw)
    };
    let limited = LimitedReader {
        inner: stream,
        left: limits.max_bytes,
    };
    let mut tar = tar::Archive::new(limited);
    let mut streamed = 0u64;
    let mut seen = HashSet::new();
    let too_big = |e| too_big(limits.max_bytes, e);
    let mut count = 0u64;
    for entry in tar.entries().map_err(too_big)? {
        let mut entry = entry.map_err(too_big)?;
        count += 1;
        if count > limits.max_entries {
            return Err(ArchiveError::TooBig(format!(
                "more than {} entries",
                limits.max_entries
            )));
        }
        let path = entry.path().map_err(too_big)?.into_owned();
        let shown = path.to_string_lossy().into_owned();
        let refuse = |why: &str| ArchiveError::Refused {
            entry: shown.clone(),
            why: why.to_owned(),
        };
        if let Some(pax) = entry.pax_extensions().map_err(too_big)? {
            for record in pax {
                let record = record.map_err(too_big)?;
                let key = record.key().map_err(|_| refuse("PAX key is not UTF-8"))?;
                if !HARMLESS_PAX_KEYS.contains(&key) {
                    return Err(refuse(&format!("PAX record {key:?} is not allowed")));
                }
            }
        }
        let name = check_path(&path).map_err(&refuse)?;
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().map_err(too_big)?;
        if mode & 0o6000 != 0 {
            return Err(refuse("setuid/setgid bit"));
        }
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::Directory => {}
            EntryType::Symlink => return Err(refuse("symbolic links are not allowed")),
            EntryType::Link => return Err(refuse("hard links are not allowed")),
            EntryType::Char | EntryType::Block => {
                return Err(refuse("device files are not allowed"));
            }
            EntryType::Fifo => return Err(refuse("fifos are not allowed")),
            EntryType::GNUSparse => return Err(refuse("sparse files are not allowed")),
            _ => return Err(refuse("unsupported entry type")),
        }
        let key = name.trim_end_matches('/').to_owned();
        if !seen.insert(key.clone()) {
            return Err(refuse("duplicate path"));
        }
        // Header and padding included, as the stream limit counts them.
        streamed = streamed.saturating_add(512 + entry.size().div_ceil(512) * 512);
        if streamed > limits.max_bytes {
            return Err(ArchiveError::TooBig(format!(
                "member {shown:?} ({} bytes) ends past the limit of {} bytes uncompressed",
                entry.size(),
                limits.max_bytes
            )));
        }
        let judged = Judged {
            key,
            shown,
            kind,
            mode,
            size: entry.size(),
            max_bytes: limits.max_bytes,
        };
        write(&mut entry, &judged)?;
    }
    Ok(())
}

/// Writes what is left of `entry` to the new file `target` (mode `mode`) and flushes it,
/// unless that would leave less than `reserved` bytes free there; its sha256 and size.
fn write_entry(
    entry: &mut dyn Read,
    judged: &Judged,
    target: &Path,
    mode: u32,
    reserved: u64,
) -> Result<(String, u64), ArchiveError> {
    let dir = target.parent().unwrap_or(Path::new("."));
    ensure_room(dir, &judged.shown, judged.size, reserved)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(target)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = entry.read(&mut buf).map_err(|e| judged.too_big(e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])?;
        size += n as u64;
    }
    file.sync_all()?;
    Ok((hex::encode(hasher.finalize()), size))
}

/// A read error: past the limit of `max_bytes` uncompressed it is [`ArchiveError::TooBig`].
fn too_big(max_bytes: u64, e: io::Error) -> ArchiveError {
    if e.kind() == io::ErrorKind::FileTooLarge {
        ArchiveError::TooBig(format!("more than {max_bytes} bytes uncompressed"))
    } else {
        ArchiveError::Io(e)
    }
}

/// Refuses a member of `size` bytes when writing it into `dir` would leave less than
/// `reserved` bytes free there.
fn ensure_room(dir: &Path, member: &str, size: u64, reserved: u64) -> Result<(), ArchiveError> {
    let stats = nix::sys::statvfs::statvfs(dir).map_err(io::Error::from)?;
    let available = stats
        .blocks_available()
        .saturating_mul(stats.fragment_size());
    if available.saturating_sub(size) < reserved {
        return Err(ArchiveError::NoRoom {
            member: member.to_owned(),
            size,
            dir: dir.to_path_buf(),
            available,
            reserved,
        });
    }
    Ok(())
}

/// A relative, normalized entry path, or why not.
fn check_path(path: &Path) -> Result<String, &'static str> {
    let text = path.to_str().ok_or("path is not UTF-8")?;
    if text.is_empty() {
        return Err("empty path");
    }
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part.to_str().ok_or("path is not UTF-8")?),
            Component::CurDir => {}
            Component::ParentDir => return Err("\"..\" in path"),
            Component::RootDir | Component::Prefix(_) => return Err("absolute path"),
        }
    }
    if parts.is_empty() {
        return Ok(String::new());
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests;
