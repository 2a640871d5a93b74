//! Host-side plumbing for nodes: loop devices, cgroups, mounts, locks, process identity.
//! Everything here is synchronous and short unless it says otherwise; async callers wrap the
//! slow parts in `spawn_blocking`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use nix::unistd::Pid;

use crate::error::IoContext;
use crate::{Error, Result};

/// An exclusive `flock` on a file, released on drop.
#[derive(Debug)]
pub(crate) struct FileLock {
    _file: fs::File,
}

impl FileLock {
    /// Waits (off the async runtime) until the lock is ours.
    pub(crate) async fn acquire(path: PathBuf) -> Result<Self> {
        tokio::task::spawn_blocking(move || {
            let file = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .ctx(|| format!("opening lock {}", path.display()))?;
            file.lock().ctx(|| format!("locking {}", path.display()))?;
            Ok(FileLock { _file: file })
        })
        .await
        .map_err(|e| Error::Invalid(format!("lock task failed: {e}")))?
    }
}

/// Makes sure `/dev/loop-control` and `/dev/loop0..count` exist on the host, as device
/// nodes and as the kernel's devices. Nodes bind all of them: the kernel hands out free loop
/// devices globally (`LOOP_CTL_GET_FREE`: a free existing device first, else a new one), so a
/// node must be able to open whichever number it gets. systemd in a node removes a loop device
/// it allocated once it is done with it, so after a day of tests the kernel may have none of
/// `loop0..count` left and hand out `loop16` and up, which no node can open
/// (`systemd-sysext` then fails to merge). Opening each device node creates the kernel's
/// device again (`CONFIG_BLOCK_LEGACY_AUTOLOAD`).
pub(crate) fn ensure_loop_devices(count: u32) -> Result<Vec<PathBuf>> {
    let control = Path::new("/dev/loop-control");
    if !control.exists() {
        make_node(control, SFlag::S_IFCHR, 10, 237)?;
    }
    (0..count)
        .map(|n| {
            let path = PathBuf::from(format!("/dev/loop{n}"));
            if !path.exists() {
                make_node(&path, SFlag::S_IFBLK, 7, u64::from(n))?;
            }
            open_loop_device(&path)?;
            Ok(path)
        })
        .collect()
}

/// Opens `path`, which creates the kernel's loop device. A node's systemd may remove that
/// device between our open's autoload and its lookup: the open then fails with ENXIO ("No
/// such device or address", seen once in a fresh-clone run of 2871338 while other tests'
/// nodes were stopping), and opening again creates it anew.
fn open_loop_device(path: &Path) -> Result<()> {
    let mut attempts = 0;
    loop {
        match fs::File::open(path) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) && attempts < 20 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => {
                return Err(e)
                    .ctx(|| format!("opening {} (creates the loop device)", path.display()));
            }
        }
    }
}

fn make_node(path: &Path, kind: SFlag, major: u64, minor: u64) -> Result<()> {
    match mknod(
        path,
        kind,
        Mode::from_bits_truncate(0o660),
        makedev(major, minor),
    ) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(errno) => Err(Error::Io {
            context: format!("mknod {}", path.display()),
            source: errno.into(),
        }),
    }
}

/// The cgroup directories under which every node gets its own group, one per hierarchy that
/// systemd-nspawn uses: the unified (v2) one, mounted at `/sys/fs/cgroup` or, in hybrid mode,
/// `/sys/fs/cgroup/unified`, and the legacy `name=systemd` one. nspawn puts its payload and
/// supervisor below its *own* cgroup, so several nodes never share (and fight over) one
/// group, and a crashed test's node can be found and killed by the next run.
pub(crate) fn cgroup_bases() -> Vec<PathBuf> {
    [
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup/systemd",
        "/sys/fs/cgroup",
    ]
    .iter()
    .map(Path::new)
    .filter(|p| p.join("cgroup.procs").exists())
    .map(|p| p.join("inplace-testbed"))
    .collect()
}

/// The bases in the v1 controller hierarchies (cpu, memory, pids, ...: every one but
/// `name=systemd`) under which a node that runs containerd and a kubelet gets a group of its
/// own ([`node_cgroups`] with `controllers`). They lie below this process's own group in each
/// hierarchy: here the memory one is the sandbox's (`/process_api/<id>`), and a group outside
/// it would escape its limit. Empty on a pure cgroup v2 host.
pub(crate) fn controller_cgroup_bases() -> Vec<PathBuf> {
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    own.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            if controllers.is_empty() || controllers.starts_with("name=") {
                return None;
            }
            // Joined controllers (`cpu,cpuacct`) are mounted under their joined name.
            let mount = Path::new("/sys/fs/cgroup").join(controllers);
            mount.join("cgroup.procs").exists().then(|| {
                mount
                    .join(path.trim_start_matches('/'))
                    .join("inplace-testbed")
            })
        })
        .collect()
}

/// A node's cgroups, one per hierarchy: systemd's (always) and, with `controllers`, one in
/// every v1 controller hierarchy ([`controller_cgroup_bases`]).
pub(crate) fn node_cgroups(name: &str, controllers: bool) -> Vec<PathBuf> {
    let mut bases = cgroup_bases();
    if controllers {
        bases.extend(controller_cgroup_bases());
    }
    bases.into_iter().map(|b| b.join(name)).collect()
}

/// Creates a node's cgroups. A new cpuset group starts with no CPUs and no memory nodes, and
/// no process can join it until they are set: each new level copies its parent's.
pub(crate) fn create_cgroups(dirs: &[PathBuf]) -> Result<()> {
    for dir in dirs {
        let base = dir.parent().unwrap_or(dir);
        for level in [base, dir.as_path()] {
            fs::create_dir_all(level).ctx(|| format!("creating cgroup {}", level.display()))?;
            if level.join("cpuset.cpus").exists() {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    inherit_cpuset(level, file)?;
                }
            }
        }
    }
    Ok(())
}

fn inherit_cpuset(dir: &Path, file: &str) -> Result<()> {
    let own = fs::read_to_string(dir.join(file))
        .ctx(|| format!("reading {file} of {}", dir.display()))?;
    if !own.trim().is_empty() {
        return Ok(());
    }
    let parent = dir.parent().unwrap_or(dir);
    let value = fs::read_to_string(parent.join(file))
        .ctx(|| format!("reading {file} of {}", parent.display()))?;
    fs::write(dir.join(file), value.trim()).ctx(|| format!("writing {file} of {}", dir.display()))
}

/// All process ids in a cgroup tree.
pub(crate) fn cgroup_pids(dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(entries) = fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(e.path());
                }
            }
        }
    }
    pids
}

/// SIGKILLs everything in the cgroup trees until it is empty, then removes the groups.
/// Blocks for at most `patience`.
pub(crate) fn kill_cgroup_trees(dirs: &[PathBuf], patience: Duration) -> Result<()> {
    let deadline = Instant::now() + patience;
    loop {
        let pids: Vec<i32> = dirs.iter().flat_map(|d| cgroup_pids(d)).collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if Instant::now() > deadline {
            return Err(Error::Invalid(format!(
                "processes in {dirs:?} survive SIGKILL"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for dir in dirs {
        remove_cgroup_dirs(dir, deadline)?;
    }
    Ok(())
}

fn remove_cgroup_dirs(dir: &Path, deadline: Instant) -> Result<()> {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup_dirs(&e.path(), deadline)?;
            }
        }
    }
    // A group can stay busy for a moment after its last process died.
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(Error::Io {
                    context: format!("removing cgroup {}", dir.display()),
                    source: e,
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Mount points at or below `dir`, deepest first.
pub(crate) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut mounts: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    mounts.dedup();
    mounts
}

fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lazily unmounts everything at or below `dir`.
pub(crate) fn unmount_all_under(dir: &Path) -> Result<()> {
    for mount in mounts_under(dir) {
        // A lazy unmount always succeeds for a mount that exists; stacked mounts need a
        // second pass, which the loop below gives them.
        let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
    }
    let left = mounts_under(dir);
    if left.is_empty() {
        Ok(())
    } else {
        for mount in &left {
            let _ = nix::mount::umount2(mount, nix::mount::MntFlags::MNT_DETACH);
        }
        if mounts_under(dir).is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "cannot unmount {:?} under {}",
                left,
                dir.display()
            )))
        }
    }
}

/// Unmounts whatever is below `dir`, then deletes it without crossing file-system borders.
pub(crate) async fn remove_tree(dir: &Path) -> Result<()> {
    let owned = dir.to_path_buf();
    tokio::task::spawn_blocking(move || remove_tree_blocking(&owned))
        .await
        .map_err(|e| Error::Invalid(format!("cleanup task failed: {e}")))?
}

/// Blocking form of [`remove_tree`], for `Drop`.
pub(crate) fn remove_tree_blocking(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    unmount_all_under(dir)?;
    let status = std::process::Command::new("rm")
        .arg("-rf")
        .arg("--one-file-system")
        .arg("--")
        .arg(dir)
        .status()
        .ctx(|| format!("rm -rf {}", dir.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::CommandFailed {
            command: format!("rm -rf --one-file-system {}", dir.display()),
            status: status.to_string(),
            stderr: String::new(),
        })
    }
}

/// A process identity that survives pid reuse: pid plus its start time in clock ticks.
pub(crate) fn process_identity(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime), counted after the parenthesised command name.
    let after = stat.rsplit_once(')')?.1;
    let start = after.split_whitespace().nth(19)?;
    Some(format!("{pid} {start}"))
}

/// Whether the process recorded by [`process_identity`] still runs.
pub(crate) fn identity_alive(identity: &str) -> bool {
    identity
        .split_whitespace()
        .next()
        .and_then(|p| p.parse::<u32>().ok())
        .and_then(process_identity)
        .is_some_and(|now| now == identity.trim())
}

/// The pid, as seen from the host, of the process that is PID 1 in a pid namespace below
/// the given cgroups (the container's systemd).
pub(crate) fn find_container_init(cgroups: &[PathBuf]) -> Option<i32> {
    cgroups.iter().flat_map(|cg| cgroup_pids(cg)).find(|pid| {
        fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| {
                status.lines().find(|l| l.starts_with("NSpid:")).map(|l| {
                    let ids: Vec<&str> = l.split_whitespace().skip(1).collect();
                    ids.len() >= 2 && ids.last() == Some(&"1")
                })
            })
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/end\\"), "/end\\");
    }

    #[test]
    fn own_identity_is_alive() {
        let id = process_identity(std::process::id()).expect("own /proc entry");
        assert!(identity_alive(&id));
        assert!(!identity_alive("1 0"));
    }
}
