//! Real systemd-sysext images: a tree with `usr/...` and
//! `usr/lib/extension-release.d/extension-release.<name>`, packed by `mksquashfs` into a
//! `.raw` file like Flatcar's `kubernetes-vX.Y.Z-x86-64.raw`.
//!
//! ```no_run
//! # async fn demo() -> inplace_tests::Result<()> {
//! use inplace_tests::fake_kubelet::FakeKubeletConfig;
//! use inplace_tests::sysext::kubernetes_sysext;
//! let dir = tempfile::tempdir().expect("tempdir");
//! let image = kubernetes_sysext("/path/to/fake-kubelet".as_ref(), &FakeKubeletConfig::healthy("v1.31.2"))
//!     .await?
//!     .build(&dir.path().join("kubernetes-v1.31.2-x86-64.raw"))
//!     .await?;
//! println!("{} {} bytes sha256 {}", image.path.display(), image.size, image.sha256);
//! # Ok(()) }
//! ```

use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::process::Command;

use crate::error::IoContext;
use crate::fake_kubelet::{CONFIG_PATH, FakeKubeletConfig};
use crate::nspawn::{NodeFile, NodeOptions, ServiceInstall, Suite};
use crate::{Error, Result, prereq};

mod cache;

/// systemd's name for this machine's architecture (`x86-64`, `arm64`, ...).
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x86-64",
        "aarch64" => "arm64",
        "x86" => "x86",
        "arm" => "arm",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// The contents of `extension-release.<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionRelease {
    /// Must equal the host's os-release `ID`, or be `_any`.
    pub id: String,
    /// Must equal the host's `VERSION_ID` (when no `SYSEXT_LEVEL` is given).
    pub version_id: Option<String>,
    /// Must equal the host's `SYSEXT_LEVEL` when present.
    pub sysext_level: Option<String>,
    /// Must equal the host's architecture, or be `_any`, when present.
    pub architecture: Option<String>,
}

impl ExtensionRelease {
    /// Matches the default test nodes: Debian 12 on this machine's architecture.
    pub fn debian_bookworm() -> Self {
        Self::debian(Suite::Bookworm)
    }

    /// Matches the nodes of `suite` (Debian 12 or 13) on this machine's architecture.
    pub fn debian(suite: Suite) -> Self {
        Self {
            id: "debian".to_owned(),
            version_id: Some(suite.version_id().to_owned()),
            sysext_level: None,
            architecture: Some(host_architecture().to_owned()),
        }
    }

    /// Matches any OS (`ID=_any`), as the sysext-bakery images do.
    pub fn any() -> Self {
        Self {
            id: "_any".to_owned(),
            version_id: None,
            sysext_level: None,
            architecture: Some(host_architecture().to_owned()),
        }
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut s = format!("ID={}\n", self.id);
        for (key, value) in [
            ("VERSION_ID", &self.version_id),
            ("SYSEXT_LEVEL", &self.sysext_level),
            ("ARCHITECTURE", &self.architecture),
        ] {
            if let Some(v) = value {
                s.push_str(&format!("{key}={v}\n"));
            }
        }
        s
    }
}

/// Ways to make an image that systemd-sysext skips (while still exiting 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incompatibility {
    /// `ID=fedora` on a Debian node.
    WrongId,
    /// `VERSION_ID=11` on Debian 12.
    WrongVersion,
    /// An architecture other than the node's.
    WrongArchitecture,
    /// The release file is named for another extension than the image.
    WrongReleaseName,
    /// No release file at all.
    MissingRelease,
}

/// One built image.
#[derive(Debug, Clone)]
pub struct SysextImage {
    /// Extension name (the image is found as `<name>.raw`).
    pub name: String,
    /// Where the image file is.
    pub path: PathBuf,
    /// Lower-case hex sha256 of the file.
    pub sha256: String,
    /// File size in bytes.
    pub size: u64,
}

impl SysextImage {
    /// The image's bytes.
    pub async fn bytes(&self) -> Result<Vec<u8>> {
        tokio::fs::read(&self.path)
            .await
            .ctx(|| format!("reading {}", self.path.display()))
    }

    /// A copy of this image at `out` with one more file, `name` at the image's root, holding
    /// `contents`: another image (its own sha256) with the same merged `/usr`, since
    /// systemd-sysext merges only `/usr` and `/opt`. mksquashfs appends it without compressing
    /// the image again. For a test that needs many distinct revisions of one image.
    pub async fn with_root_file(&self, name: &str, contents: &[u8], out: &Path) -> Result<Self> {
        let staging = tempfile::tempdir().ctx(|| "creating a staging directory".to_owned())?;
        let file = staging.path().join(name);
        tokio::fs::write(&file, contents)
            .await
            .ctx(|| format!("writing {}", file.display()))?;
        // The appended root takes the staging directory's mode: 0755 as a packed image's.
        use std::os::unix::fs::PermissionsExt;
        tokio::fs::set_permissions(staging.path(), std::fs::Permissions::from_mode(0o755))
            .await
            .ctx(|| format!("chmod {}", staging.path().display()))?;
        tokio::fs::copy(&self.path, out)
            .await
            .ctx(|| format!("copying {} to {}", self.path.display(), out.display()))?;
        // Appended: the directory's entries join the existing image's root.
        pack(&self.name, staging.path(), out, true).await
    }
}

#[derive(Debug, Clone)]
enum Entry {
    File { contents: Vec<u8>, mode: u32 },
    Symlink { target: PathBuf },
}

/// Builds one sysext image from files given in memory.
#[derive(Debug, Clone)]
pub struct SysextBuilder {
    name: String,
    release: Option<ExtensionRelease>,
    /// Where the release file goes: `usr/lib/extension-release.d` in a system extension,
    /// `etc/extension-release.d` in a configuration extension.
    release_dir: &'static str,
    release_file_name: String,
    entries: Vec<(PathBuf, Entry)>,
}

impl SysextBuilder {
    /// An image for extension `name`, compatible with the test nodes
    /// ([`ExtensionRelease::debian_bookworm`]).
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            release: Some(ExtensionRelease::debian_bookworm()),
            release_dir: "usr/lib/extension-release.d",
            release_file_name: format!("extension-release.{name}"),
            entries: Vec::new(),
        }
    }

    /// A configuration extension image (`systemd-confext`, systemd >= 254) for `name`: its
    /// files go below `etc/`, its release file is `etc/extension-release.d/
    /// extension-release.<name>`; compatible with `suite`'s nodes.
    pub fn confext(name: &str, suite: Suite) -> Self {
        Self {
            release: Some(ExtensionRelease::debian(suite)),
            release_dir: "etc/extension-release.d",
            ..Self::new(name)
        }
    }

    /// Adds a file at `path` (relative to the image root, e.g. `usr/bin/kubelet`).
    #[must_use]
    pub fn file(
        mut self,
        path: impl Into<PathBuf>,
        contents: impl Into<Vec<u8>>,
        mode: u32,
    ) -> Self {
        self.entries.push((
            path.into(),
            Entry::File {
                contents: contents.into(),
                mode,
            },
        ));
        self
    }

    /// Adds a symlink at `path` pointing to `target`.
    #[must_use]
    pub fn symlink(mut self, path: impl Into<PathBuf>, target: impl Into<PathBuf>) -> Self {
        self.entries.push((
            path.into(),
            Entry::Symlink {
                target: target.into(),
            },
        ));
        self
    }

    /// Replaces the extension-release content (`None`: no release file).
    #[must_use]
    pub fn release(mut self, release: Option<ExtensionRelease>) -> Self {
        self.release = release;
        self
    }

    /// Makes the image one that systemd-sysext will skip.
    #[must_use]
    pub fn incompatible(mut self, how: Incompatibility) -> Self {
        let mut release = ExtensionRelease::debian_bookworm();
        match how {
            Incompatibility::WrongId => release.id = "fedora".to_owned(),
            Incompatibility::WrongVersion => release.version_id = Some("11".to_owned()),
            Incompatibility::WrongArchitecture => {
                release.architecture = Some(
                    if host_architecture() == "arm64" {
                        "x86-64"
                    } else {
                        "arm64"
                    }
                    .to_owned(),
                );
            }
            Incompatibility::WrongReleaseName => {
                self.release_file_name = format!("extension-release.{}-other", self.name);
            }
            Incompatibility::MissingRelease => {
                self.release = None;
                return self;
            }
        }
        self.release = Some(release);
        self
    }

    /// The extension name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Packs the image into `out` (parent directories created, existing file replaced).
    pub async fn build(&self, out: &Path) -> Result<SysextImage> {
        prereq::require_squashfs_tools()?;
        let staging = tempfile::tempdir().ctx(|| "creating a staging directory".to_owned())?;
        let root = staging.path().join("tree");
        let mut entries = self.entries.clone();
        if let Some(release) = &self.release {
            entries.push((
                Path::new(self.release_dir).join(&self.release_file_name),
                Entry::File {
                    contents: release.render().into_bytes(),
                    mode: 0o644,
                },
            ));
        }
        for (path, entry) in &entries {
            let rel = relative(path)?;
            let target = root.join(rel);
            if let Some(parent) = target.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .ctx(|| format!("creating {}", parent.display()))?;
            }
            match entry {
                Entry::File { contents, mode } => {
                    tokio::fs::write(&target, contents)
                        .await
                        .ctx(|| format!("writing {}", target.display()))?;
                    use std::os::unix::fs::PermissionsExt;
                    tokio::fs::set_permissions(&target, std::fs::Permissions::from_mode(*mode))
                        .await
                        .ctx(|| format!("chmod {}", target.display()))?;
                }
                Entry::Symlink { target: to } => {
                    tokio::fs::symlink(to, &target)
                        .await
                        .ctx(|| format!("symlink {}", target.display()))?;
                }
            }
        }
        // Directories 0755 whatever the umask, so the merged /usr stays traversable.
        let chmod = Command::new("chmod")
            .args(["-R", "u+rwX,go+rX,go-w"])
            .arg(&root)
            .output()
            .await
            .ctx(|| "chmod -R".to_owned())?;
        check("chmod -R", &chmod)?;
        if let Some(parent) = out.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .ctx(|| format!("creating {}", parent.display()))?;
        }
        let _ = tokio::fs::remove_file(out).await;
        pack(&self.name, &root, out, false).await
    }
}

/// A Flatcar-style `kubernetes` extension: `usr/bin/kubelet` (the fake kubelet binary at
/// `fake_kubelet`), its behaviour file, and `usr/lib/systemd/system/kubelet.service`.
pub async fn kubernetes_sysext(
    fake_kubelet: &Path,
    config: &FakeKubeletConfig,
) -> Result<SysextBuilder> {
    let binary = tokio::fs::read(fake_kubelet)
        .await
        .ctx(|| format!("reading {}", fake_kubelet.display()))?;
    Ok(SysextBuilder::new("kubernetes")
        .file("usr/bin/kubelet", binary, 0o755)
        .file(
            CONFIG_PATH.trim_start_matches('/'),
            config.render().into_bytes(),
            0o644,
        )
        .file(
            "usr/lib/systemd/system/kubelet.service",
            KUBELET_UNIT.as_bytes().to_vec(),
            0o644,
        ))
}

/// The kubelet unit shipped in [`kubernetes_sysext`] images: crash loops forever under
/// `Restart=always` when the build crashes.
pub const KUBELET_UNIT: &str = "[Unit]
Description=kubelet (inplace test-bed stand-in)
StartLimitIntervalSec=0

[Service]
Type=simple
ExecStart=/usr/bin/kubelet
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
";

/// Flatcar's file name for a kubernetes extension: `kubernetes-v1.31.2-x86-64.raw`.
pub fn kubernetes_image_file_name(version: &str) -> String {
    format!("kubernetes-{version}-{}.raw", host_architecture())
}

/// A `SHA256SUMS` file as sysext-bakery publishes it: `<sha256>  <file name>` lines.
pub fn sha256sums<'a>(entries: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    entries
        .into_iter()
        .map(|(name, bytes)| format!("{}  {name}\n", sha256_hex(bytes)))
        .collect()
}

/// Lower-case hex sha256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `len` bytes that compress badly (xorshift), so that nothing along the way can shortcut
/// them: neither mksquashfs (an image padded with them stays larger than they are) nor a
/// transfer.
pub fn incompressible(len: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn relative(path: &Path) -> Result<&Path> {
    let rel = path.strip_prefix("/").unwrap_or(path);
    if rel.as_os_str().is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(Error::Invalid(format!("image path {}", path.display())));
    }
    Ok(rel)
}

/// The compressor of the beds' images: zstd at level 1 packed a real kubelet (80 MiB) in
/// 0.3 CPU-seconds into 26.5 MB, mksquashfs's default (gzip) in 9.3 into 25.1 MB
/// (docs/development/testing.md § Where the time goes). The agent reads either the same way:
/// the kernel merges the image.
pub const COMPRESSION: [&str; 4] = ["-comp", "zstd", "-Xcompression-level", "1"];

/// Packs `tree` into the squashfs image `out` (or appends it to the image there), with no
/// owner, time or xattr of the build machine, so the same content gives the same bytes.
async fn pack(name: &str, tree: &Path, out: &Path, append: bool) -> Result<SysextImage> {
    let mut command = Command::new("mksquashfs");
    command.arg(tree).arg(out);
    // An append also writes a recovery file into the current directory, unless told not to,
    // and keeps the image's compressor.
    if append {
        command.arg("-no-recovery");
    } else {
        command.arg("-noappend").args(COMPRESSION);
    }
    let output = command
        .args([
            "-all-root",
            "-no-xattrs",
            "-quiet",
            "-no-progress",
            "-mkfs-time",
            "0",
            "-all-time",
            "0",
        ])
        .kill_on_drop(true)
        .output()
        .await
        .ctx(|| "running mksquashfs".to_owned())?;
    check(
        &format!("mksquashfs {} {}", tree.display(), out.display()),
        &output,
    )?;
    let bytes = tokio::fs::read(out)
        .await
        .ctx(|| format!("reading {}", out.display()))?;
    Ok(SysextImage {
        name: name.to_owned(),
        path: out.to_path_buf(),
        sha256: sha256_hex(&bytes),
        size: bytes.len() as u64,
    })
}

fn check(what: &str, output: &std::process::Output) -> Result<()> {
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::CommandFailed {
            command: what.to_owned(),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// The job of Flatcar's `ensure-sysext.service`: systemd loads its units before
/// systemd-sysext merges the images, so a unit that an image brings (the kubelet's) is unknown
/// at boot until the manager reloads; then the targets are started again so that units from
/// images that are wanted start too. Without it a rebooted node has no kubelet.
const ENSURE_SYSEXT_UNIT: &str = "[Unit]
Description=Reload units brought by system extensions and start them
BindsTo=systemd-sysext.service
After=systemd-sysext.service
DefaultDependencies=no
Before=sysinit.target shutdown.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/systemctl daemon-reload
ExecStart=/usr/bin/systemctl restart --no-block sockets.target timers.target multi-user.target

[Install]
WantedBy=sysinit.target
";

/// Makes a node start, at every boot, `units` that its extensions bring, as Flatcar does:
/// the test bed's root enables `systemd-sysext.service` (Debian ships it disabled), but a
/// unit from an image is unknown to the manager until it reloads after the merge
/// (`ensure-sysext.service`). The units are wanted by a drop-in of `multi-user.target` (a
/// file): `systemctl enable` cannot see a unit that is not merged yet.
pub fn merge_at_boot(options: &mut NodeOptions, units: &[&str]) {
    let wants: String = units.iter().map(|u| format!("Wants={u}\n")).collect();
    options.files.push(NodeFile::new(
        "/etc/systemd/system/multi-user.target.d/extension-units.conf",
        format!("[Unit]\n{wants}"),
        0o644,
    ));
    ServiceInstall::new("ensure-sysext.service", ENSURE_SYSEXT_UNIT).into_boot_options(options);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_files_render() {
        assert_eq!(
            ExtensionRelease::debian_bookworm().render(),
            format!(
                "ID=debian\nVERSION_ID=12\nARCHITECTURE={}\n",
                host_architecture()
            )
        );
        assert!(ExtensionRelease::any().render().starts_with("ID=_any\n"));
    }

    #[test]
    fn image_paths_stay_inside() {
        assert!(relative(Path::new("usr/bin/x")).is_ok());
        assert!(relative(Path::new("/usr/bin/x")).is_ok());
        assert!(relative(Path::new("usr/../x")).is_err());
        assert!(relative(Path::new("")).is_err());
    }

    #[test]
    fn sums_look_like_sha256sum_output() {
        let sums = sha256sums([("a.raw", b"abc".as_slice())]);
        assert_eq!(
            sums,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  a.raw\n"
        );
    }
}
