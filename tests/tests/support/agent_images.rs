//! Agent sysext images at other versions than the running one, signed as a release pipeline
//! signs them (docs/usage/agent-updates.md): the new agents an agent switch installs, good
//! and broken.
//!
//! A second version is built from this tree with `INPLACE_AGENT_VERSION` set at build time
//! (`inplace_agent::BUILD_VERSION`), in a target directory of its own: building it in the
//! test's target directory would replace the `inplace-agent` that other suites run while
//! they run. The first build there compiles the agent's dependencies once (debug, about four
//! CPU-minutes); each other version then rebuilds only the agent crate.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::Command;

use minisign::KeyPair;

use super::packaging::repo;

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
    pub fn generate() -> ReleaseKey {
        ReleaseKey(KeyPair::generate_unencrypted_keypair().unwrap())
    }

    /// The public key file (`release.pub`), as the node's trusted_keys_dir holds it.
    pub fn public_file(&self) -> String {
        self.0.pk.to_box().unwrap().into_string()
    }

    /// Writes `<image>.minisig` with the trusted comment docs/usage/agent-updates.md asks
    /// for (`file:<name> version:<version>`) and returns its path.
    pub fn sign(&self, image: &Path, version: &str) -> PathBuf {
        let name = image.file_name().unwrap().to_str().unwrap();
        let signature = minisign::sign(
            Some(&self.0.pk),
            &self.0.sk,
            Cursor::new(std::fs::read(image).unwrap()),
            Some(&format!("file:{name} version:{version}")),
            None,
        )
        .unwrap();
        let path = image.with_file_name(format!("{name}.minisig"));
        std::fs::write(&path, signature.into_string()).unwrap();
        path
    }
}

/// The agent binary built at `version`; a copy per version, so that tests asking for
/// different versions at once never read one another's.
pub fn agent_binary_at(version: &str) -> PathBuf {
    let target = std::env::current_exe()
        .unwrap()
        .ancestors()
        .nth(3)
        .unwrap()
        .join("agent-versions");
    std::fs::create_dir_all(&target).unwrap();
    let lock = std::fs::File::create(target.join("build.lock")).unwrap();
    lock.lock().unwrap();
    let status = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .current_dir(repo())
        .args([
            "build",
            "-q",
            "-p",
            "inplace-agent",
            "--bin",
            "inplace-agent",
        ])
        .arg("--target-dir")
        .arg(&target)
        .env("INPLACE_AGENT_VERSION", version)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build of the agent at {version}");
    let copy = target
        .join("by-version")
        .join(version)
        .join("inplace-agent");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(target.join("debug").join("inplace-agent"), &copy).unwrap();
    copy
}

/// The agent's sysext image at `version` (`packaging/node/build-sysext.sh`, as `make
/// packages` builds it) whose agent behaves as `behaviour` says, in `out`. `refused` is the
/// kubeconfig an [`Behaviour::IdentityRefused`] image carries in its vendor layer.
pub fn agent_image(behaviour: Behaviour, version: &str, out: &Path, refused: &str) -> PathBuf {
    std::fs::create_dir_all(out).unwrap();
    let binary = match behaviour {
        Behaviour::Works | Behaviour::IdentityRefused => agent_binary_at(version),
        Behaviour::ExitsAtStart => script(out, "exits", "echo 'broken agent' >&2\nexit 1"),
        Behaviour::HangsBeforeReady => script(
            out,
            "hangs",
            "echo 'agent hangs before READY=1' >&2\nexec sleep infinity",
        ),
    };
    let dir = out.join(format!("{behaviour:?}"));
    let built = Command::new(repo().join("packaging/node/build-sysext.sh"))
        .arg(&binary)
        .arg(version)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let image = PathBuf::from(String::from_utf8(built.stdout).unwrap().trim());
    if behaviour == Behaviour::IdentityRefused {
        replace_vendor_credential(&image, refused);
    }
    image
}

/// The sha256 of `bytes` as a plan writes it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn script(out: &Path, name: &str, body: &str) -> PathBuf {
    let path = out.join(format!("inplace-agent-{name}"));
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    path
}

/// Unpacks the image, points the vendor layer's `kubeconfig` at a file in the image holding
/// `kubeconfig`, and packs it again the way build-sysext.sh does.
fn replace_vendor_credential(image: &Path, kubeconfig: &str) {
    let tree = image.with_extension("tree");
    run(Command::new("unsquashfs")
        .args(["-q", "-n", "-d"])
        .arg(&tree)
        .arg(image));
    let vendor = tree.join("usr/lib/inplace");
    std::fs::write(vendor.join("refused.kubeconfig"), kubeconfig).unwrap();
    let config = std::fs::read_to_string(vendor.join("agent.toml")).unwrap();
    let config = config.replacen(
        "[kubernetes]\n",
        "[kubernetes]\nkubeconfig = \"/usr/lib/inplace/refused.kubeconfig\"\n",
        1,
    );
    assert!(
        config.contains("refused.kubeconfig"),
        "no [kubernetes] section"
    );
    std::fs::write(vendor.join("agent.toml"), config).unwrap();
    run(Command::new("mksquashfs").arg(&tree).arg(image).args([
        "-all-root",
        "-noappend",
        "-quiet",
        "-no-progress",
    ]));
    std::fs::remove_dir_all(&tree).unwrap();
}

fn run(command: &mut Command) {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
