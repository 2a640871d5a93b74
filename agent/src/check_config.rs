//! What `inplace-agent check-config` checks beyond parsing: the things a configuration
//! names on the node. Blocking; meant for the command line, not the agent's runtime.

use std::path::{Path, PathBuf};

use crate::settings::Policy;
use crate::signature::{self, TrustedKey};

/// Why the trusted keys directory cannot serve the policy.
#[derive(Debug, thiserror::Error)]
pub enum KeysProblem {
    /// Signatures are required but the directory does not exist.
    #[error(
        "policy.require_signatures is true but the trusted keys directory {dir} does not exist"
    )]
    Missing {
        /// The directory.
        dir: PathBuf,
    },
    /// Signatures are required but the directory holds no `*.pub` key.
    #[error(
        "policy.require_signatures is true but the trusted keys directory {dir} holds no minisign public key (*.pub)"
    )]
    Empty {
        /// The directory.
        dir: PathBuf,
    },
    /// The directory or a key file in it cannot be read, or a key file does not parse.
    #[error("policy.trusted_keys_dir: {0}")]
    Unusable(String),
}

impl KeysProblem {
    /// The stable machine-readable kind.
    pub fn kind(&self) -> &'static str {
        match self {
            KeysProblem::Missing { .. } => "Missing",
            KeysProblem::Empty { .. } => "Empty",
            KeysProblem::Unusable(_) => "Unusable",
        }
    }
}

/// Loads `policy.trusted_keys_dir` the way signature checks will. Every key file there must
/// parse, whatever the policy (a signature that is given is verified either way); with
/// `require_signatures` the directory must also exist and hold at least one key.
pub fn trusted_keys(policy: &Policy) -> Result<Vec<TrustedKey>, KeysProblem> {
    let dir = &policy.trusted_keys_dir;
    // Without it, loading treats a missing directory as "no keys": say which it is.
    let exists = dir_exists(dir).map_err(KeysProblem::Unusable)?;
    let keys = signature::load_trusted_keys(dir).map_err(|e| match e {
        signature::SignatureError::Keys(message) => KeysProblem::Unusable(message),
        other => KeysProblem::Unusable(other.to_string()),
    })?;
    judge(policy.require_signatures, dir, exists, keys)
}

fn dir_exists(dir: &Path) -> Result<bool, String> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(true),
        Ok(_) => Err(format!("{} is not a directory", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

/// The verdict on what was read.
fn judge(
    required: bool,
    dir: &Path,
    exists: bool,
    keys: Vec<TrustedKey>,
) -> Result<Vec<TrustedKey>, KeysProblem> {
    if required && !exists {
        return Err(KeysProblem::Missing { dir: dir.into() });
    }
    if required && keys.is_empty() {
        return Err(KeysProblem::Empty { dir: dir.into() });
    }
    Ok(keys)
}

/// One line for `check-config`'s output: the keys found, or that there are none.
pub fn describe(dir: &Path, keys: &[TrustedKey]) -> String {
    if keys.is_empty() {
        return format!("# trusted keys in {}: none", dir.display());
    }
    let listed: Vec<String> = keys
        .iter()
        .map(|k| format!("{} ({})", k.file.display(), k.id()))
        .collect();
    format!("# trusted keys in {}: {}", dir.display(), listed.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(dir: &Path, required: bool) -> Policy {
        let policy = crate::settings::from_toml(
            &format!(
                "node_name = \"n\"\n[policy]\ntrusted_keys_dir = \"{}\"\nrequire_signatures = {required}\n",
                dir.display()
            ),
            || None,
        )
        .expect("settings")
        .policy;
        assert_eq!(policy.require_signatures, required);
        policy
    }

    /// A public key in minisign's file format (made by the `minisign` crate).
    fn write_key(path: &Path) {
        let pair = minisign::KeyPair::generate_unencrypted_keypair().expect("a key pair");
        let text = pair.pk.to_box().expect("a key box").into_string();
        std::fs::write(path, text).expect("written");
    }

    #[test]
    fn required_signatures_need_an_existing_directory_with_a_key() {
        let root = tempfile::tempdir().expect("a temp dir");
        let dir = root.path().join("keys");
        let err = trusted_keys(&policy(&dir, true)).err().expect("missing");
        assert_eq!(err.kind(), "Missing");
        assert!(
            err.to_string().contains(&dir.display().to_string()),
            "{err}"
        );
        // Not required: no directory is fine.
        assert!(trusted_keys(&policy(&dir, false)).expect("ok").is_empty());

        std::fs::create_dir(&dir).expect("created");
        std::fs::write(dir.join("README"), "not a key").expect("written");
        let err = trusted_keys(&policy(&dir, true)).err().expect("empty");
        assert_eq!(err.kind(), "Empty");
        assert!(err.to_string().contains("keys"), "{err}");

        write_key(&dir.join("release.pub"));
        let keys = trusted_keys(&policy(&dir, true)).expect("a key");
        assert_eq!(keys.len(), 1);
        let line = describe(&dir, &keys);
        assert!(line.contains("release.pub"), "{line}");
    }

    #[test]
    fn a_broken_key_file_is_named_whatever_the_policy() {
        let root = tempfile::tempdir().expect("a temp dir");
        write_key(&root.path().join("good.pub"));
        std::fs::write(
            root.path().join("broken.pub"),
            "untrusted comment: x\nAAAA\n",
        )
        .expect("written");
        for required in [true, false] {
            let err = trusted_keys(&policy(root.path(), required))
                .err()
                .expect("broken");
            assert_eq!(err.kind(), "Unusable");
            assert!(err.to_string().contains("broken.pub"), "{err}");
        }
    }

    #[test]
    fn a_file_where_the_directory_should_be_is_named() {
        let root = tempfile::tempdir().expect("a temp dir");
        let file = root.path().join("keys");
        std::fs::write(&file, "x").expect("written");
        let err = trusted_keys(&policy(&file, false))
            .err()
            .expect("not a dir");
        assert_eq!(err.kind(), "Unusable");
        assert!(err.to_string().contains("not a directory"), "{err}");
    }
}
