//! One booted node: lifecycle, commands inside, files in and out, service installs.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};

use super::rootfs::{Suite, ensure_suite, tail};
use super::{NODES_DIR, host};
use crate::error::IoContext;
use crate::sysext::SysextImage;
use crate::{Error, Result, prereq};

/// The `PATH` commands inside a node run with.
const NODE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// A node directory without an owner record is left alone this long (it may be booting).
const OWNERLESS_GRACE: Duration = Duration::from_secs(120);

/// How to boot a node. `Default` suits tests: the cached rootfs, generous timeouts.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Root filesystem to overlay; `None` builds/uses the cached tree of `suite`.
    pub rootfs: Option<PathBuf>,
    /// The Debian release (and systemd) the node runs when `rootfs` is `None`: bookworm
    /// unless a test needs a newer systemd ([`Suite`]).
    pub suite: Suite,
    /// From `systemd-nspawn` start until `systemctl is-system-running` says running/degraded.
    pub boot_timeout: Duration,
    /// Default limit for one command run with [`Node::exec`] and friends.
    pub exec_timeout: Duration,
    /// How many `/dev/loopN` the host provides and the node binds (squashfs sysexts need one
    /// each while merged, shared by all nodes).
    pub loop_devices: u32,
    /// Files placed in the node's tree before it boots, "the way an image builder would".
    pub files: Vec<NodeFile>,
    /// Symbolic links placed in the node's tree before it boots: `(link, target)`, both as the
    /// node sees paths (e.g. `/etc/extensions/kubernetes.raw` to the stored image).
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// Units enabled before boot with `systemctl --root=... enable`.
    pub enable_units: Vec<String>,
    /// Extra `systemd-nspawn` arguments (e.g. `--bind=/host/dir:/in/node`).
    pub extra_nspawn_args: Vec<String>,
    /// Gives the node a cgroup of its own in every v1 controller hierarchy too, not only in
    /// systemd's: containerd and a kubelet make groups there, and without one of its own the
    /// node's root in those hierarchies would be the host's (test-beds.md § Real Kubernetes
    /// nodes).
    pub cgroup_controllers: bool,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            rootfs: None,
            suite: Suite::default(),
            boot_timeout: Duration::from_secs(240),
            exec_timeout: Duration::from_secs(300),
            // Far more than the nodes of two tests at once ever hold: the kernel numbers a
            // new loop device with the lowest free index, but hands out any free existing
            // one first, and one numbered past the nodes' range (left by an earlier burst)
            // would be unusable in every node.
            loop_devices: 64,
            files: Vec::new(),
            symlinks: Vec::new(),
            enable_units: Vec::new(),
            extra_nspawn_args: Vec::new(),
            cgroup_controllers: false,
        }
    }
}

/// A file to put into a node: absolute path inside the node, contents, permission bits.
#[derive(Debug, Clone)]
pub struct NodeFile {
    /// Absolute path inside the node.
    pub path: PathBuf,
    /// The bytes.
    pub contents: Vec<u8>,
    /// Permission bits, e.g. `0o755`.
    pub mode: u32,
}

impl NodeFile {
    /// A file from bytes.
    pub fn new(path: impl Into<PathBuf>, contents: impl Into<Vec<u8>>, mode: u32) -> Self {
        Self {
            path: path.into(),
            contents: contents.into(),
            mode,
        }
    }

    /// A file copied from the host, e.g. a binary built by cargo (nodes run the same Debian
    /// bookworm glibc as the host).
    pub async fn from_host(
        host_path: impl AsRef<Path>,
        node_path: impl Into<PathBuf>,
        mode: u32,
    ) -> Result<Self> {
        let host_path = host_path.as_ref();
        let contents = tokio::fs::read(host_path)
            .await
            .ctx(|| format!("reading {}", host_path.display()))?;
        Ok(Self::new(node_path, contents, mode))
    }
}

/// A service as an image builder would ship it: a unit file plus the files it needs
/// (binary, config). Install it into a running node with [`Node::install_service`], or into
/// the image before boot with [`ServiceInstall::into_boot_options`].
#[derive(Debug, Clone)]
pub struct ServiceInstall {
    /// Unit name, e.g. `inplace-agent.service`.
    pub unit_name: String,
    /// The unit file's text; installed as `/etc/systemd/system/<unit_name>`.
    pub unit: String,
    /// Binaries, configuration and anything else the unit needs.
    pub files: Vec<NodeFile>,
    /// Start it (`systemctl enable --now`) instead of only enabling it.
    pub start: bool,
}

impl ServiceInstall {
    /// A service with just its unit file; add files with [`ServiceInstall::file`].
    pub fn new(unit_name: impl Into<String>, unit: impl Into<String>) -> Self {
        Self {
            unit_name: unit_name.into(),
            unit: unit.into(),
            files: Vec::new(),
            start: true,
        }
    }

    /// Adds a file.
    #[must_use]
    pub fn file(mut self, file: NodeFile) -> Self {
        self.files.push(file);
        self
    }

    /// Whether to start the unit after enabling it.
    #[must_use]
    pub fn start(mut self, start: bool) -> Self {
        self.start = start;
        self
    }

    fn unit_path(&self) -> PathBuf {
        Path::new("/etc/systemd/system").join(&self.unit_name)
    }

    /// Adds the service to a node's image: files written and unit enabled before boot.
    pub fn into_boot_options(self, options: &mut NodeOptions) {
        options.files.push(NodeFile::new(
            self.unit_path(),
            self.unit.into_bytes(),
            0o644,
        ));
        options.files.extend(self.files);
        options.enable_units.push(self.unit_name);
    }
}

/// What a command inside a node did.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    /// The command line, for messages.
    pub command: String,
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

impl ExecOutput {
    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Standard output as (lossy) text.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard error as (lossy) text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// `Ok(self)` on success, else [`Error::CommandFailed`] with both outputs.
    pub fn checked(self) -> Result<Self> {
        if self.success() {
            Ok(self)
        } else {
            Err(Error::CommandFailed {
                command: self.command.clone(),
                status: self.status.to_string(),
                stderr: format!(
                    "{}{}",
                    self.stderr_text().trim(),
                    if self.stdout.is_empty() {
                        String::new()
                    } else {
                        format!("\nstdout: {}", self.stdout_text().trim())
                    }
                ),
            })
        }
    }
}

/// A booted systemd-nspawn container. Dropping it kills the container and removes its
/// writable layer; prefer [`Node::poweroff`] for an orderly shutdown.
#[derive(Debug)]
pub struct Node {
    name: String,
    dir: PathBuf,
    root: PathBuf,
    cgroups: Vec<PathBuf>,
    child: Option<Child>,
    pid1: i32,
    options: NodeOptions,
    torn_down: bool,
}

/// systemd-nspawn's exit status when the container rebooted (systemd-nspawn(1)).
const NSPAWN_REBOOTED: i32 = 133;

static NAME_COUNTER: AtomicU32 = AtomicU32::new(0);

impl Node {
    /// A node name unique on this host for the life of this process: `prefix-<pid>-<n>`.
    pub fn unique_name(prefix: &str) -> String {
        let prefix: String = prefix
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(24)
            .collect();
        let n = NAME_COUNTER.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{}-{n}", std::process::id())
    }

    /// Boots a node named `name` (also its hostname) and waits until systemd reports the
    /// system running (or degraded). Builds the cached root filesystem on first use.
    pub async fn boot(name: &str, options: NodeOptions) -> Result<Node> {
        prereq::require_nspawn()?;
        validate_name(name)?;
        if let Err(e) = sweep_stale_nodes().await {
            tracing::warn!("sweeping stale nodes: {e}");
        }
        let rootfs = match &options.rootfs {
            Some(path) => path.clone(),
            None => ensure_suite(options.suite).await?,
        };
        let dir = Path::new(NODES_DIR).join(name);
        if dir.exists() {
            return Err(Error::Node {
                node: name.to_owned(),
                message: format!("{} exists: a node of that name is running", dir.display()),
            });
        }
        let root = dir.join("root");
        for sub in ["upper", "work", "root"] {
            tokio::fs::create_dir_all(dir.join(sub))
                .await
                .ctx(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let owner = host::process_identity(std::process::id()).unwrap_or_default();
        tokio::fs::write(dir.join("owner"), owner)
            .await
            .ctx(|| format!("writing {}", dir.join("owner").display()))?;

        let mut node = Node {
            name: name.to_owned(),
            cgroups: host::node_cgroups(name, options.cgroup_controllers),
            dir: dir.clone(),
            root: root.clone(),
            child: None,
            pid1: 0,
            options,
            torn_down: false,
        };
        // From here on, `Drop` cleans up whatever fails.
        node.make_root(&rootfs).await?;
        let mut files = vec![NodeFile::new(
            "/etc/hostname",
            format!("{name}\n").into_bytes(),
            0o644,
        )];
        files.extend(node.options.files.clone());
        for file in &files {
            write_into_tree(&root, file).await?;
        }
        for (link, target) in &node.options.symlinks {
            let rel = absolute(link)?;
            let at = root.join(rel.strip_prefix("/").unwrap_or(&rel));
            if let Some(parent) = at.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .ctx(|| format!("creating {}", parent.display()))?;
            }
            tokio::fs::symlink(target, &at)
                .await
                .ctx(|| format!("linking {} to {}", at.display(), target.display()))?;
        }
        for unit in node.options.enable_units.clone() {
            run_host(
                Command::new("systemctl")
                    .arg(format!("--root={}", root.display()))
                    .args(["enable", "--quiet", &unit]),
            )
            .await?;
        }
        node.start().await?;
        Ok(node)
    }

    /// An overlayfs over the cached tree (fast, shares the page cache), or a copy when the
    /// kernel refuses the overlay.
    async fn make_root(&self, rootfs: &Path) -> Result<()> {
        let data = format!(
            "lowerdir={},upperdir={},workdir={}",
            rootfs.display(),
            self.dir.join("upper").display(),
            self.dir.join("work").display()
        );
        let mounted = nix::mount::mount(
            Some("overlay"),
            &self.root,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(data.as_str()),
        );
        if let Err(errno) = mounted {
            tracing::warn!("overlay mount failed ({errno}); copying the root filesystem");
            run_host(
                Command::new("cp")
                    .args(["-a", "--reflink=auto", "--"])
                    .arg(rootfs.join("."))
                    .arg(&self.root),
            )
            .await?;
        }
        Ok(())
    }

    /// Starts systemd-nspawn on the prepared tree and waits for the boot to finish.
    async fn start(&mut self) -> Result<()> {
        let loops = host::ensure_loop_devices(self.options.loop_devices)?;
        let cgroups = self.cgroups.clone();
        tokio::task::spawn_blocking(move || {
            host::kill_cgroup_trees(&cgroups, Duration::from_secs(20))?;
            host::create_cgroups(&cgroups)
        })
        .await
        .map_err(|e| Error::Invalid(format!("cgroup task failed: {e}")))??;

        let log_path = self.dir.join("console.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .ctx(|| format!("opening {}", log_path.display()))?;
        let log2 = log.try_clone().ctx(|| "duplicating log fd".to_owned())?;

        let mut cmd = Command::new("sh");
        // Enter the node's own cgroups first, then become systemd-nspawn.
        let cgroups: Vec<String> = self
            .cgroups
            .iter()
            .map(|c| c.display().to_string())
            .collect();
        cmd.arg("-c")
            .arg(
                r#"for cg in $INPLACE_CGROUPS; do echo $$ > "$cg/cgroup.procs" || exit 1; done
unset INPLACE_CGROUPS; exec "$@""#,
            )
            .arg("sh")
            .env("INPLACE_CGROUPS", cgroups.join(" "))
            .arg("systemd-nspawn")
            .arg("-D")
            .arg(&self.root)
            .args([
                "--keep-unit",
                "--register=no",
                "--boot",
                "--console=read-only",
                "--link-journal=no",
            ])
            .arg(format!("--machine={}", self.name))
            .arg(format!("--hostname={}", self.name))
            .arg("--property=DeviceAllow=block-loop rwm")
            .arg("--bind=/dev/loop-control");
        for dev in &loops {
            cmd.arg(format!("--bind={}", dev.display()));
        }
        cmd.args(&self.options.extra_nspawn_args)
            .env("SYSTEMD_COLORS", "0")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .ctx(|| format!("starting systemd-nspawn for {}", self.name))?;
        self.child = Some(child);
        self.wait_booted().await
    }

    async fn wait_booted(&mut self) -> Result<()> {
        let started = Instant::now();
        let deadline = started + self.options.boot_timeout;
        self.pid1 = 0;
        loop {
            self.check_running()?;
            if let Some(pid) = host::find_container_init(&self.cgroups) {
                self.pid1 = pid;
                break;
            }
            if Instant::now() > deadline {
                return Err(self.boot_error("no container init process appeared"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.boot_error(&format!(
                    "systemd did not finish booting within {:?}",
                    self.options.boot_timeout
                )));
            }
            let out = self
                .exec_timeout(&["systemctl", "is-system-running", "--wait"], remaining)
                .await;
            self.check_running()?;
            match out {
                Ok(out) => match out.stdout_text().trim() {
                    "running" => break,
                    "degraded" => {
                        let failed = self
                            .exec(&["systemctl", "--failed", "--no-legend", "--plain"])
                            .await
                            .map(|o| o.stdout_text())
                            .unwrap_or_default();
                        tracing::warn!(node = %self.name, "booted degraded: {failed}");
                        eprintln!(
                            "inplace-tests: node {} booted degraded: {}",
                            self.name,
                            failed.trim()
                        );
                        break;
                    }
                    _ => {}
                },
                Err(Error::Timeout { .. }) => {
                    return Err(self.boot_error("systemd did not finish booting"));
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tracing::info!(node = %self.name, secs = started.elapsed().as_secs_f64(), "node booted");
        Ok(())
    }

    fn check_running(&mut self) -> Result<()> {
        let exited = match self.child.as_mut() {
            Some(child) => child
                .try_wait()
                .ctx(|| "waiting for systemd-nspawn".to_owned())?,
            None => None,
        };
        match exited {
            Some(status) => Err(self.boot_error(&format!("systemd-nspawn exited ({status})"))),
            None => Ok(()),
        }
    }

    fn boot_error(&self, what: &str) -> Error {
        Error::Node {
            node: self.name.clone(),
            message: format!("{what}; console log tail:\n{}", self.console_log_tail(30)),
        }
    }

    /// The last `lines` lines of the node's console (systemd's boot messages).
    pub fn console_log_tail(&self, lines: usize) -> String {
        let text = std::fs::read(self.dir.join("console.log")).unwrap_or_default();
        tail(&String::from_utf8_lossy(&text), lines)
    }

    /// The node's name (also its hostname and machine name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host pid of the node's systemd (PID 1 inside).
    pub fn pid1(&self) -> i32 {
        self.pid1
    }

    /// The node's root tree as mounted on the host (its overlay). Changes here show up in
    /// the node, but mounts made inside the node (`/run`, `/tmp`, merged `/usr`) do not:
    /// use [`Node::path_on_host`] for those.
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    /// A host path that reaches `path` as the node sees it, mounts included
    /// (`/proc/<pid1>/root/...`). Absolute symlinks inside the node resolve against the
    /// host's root on this path; read through [`Node::read_file`] when that matters.
    pub fn path_on_host(&self, path: impl AsRef<Path>) -> PathBuf {
        let rel = path.as_ref().strip_prefix("/").unwrap_or(path.as_ref());
        PathBuf::from(format!("/proc/{}/root", self.pid1)).join(rel)
    }

    /// Runs a command inside the node (all its namespaces, `nsenter -a`), with the default
    /// timeout. A non-zero exit is not an error here: look at [`ExecOutput::status`].
    pub async fn exec<S: AsRef<OsStr>>(&self, cmd: &[S]) -> Result<ExecOutput> {
        self.run(cmd, None, self.options.exec_timeout).await
    }

    /// [`Node::exec`] with its own timeout.
    pub async fn exec_timeout<S: AsRef<OsStr>>(
        &self,
        cmd: &[S],
        timeout: Duration,
    ) -> Result<ExecOutput> {
        self.run(cmd, None, timeout).await
    }

    /// [`Node::exec`] feeding `input` to the command's standard input.
    pub async fn exec_with_input<S: AsRef<OsStr>>(
        &self,
        cmd: &[S],
        input: Vec<u8>,
    ) -> Result<ExecOutput> {
        self.run(cmd, Some(input), self.options.exec_timeout).await
    }

    /// Runs a command and returns its standard output; a non-zero exit is an error.
    pub async fn exec_ok<S: AsRef<OsStr>>(&self, cmd: &[S]) -> Result<String> {
        Ok(self.exec(cmd).await?.checked()?.stdout_text())
    }

    /// Runs a bash script inside the node.
    pub async fn sh(&self, script: &str) -> Result<ExecOutput> {
        self.exec(&["bash", "-c", script]).await
    }

    /// Runs a bash script inside the node; a non-zero exit is an error.
    pub async fn sh_ok(&self, script: &str) -> Result<String> {
        self.exec_ok(&["bash", "-c", script]).await
    }

    async fn run<S: AsRef<OsStr>>(
        &self,
        cmd: &[S],
        input: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<ExecOutput> {
        let command = cmd
            .iter()
            .map(|s| s.as_ref().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(self.pid1.to_string())
            .args(["-a", "--"])
            .args(cmd)
            .env_clear()
            .env("PATH", NODE_PATH)
            .env("HOME", "/root")
            .env("LANG", "C.UTF-8")
            .env("TERM", "dumb")
            .env("SYSTEMD_PAGER", "")
            .env("SYSTEMD_COLORS", "0")
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = c
            .spawn()
            .ctx(|| format!("running `{command}` in node {}", self.name))?;
        let writer = match (input, child.stdin.take()) {
            (Some(bytes), Some(mut stdin)) => Some(tokio::spawn(async move {
                let result = stdin.write_all(&bytes).await;
                drop(stdin);
                result
            })),
            _ => None,
        };
        let output = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| Error::Timeout {
                what: format!("`{command}` in node {}", self.name),
                after: timeout,
            })?
            .ctx(|| format!("running `{command}` in node {}", self.name))?;
        if let Some(writer) = writer {
            // A command may legitimately stop reading early; its status tells the story.
            let _ = writer.await;
        }
        Ok(ExecOutput {
            command,
            status: output.status,
            stdout: output.stdout,
            stderr: output.stderr,
        })
    }

    /// Writes a file inside the node atomically (temp file + rename), creating parents.
    pub async fn write_file(
        &self,
        path: impl AsRef<Path>,
        contents: &[u8],
        mode: u32,
    ) -> Result<()> {
        let path = absolute(path.as_ref())?;
        let script = r#"set -e; mkdir -p -- "$(dirname -- "$1")"; t="$1.inplace-tmp.$$"; cat > "$t"; chmod "$2" "$t"; mv -f -- "$t" "$1""#;
        self.run(
            &[
                OsStr::new("bash"),
                OsStr::new("-c"),
                OsStr::new(script),
                OsStr::new("write_file"),
                path.as_os_str(),
                OsStr::new(&format!("{mode:o}")),
            ],
            Some(contents.to_vec()),
            self.options.exec_timeout,
        )
        .await?
        .checked()?;
        Ok(())
    }

    /// Copies a host file into the node.
    pub async fn copy_from_host(
        &self,
        host_path: impl AsRef<Path>,
        node_path: impl AsRef<Path>,
        mode: u32,
    ) -> Result<()> {
        let file = NodeFile::from_host(host_path, node_path.as_ref(), mode).await?;
        self.write_file(&file.path, &file.contents, file.mode).await
    }

    /// Reads a file as the node sees it (symlinks and mounts inside the node respected).
    pub async fn read_file(&self, path: impl AsRef<Path>) -> Result<Vec<u8>> {
        let path = absolute(path.as_ref())?;
        Ok(self
            .run(
                &[OsStr::new("cat"), OsStr::new("--"), path.as_os_str()],
                None,
                self.options.exec_timeout,
            )
            .await?
            .checked()?
            .stdout)
    }

    /// Whether `path` exists inside the node.
    pub async fn exists(&self, path: impl AsRef<Path>) -> Result<bool> {
        let path = absolute(path.as_ref())?;
        Ok(self
            .run(
                &[OsStr::new("test"), OsStr::new("-e"), path.as_os_str()],
                None,
                self.options.exec_timeout,
            )
            .await?
            .success())
    }

    /// The size of the file at `path` inside the node; 0 while there is none.
    pub async fn file_size(&self, path: impl AsRef<Path>) -> Result<u64> {
        let path = absolute(path.as_ref())?;
        let stat = self
            .run(
                &[
                    OsStr::new("stat"),
                    OsStr::new("-c"),
                    OsStr::new("%s"),
                    OsStr::new("--"),
                    path.as_os_str(),
                ],
                None,
                self.options.exec_timeout,
            )
            .await?;
        Ok(stat.stdout_text().trim().parse().unwrap_or(0))
    }

    /// `ln -sfn target link` inside the node (parents created).
    pub async fn symlink(&self, target: impl AsRef<Path>, link: impl AsRef<Path>) -> Result<()> {
        let link = absolute(link.as_ref())?;
        self.run(
            &[
                OsStr::new("bash"),
                OsStr::new("-c"),
                OsStr::new(r#"set -e; mkdir -p -- "$(dirname -- "$2")"; ln -sfn -- "$1" "$2""#),
                OsStr::new("symlink"),
                target.as_ref().as_os_str(),
                link.as_os_str(),
            ],
            None,
            self.options.exec_timeout,
        )
        .await?
        .checked()?;
        Ok(())
    }

    /// `systemctl ARGS...` inside the node; a non-zero exit is an error.
    pub async fn systemctl(&self, args: &[&str]) -> Result<String> {
        let mut cmd = vec!["systemctl"];
        cmd.extend_from_slice(args);
        self.exec_ok(&cmd).await
    }

    /// `systemctl is-active UNIT` says `active`.
    pub async fn is_active(&self, unit: &str) -> Result<bool> {
        Ok(self
            .exec(&["systemctl", "is-active", unit])
            .await?
            .stdout_text()
            .trim()
            == "active")
    }

    /// Polls until `unit` is active; the error carries the unit's journal tail.
    pub async fn wait_active(&self, unit: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.is_active(unit).await? {
            if Instant::now() > deadline {
                return Err(Error::Node {
                    node: self.name.clone(),
                    message: format!(
                        "{unit} not active after {timeout:?}; journal:\n{}",
                        self.journal(unit, 30).await.unwrap_or_default()
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// The last `lines` journal lines of a unit.
    pub async fn journal(&self, unit: &str, lines: u32) -> Result<String> {
        self.exec_ok(&[
            "journalctl",
            "--no-pager",
            "-o",
            "short-precise",
            "-n",
            &lines.to_string(),
            "-u",
            unit,
        ])
        .await
    }

    /// A unit's journal as its messages only (`-o cat`): all of it, or what was logged from
    /// `since` on (a `journalctl --since` time, e.g. `@SECONDS`).
    pub async fn messages(&self, unit: &str, since: Option<&str>) -> Result<String> {
        let mut args = vec!["journalctl", "--no-pager", "-o", "cat", "-u", unit];
        if let Some(since) = since {
            args.extend(["--since", since]);
        }
        self.exec_ok(&args).await
    }

    /// Installs a service into the running node: writes its files and unit, reloads systemd,
    /// enables it and (if asked) starts it.
    pub async fn install_service(&self, service: &ServiceInstall) -> Result<()> {
        for file in &service.files {
            self.write_file(&file.path, &file.contents, file.mode)
                .await?;
        }
        self.write_file(service.unit_path(), service.unit.as_bytes(), 0o644)
            .await?;
        self.systemctl(&["daemon-reload"]).await?;
        if service.start {
            self.systemctl(&["enable", "--now", &service.unit_name])
                .await?;
        } else {
            self.systemctl(&["enable", &service.unit_name]).await?;
        }
        Ok(())
    }

    /// Installs a sysext image the way the agent does on Flatcar: the file goes to
    /// `/opt/extensions/<name>/<file name>` and `/etc/extensions/<name>.raw` links to it.
    /// Returns the stored path. Call [`Node::refresh_sysext`] to merge it.
    pub async fn install_sysext(&self, image: &SysextImage) -> Result<String> {
        let file_name = image
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| Error::Invalid(format!("image path {}", image.path.display())))?;
        let stored = format!("/opt/extensions/{}/{file_name}", image.name);
        self.copy_from_host(&image.path, &stored, 0o644).await?;
        self.symlink(&stored, format!("/etc/extensions/{}.raw", image.name))
            .await?;
        Ok(stored)
    }

    /// `systemctl restart systemd-sysext` (unmerge + merge by PID 1); the output tells
    /// whether the job succeeded. Note: systemd 252 fails the job for an image without a
    /// matching `extension-release.<name>`, but skips an image whose release file does not
    /// match the host (ID, VERSION_ID, ARCHITECTURE) and succeeds.
    pub async fn refresh_sysext(&self) -> Result<ExecOutput> {
        self.exec(&["systemctl", "restart", "systemd-sysext.service"])
            .await
    }

    /// Names of the extensions merged now (from the merged
    /// `/usr/lib/extension-release.d/extension-release.<name>` files).
    pub async fn merged_extensions(&self) -> Result<Vec<String>> {
        let out = self
            .sh_ok("ls -1 /usr/lib/extension-release.d/ 2>/dev/null || true")
            .await?;
        let mut names: Vec<String> = out
            .lines()
            .filter_map(|l| l.trim().strip_prefix("extension-release."))
            .map(str::to_owned)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Reboots the node (`systemctl reboot`), keeps its writable layer, boots it again and
    /// waits until systemd is up. Returns how long that took.
    pub async fn reboot_and_wait(&mut self) -> Result<Duration> {
        let started = Instant::now();
        // The command's connection drops as the node goes down; its status means nothing.
        let _ = self
            .exec_timeout(&["systemctl", "reboot"], Duration::from_secs(30))
            .await;
        self.wait_own_reboot(Duration::from_secs(120)).await?;
        Ok(started.elapsed())
    }

    /// Waits up to `patience` for a reboot the node does itself (whoever in it asked
    /// systemd, e.g. through logind), then boots it again from the same root the way a
    /// machine comes back, and waits until systemd is up. systemd-nspawn ends with status
    /// 133 when its container reboots (any other end, or none in time, is an error naming
    /// it): it never restarts the container itself. The next boot has a new boot ID
    /// (systemd-nspawn gives each container start its own).
    pub async fn wait_own_reboot(&mut self, patience: Duration) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Err(self.boot_error("the node is not running"));
        };
        let status = match tokio::time::timeout(patience, child.wait()).await {
            Ok(status) => status.ctx(|| format!("waiting for node {}", self.name))?,
            Err(_) => {
                return Err(self.boot_error(&format!("did not reboot within {patience:?}")));
            }
        };
        self.child = None;
        if status.code() != Some(NSPAWN_REBOOTED) {
            return Err(self.boot_error(&format!(
                "systemd-nspawn exited ({status}), not by a reboot"
            )));
        }
        self.start().await
    }

    /// Cuts the node's power: every process in it (systemd, its units, systemd-nspawn) is
    /// SIGKILLed at once and `/run` (a tmpfs of the container) is lost with them; after
    /// `down` the node boots again from the same root (its writable layer kept) and this
    /// waits until systemd is up. Unlike a real power loss, what reached the host's page
    /// cache survives: this tests what a process left undone, not what a disk forgot.
    pub async fn power_cut_and_boot(&mut self, down: Duration) -> Result<Duration> {
        let started = Instant::now();
        let cgroups = self.cgroups.clone();
        tokio::task::spawn_blocking(move || {
            host::kill_cgroup_trees(&cgroups, Duration::from_secs(20))
        })
        .await
        .map_err(|e| Error::Invalid(format!("power cut task failed: {e}")))??;
        self.wait_exit(Duration::from_secs(20)).await?;
        tokio::time::sleep(down).await;
        self.start().await?;
        Ok(started.elapsed())
    }

    /// Waits for systemd-nspawn to exit, killing it after `patience`.
    async fn wait_exit(&mut self, patience: Duration) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            match tokio::time::timeout(patience, child.wait()).await {
                Ok(status) => {
                    status.ctx(|| format!("waiting for node {}", self.name))?;
                }
                Err(_) => {
                    tracing::warn!(node = %self.name, "did not stop within {patience:?}; killing");
                    let _ = child.kill().await;
                }
            }
        }
        Ok(())
    }

    /// Shuts the node down in order (`systemctl poweroff`) and removes everything it left on
    /// the host (cgroup, mounts, writable layer).
    pub async fn poweroff(mut self) -> Result<()> {
        let _ = self
            .exec_timeout(&["systemctl", "poweroff"], Duration::from_secs(30))
            .await;
        self.wait_exit(Duration::from_secs(90)).await?;
        self.torn_down = true;
        let (dir, cgroups) = (self.dir.clone(), self.cgroups.clone());
        tokio::task::spawn_blocking(move || teardown(&dir, &cgroups))
            .await
            .map_err(|e| Error::Invalid(format!("teardown task failed: {e}")))?
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        if let Err(e) = teardown(&self.dir, &self.cgroups) {
            eprintln!("inplace-tests: cleaning up node {}: {e}", self.name);
        }
    }
}

/// Kills whatever runs in a node's cgroup, unmounts its tree and deletes its directory.
fn teardown(dir: &Path, cgroups: &[PathBuf]) -> Result<()> {
    host::kill_cgroup_trees(cgroups, Duration::from_secs(20))?;
    host::remove_tree_blocking(dir)
}

/// Whether the node in `dir` was left by a test process that no longer runs: the process its
/// `owner` file names is gone, or no owner was recorded within [`OWNERLESS_GRACE`] of the
/// directory's last change. An owner file that is still being written reads empty, like one
/// not yet created: a node another test is booting is never taken for a dead one's.
fn left_by_a_dead_process(dir: &Path) -> bool {
    let owner = std::fs::read_to_string(dir.join("owner")).unwrap_or_default();
    if !owner.trim().is_empty() {
        return !host::identity_alive(&owner);
    }
    std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= OWNERLESS_GRACE)
}

/// Tears down nodes left by test processes that no longer run (crashed, killed). Returns
/// their names. [`Node::boot`] calls this first.
/// A node that another process is tearing down at the same moment may fail to go here; it is
/// logged and skipped.
pub async fn sweep_stale_nodes() -> Result<Vec<String>> {
    let nodes_dir = PathBuf::from(NODES_DIR);
    tokio::task::spawn_blocking(move || {
        let mut swept = Vec::new();
        let Ok(entries) = std::fs::read_dir(&nodes_dir) else {
            return Ok(swept);
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if !left_by_a_dead_process(&dir) {
                continue;
            }
            match teardown(&dir, &host::node_cgroups(&name, true)) {
                Ok(()) => swept.push(name),
                Err(e) => tracing::warn!("sweeping node {name}: {e}"),
            }
        }
        // Groups whose node directory is gone (a teardown that died half-way).
        for base in host::cgroup_bases()
            .into_iter()
            .chain(host::controller_cgroup_bases())
        {
            let Ok(groups) = std::fs::read_dir(&base) else {
                continue;
            };
            for group in groups.flatten() {
                let name = group.file_name().to_string_lossy().into_owned();
                if group.path().is_dir() && !nodes_dir.join(&name).exists() {
                    if let Err(e) =
                        host::kill_cgroup_trees(&[group.path()], Duration::from_secs(20))
                    {
                        tracing::warn!("sweeping cgroup {}: {e}", group.path().display());
                    } else if !swept.contains(&name) {
                        swept.push(name);
                    }
                }
            }
        }
        Ok(swept)
    })
    .await
    .map_err(|e| Error::Invalid(format!("sweep task failed: {e}")))?
}

fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 48
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "node name {name:?}: use 1-48 of [a-z0-9-], starting with a letter or digit"
        )))
    }
}

fn absolute(path: &Path) -> Result<PathBuf> {
    if path.is_absolute() && !path.components().any(|c| c == Component::ParentDir) {
        Ok(path.to_path_buf())
    } else {
        Err(Error::Invalid(format!(
            "node path {} must be absolute without `..`",
            path.display()
        )))
    }
}

/// Writes a file into a not-yet-booted tree on the host.
async fn write_into_tree(root: &Path, file: &NodeFile) -> Result<()> {
    let rel = absolute(&file.path)?;
    let target = root.join(rel.strip_prefix("/").unwrap_or(&rel));
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .ctx(|| format!("creating {}", parent.display()))?;
    }
    tokio::fs::write(&target, &file.contents)
        .await
        .ctx(|| format!("writing {}", target.display()))?;
    use std::os::unix::fs::PermissionsExt;
    tokio::fs::set_permissions(&target, std::fs::Permissions::from_mode(file.mode))
        .await
        .ctx(|| format!("chmod {}", target.display()))
}

/// Runs a host command to completion; a non-zero exit is an error.
async fn run_host(cmd: &mut Command) -> Result<()> {
    let shown = format!("{:?}", cmd.as_std());
    let out = cmd
        .kill_on_drop(true)
        .output()
        .await
        .ctx(|| format!("running {shown}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::CommandFailed {
            command: shown,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name("node-1").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("-x").is_err());
        assert!(validate_name("Node").is_err());
        assert!(validate_name("a/b").is_err());
        let unique = Node::unique_name("Smoke Test");
        assert!(validate_name(&unique).is_ok(), "{unique}");
        assert_ne!(unique, Node::unique_name("Smoke Test"));
    }

    #[test]
    fn a_node_whose_owner_is_being_written_is_not_swept() {
        let dir = tempfile::tempdir().unwrap();
        let owner = dir.path().join("owner");
        std::fs::write(&owner, "").unwrap();
        assert!(
            !left_by_a_dead_process(dir.path()),
            "owner file not yet written"
        );
        std::fs::remove_file(&owner).unwrap();
        assert!(!left_by_a_dead_process(dir.path()), "no owner file yet");
        let mine = host::process_identity(std::process::id()).unwrap();
        std::fs::write(&owner, &mine).unwrap();
        assert!(!left_by_a_dead_process(dir.path()), "a running owner");
        std::fs::write(&owner, format!("{} 1", std::process::id())).unwrap();
        assert!(
            left_by_a_dead_process(dir.path()),
            "an owner whose process has ended"
        );
    }

    #[test]
    fn node_paths_must_be_absolute() {
        assert!(absolute(Path::new("/etc/x")).is_ok());
        assert!(absolute(Path::new("etc/x")).is_err());
        assert!(absolute(Path::new("/etc/../x")).is_err());
    }
}
