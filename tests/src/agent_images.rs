//! Agent sysext images at other versions than the running one, signed as a release pipeline
//! signs them (docs/usage/agent-updates.md): the new agents an agent switch installs, good
//! and broken. Used by the agent-update suites and by the demo's `--agent-update`.
//!
//! An agent at another version is a copy of the workspace's debug build with the version
//! stamped into it ([`stamp_version`], as `inplace_agent::build_version` reads it): one
//! build serves every version, where compiling the agent again per version cost the first
//! suite about nine CPU-minutes of dependencies in a target directory of its own and each
//! version about 90 s. The build has the agent's `failpoints` (its package's tests switch
//! the feature on, and the workspace build is one), which fire only when armed.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use minisign::KeyPair;

use crate::apiserver::repo_root;

/// The version of agent build `n` made from this tree for the switch suites: one patch
/// above `current` with the pre-release `next.<n>` (`0.1.0` -> `0.1.1-next.2`). Above the
/// running build, as an update must be (nodes refuse a lower version as a downgrade), and
/// ordered by `n`. `scripts/demo.sh` computes the same for the demo's v2.
pub fn next_version(current: &str, n: u32) -> String {
    let release = current.split(['-', '+']).next().unwrap_or(current);
    let mut parts: Vec<u64> = release.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    parts.resize(3, 0);
    format!("{}.{}.{}-next.{n}", parts[0], parts[1], parts[2] + 1)
}

/// What the new agent does when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// The real agent at the image's version.
    Works,
    /// Exits 1 at start: never sends READY=1, never confirms.
    ExitsAtStart,
    /// Starts and never sends READY=1 (systemd's start timeout ends it).
    HangsBeforeReady,
    /// The real agent, but the image's vendor layer names a kubeconfig whose credential the
    /// API server refuses (401): it cannot write its status, so it never confirms.
    IdentityRefused,
}

/// A release key, as `minisign -G` makes it.
pub struct ReleaseKey(KeyPair);

impl ReleaseKey {
    /// A new key pair without a password.
    pub fn generate() -> anyhow::Result<ReleaseKey> {
        Ok(ReleaseKey(
            KeyPair::generate_unencrypted_keypair().context("generating a minisign key")?,
        ))
    }

    /// The public key file (`release.pub`), as the node's trusted_keys_dir holds it.
    pub fn public_file(&self) -> anyhow::Result<String> {
        Ok(self.0.pk.to_box()?.into_string())
    }

    /// Writes `<image>.minisig` with the trusted comment docs/usage/agent-updates.md asks
    /// for (`file:<name> version:<version>`) and returns its path.
    pub fn sign(&self, image: &Path, version: &str) -> anyhow::Result<PathBuf> {
        let name = file_name(image)?;
        let bytes = std::fs::read(image).with_context(|| format!("reading {}", image.display()))?;
        let signature = minisign::sign(
            Some(&self.0.pk),
            &self.0.sk,
            Cursor::new(bytes),
            Some(&format!("file:{name} version:{version}")),
            None,
        )
        .with_context(|| format!("signing {name}"))?;
        let path = image.with_file_name(format!("{name}.minisig"));
        std::fs::write(&path, signature.into_string())
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

/// Where [`agent_binary_at`] leaves `inplace-agent-<version>` for a test binary
/// (`<target>/agent-versions/bin`): the layout the demo's `--agent-bin-dir` reads.
pub fn agent_bin_dir() -> anyhow::Result<PathBuf> {
    let agent = crate::workspace_build::workspace_bin("inplace-agent")?;
    let target = agent
        .ancestors()
        .nth(2)
        .context("the agent is not in <target>/<profile>")?;
    Ok(target.join("agent-versions").join("bin"))
}

/// The workspace's agent (debug, from this tree) stamped with `version`, as
/// `<agent_bin_dir>/inplace-agent-<version>`. Put in place by a rename, so that a test
/// reading another version's binary, or this one's from an earlier run, never reads a
/// half-written file.
pub fn agent_binary_at(version: &str) -> anyhow::Result<PathBuf> {
    let agent = crate::workspace_build::workspace_bin("inplace-agent")?;
    let binary = std::fs::read(&agent).with_context(|| format!("reading {}", agent.display()))?;
    let stamped = stamp_version(binary, version)?;
    let bin_dir = agent_bin_dir()?;
    std::fs::create_dir_all(&bin_dir)?;
    let name = format!("inplace-agent-{version}");
    let copy = bin_dir.join(&name);
    let partial = bin_dir.join(format!(".{name}.{}.partial", std::process::id()));
    std::fs::write(&partial, stamped).context("writing the stamped agent")?;
    std::fs::set_permissions(
        &partial,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    std::fs::rename(&partial, &copy).with_context(|| format!("renaming to {}", copy.display()))?;
    Ok(copy)
}

/// The mark `inplace_agent`'s version stamp starts with (`VERSION_STAMP_MARK` there: this
/// crate does not depend on the agent's), and the room after it.
const VERSION_STAMP_MARK: &[u8] = b"inplace-agent version stamp:";
const VERSION_STAMP_ROOM: usize = 64;

/// `binary` (an agent build) with its version stamp set to `version`: the bytes after the
/// stamp's mark, NUL-padded. Refuses a binary without exactly one mark.
pub fn stamp_version(mut binary: Vec<u8>, version: &str) -> anyhow::Result<Vec<u8>> {
    let marks: Vec<usize> = binary
        .windows(VERSION_STAMP_MARK.len())
        .enumerate()
        .filter(|(_, window)| *window == VERSION_STAMP_MARK)
        .map(|(at, _)| at)
        .collect();
    let [mark] = marks[..] else {
        bail!(
            "the agent binary has {} version stamps, not one",
            marks.len()
        );
    };
    if version.len() > VERSION_STAMP_ROOM {
        bail!("version {version:?} is longer than the stamp's {VERSION_STAMP_ROOM} bytes");
    }
    let field = mark + VERSION_STAMP_MARK.len();
    let room = binary
        .get_mut(field..field + VERSION_STAMP_ROOM)
        .context("the version stamp is cut off")?;
    room.fill(0);
    room[..version.len()].copy_from_slice(version.as_bytes());
    Ok(binary)
}

/// The agent's sysext image at `version` (`packaging/node/build-sysext.sh`, as `make
/// packages` builds it, but compressed as the beds' images are: [`crate::sysext::COMPRESSION`])
/// in `out`, whose agent behaves as `behaviour` says: `binary` for [`Behaviour::Works`] and
/// [`Behaviour::IdentityRefused`], a script for the others. `refused` is the kubeconfig an
/// [`Behaviour::IdentityRefused`] image carries in its vendor layer.
pub fn agent_image(
    behaviour: Behaviour,
    binary: &Path,
    version: &str,
    out: &Path,
    refused: &str,
) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let binary = match behaviour {
        Behaviour::Works | Behaviour::IdentityRefused => binary.to_owned(),
        Behaviour::ExitsAtStart => script(out, "exits", "echo 'broken agent' >&2\nexit 1")?,
        Behaviour::HangsBeforeReady => script(
            out,
            "hangs",
            "echo 'agent hangs before READY=1' >&2\nexec sleep infinity",
        )?,
    };
    let dir = out.join(format!("{behaviour:?}"));
    let built = run(
        Command::new(repo_root().join("packaging/node/build-sysext.sh"))
            .env("COMPRESSION", "zstd")
            .arg(&binary)
            .arg(version)
            .arg(&dir),
    )?;
    let image = PathBuf::from(built.trim());
    if behaviour == Behaviour::IdentityRefused {
        replace_vendor_credential(&image, refused)?;
    }
    Ok(image)
}

/// The sha256 of `bytes` as a plan writes it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn file_name(path: &Path) -> anyhow::Result<&str> {
    path.file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no file name", path.display()))
}

fn script(out: &Path, name: &str, body: &str) -> anyhow::Result<PathBuf> {
    let path = out.join(format!("inplace-agent-{name}"));
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n"))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Unpacks the image, points the vendor layer's `kubeconfig` at a file in the image holding
/// `kubeconfig`, and packs it again the way build-sysext.sh does.
fn replace_vendor_credential(image: &Path, kubeconfig: &str) -> anyhow::Result<()> {
    let tree = image.with_extension("tree");
    run(Command::new("unsquashfs")
        .args(["-q", "-n", "-d"])
        .arg(&tree)
        .arg(image))?;
    let vendor = tree.join("usr/lib/inplace");
    std::fs::write(vendor.join("refused.kubeconfig"), kubeconfig)?;
    let config = std::fs::read_to_string(vendor.join("agent.toml"))?;
    let config = config.replacen(
        "[kubernetes]\n",
        "[kubernetes]\nkubeconfig = \"/usr/lib/inplace/refused.kubeconfig\"\n",
        1,
    );
    if !config.contains("refused.kubeconfig") {
        bail!("the vendor agent.toml has no [kubernetes] section");
    }
    std::fs::write(vendor.join("agent.toml"), config)?;
    run(Command::new("mksquashfs")
        .arg(&tree)
        .arg(image)
        .args(["-all-root", "-noappend", "-quiet", "-no-progress"])
        .args(crate::sysext::COMPRESSION))?;
    std::fs::remove_dir_all(&tree)?;
    Ok(())
}

/// Runs `command` to completion; its standard output, or an error with its standard error.
fn run(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamped_agent_reports_the_stamped_version_and_runs_as_before() {
        let binary = agent_binary_at("9.8.7-stamp.1").unwrap();
        let printed = run(Command::new(&binary).arg("--version")).unwrap();
        assert_eq!(printed.trim(), "inplace-agent 9.8.7-stamp.1");
        let usage = run(Command::new(&binary).arg("--help")).unwrap();
        assert!(usage.contains("NodeUpdatePlan"), "{usage}");
    }

    #[test]
    fn a_binary_without_exactly_one_stamp_is_refused() {
        let mut one = b"code".to_vec();
        one.extend_from_slice(VERSION_STAMP_MARK);
        one.extend_from_slice(&[0; VERSION_STAMP_ROOM]);
        let stamped = stamp_version(one.clone(), "1.2.3").unwrap();
        assert!(stamped.windows(5).any(|w| w == b"1.2.3"));
        let none = stamp_version(b"no stamp here".to_vec(), "1.2.3").unwrap_err();
        assert!(none.to_string().contains("0 version stamps"), "{none}");
        let two = stamp_version([one.clone(), one.clone()].concat(), "1.2.3").unwrap_err();
        assert!(two.to_string().contains("2 version stamps"), "{two}");
        let long = stamp_version(one, &"9".repeat(VERSION_STAMP_ROOM + 1)).unwrap_err();
        assert!(long.to_string().contains("longer than"), "{long}");
    }
}
