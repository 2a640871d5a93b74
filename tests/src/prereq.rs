//! Checks that the host can run the real test beds. Missing pieces are errors with an
//! install hint, never a silent skip.

use std::path::Path;

use crate::{Error, Result};

/// The packages `scripts/install-deps.sh` installs for the real test beds.
pub const INSTALL_HINT: &str = "run `scripts/install-deps.sh` (or `apt-get install systemd-container \
                                debootstrap squashfs-tools`) and run the tests as root";

fn find_in_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].iter().map(Into::into))
        .any(|dir| Path::new(&dir).join(tool).is_file())
}

/// Fails unless every named tool is on `PATH`.
pub fn require_tools(tools: &[&str]) -> Result<()> {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !find_in_path(t)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::MissingPrerequisite {
            what: format!("command(s) {}", missing.join(", ")),
            hint: INSTALL_HINT.to_owned(),
        })
    }
}

/// Fails unless the process runs as root.
pub fn require_root() -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(Error::MissingPrerequisite {
            what: "root privileges (systemd-nspawn, mount, mknod)".to_owned(),
            hint: INSTALL_HINT.to_owned(),
        })
    }
}

/// Everything [`crate::nspawn::Node::boot`] needs.
pub fn require_nspawn() -> Result<()> {
    require_root()?;
    require_tools(&["systemd-nspawn", "debootstrap", "nsenter", "mount", "mknod"])
}

/// Everything [`crate::sysext`] needs.
pub fn require_squashfs_tools() -> Result<()> {
    require_tools(&["mksquashfs", "unsquashfs"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tools_name_what_to_install() {
        let err = require_tools(&["sh", "no-such-tool-inplace"]).expect_err("missing");
        let text = err.to_string();
        assert!(text.contains("no-such-tool-inplace"), "{text}");
        assert!(text.contains("install-deps.sh"), "{text}");
        assert!(require_tools(&["sh"]).is_ok());
    }
}
