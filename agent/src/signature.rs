//! Detached minisign signatures over artifacts: the node's trusted keys, the trusted-comment
//! rules that stop an old signature from being replayed for another file or version, and
//! verification of a downloaded file without reading it into memory.
//!
//! Everything that needs no artifact bytes (download of the signature, parsing, the
//! trusted comment, finding the key) is checked before the artifact is downloaded, so a
//! bad signature costs no gigabyte. Only prehashed signatures (`ED`, minisign's default
//! since 0.8) are accepted: they can be verified in one streaming pass.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use inplace_proto::{Artifact, Reason};
use minisign_verify::{PublicKey, Signature};

use crate::fetch::Fetcher;
use crate::journal::Failure;
use crate::settings::Policy;

/// Largest signature file accepted. A minisign signature is about 300 bytes plus its
/// trusted comment.
pub const MAX_SIGNATURE_BYTES: usize = 16 * 1024;

/// Largest public key file read from the trusted keys directory.
const MAX_KEY_FILE_BYTES: u64 = 4 * 1024;

/// Why a signature was refused. Every kind is reported as `SignatureInvalid`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The bytes are not a minisign signature this agent accepts.
    #[error("the signature is not a usable minisign signature: {0}")]
    Malformed(String),
    /// The trusted comment names another file or version (a replayed signature).
    #[error("the signature's trusted comment {comment:?} {problem}")]
    WrongSubject {
        /// The trusted comment.
        comment: String,
        /// What it gets wrong.
        problem: String,
    },
    /// With `require_signatures`, the trusted comment names no version while the plan has a
    /// `kubernetesVersion`: a signature without one fits every release of the file name,
    /// so an old signed release could be installed as the new one (a downgrade).
    #[error(
        "the signature's trusted comment {comment:?} does not name the version (version:{version}), which [policy] require_signatures requires"
    )]
    VersionMissing {
        /// The trusted comment.
        comment: String,
        /// The plan's kubernetesVersion.
        version: String,
    },
    /// No trusted key has the signature's key id.
    #[error("signed with key {key_id}, which is not a trusted key of this node ({trusted})")]
    UntrustedKey {
        /// The signature's key id, as minisign prints it.
        key_id: String,
        /// The trusted keys, as `file (id)`, or why there are none.
        trusted: String,
    },
    /// The trusted keys could not be read.
    #[error("trusted keys: {0}")]
    Keys(String),
    /// The file's bytes (or the trusted comment) do not match the signature.
    #[error("the signature does not match the file's bytes (key {key_id} from {key_file})")]
    Mismatch {
        /// The key id.
        key_id: String,
        /// The key's file.
        key_file: String,
    },
    /// The downloaded file could not be read back.
    #[error("cannot read the downloaded file: {0}")]
    Io(String),
}

impl SignatureError {
    /// The stable machine-readable kind, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            SignatureError::Malformed(_) => "Malformed",
            SignatureError::WrongSubject { .. } => "WrongSubject",
            SignatureError::VersionMissing { .. } => "VersionMissing",
            SignatureError::UntrustedKey { .. } => "UntrustedKey",
            SignatureError::Keys(_) => "Keys",
            SignatureError::Mismatch { .. } => "Mismatch",
            SignatureError::Io(_) => "Io",
        }
    }

    fn into_failure(self, artifact: &str) -> Failure {
        Failure {
            reason: Reason::SignatureInvalid,
            message: format!("artifact {artifact}: {self}"),
        }
    }
}

/// A minisign key id as minisign prints it: 16 uppercase hex digits of the little-endian
/// number.
fn key_id_text(id: [u8; 8]) -> String {
    format!("{:016X}", u64::from_le_bytes(id))
}

/// The algorithm and key id in a base64 key or signature line (its first 10 bytes).
fn algorithm_and_key_id(base64_line: &str) -> Option<([u8; 2], [u8; 8])> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(base64_line.trim())
        .ok()?;
    Some((
        bytes.get(..2)?.try_into().ok()?,
        bytes.get(2..10)?.try_into().ok()?,
    ))
}

/// A signature that parsed, with its key id.
#[derive(Clone)]
pub struct ParsedSignature {
    signature: Signature,
    key_id: [u8; 8],
}

impl ParsedSignature {
    /// The trusted comment (what the signer vouched for besides the bytes).
    pub fn trusted_comment(&self) -> &str {
        self.signature.trusted_comment()
    }
}

/// Parses a minisign signature file. Legacy (non-prehashed) signatures are refused.
pub fn parse(bytes: &[u8]) -> Result<ParsedSignature, SignatureError> {
    if bytes.len() > MAX_SIGNATURE_BYTES {
        return Err(SignatureError::Malformed(format!(
            "{} bytes is more than {MAX_SIGNATURE_BYTES}",
            bytes.len()
        )));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| SignatureError::Malformed("not UTF-8 text".into()))?;
    let signature =
        Signature::decode(text).map_err(|e| SignatureError::Malformed(e.to_string()))?;
    let (algorithm, key_id) = text
        .lines()
        .nth(1)
        .and_then(algorithm_and_key_id)
        .ok_or_else(|| SignatureError::Malformed("no key id".into()))?;
    if &algorithm != b"ED" {
        return Err(SignatureError::Malformed(
            "a legacy (not prehashed) signature; sign with minisign 0.8 or later, without -l"
                .into(),
        ));
    }
    Ok(ParsedSignature { signature, key_id })
}

/// What a signature must vouch for.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The artifact's file name (the last segment of its URL).
    pub file: &'a str,
    /// The plan's kubernetesVersion.
    pub version: Option<&'a str>,
    /// Whether the comment must name `version` when there is one (`require_signatures`).
    pub version_required: bool,
}

/// Checks the trusted comment against the artifact it is for: a `file:` token must name
/// `file` (and every `file:` token must), and every `version:` token must equal `version`;
/// when `version_required` and the plan has a version, one `version:` token must be there.
/// Tokens are separated by whitespace, as minisign writes `timestamp:… file:…`.
pub fn check_trusted_comment(comment: &str, subject: Subject<'_>) -> Result<(), SignatureError> {
    let Subject { file, version, .. } = subject;
    let wrong = |problem: String| SignatureError::WrongSubject {
        comment: comment.to_owned(),
        problem,
    };
    let mut names_file = false;
    let mut names_version = false;
    for token in comment.split_whitespace() {
        if let Some(named) = token.strip_prefix("file:") {
            if named != file {
                return Err(wrong(format!("is for file {named:?}, not {file:?}")));
            }
            names_file = true;
        } else if let Some(named) = token.strip_prefix("version:") {
            match version {
                Some(version) if named == version => names_version = true,
                Some(version) => {
                    return Err(wrong(format!(
                        "is for version {named:?}, not the plan's kubernetesVersion {version:?}"
                    )));
                }
                None => {
                    return Err(wrong(format!(
                        "is for version {named:?} and the plan names no kubernetesVersion"
                    )));
                }
            }
        }
    }
    if !names_file {
        return Err(wrong(format!("does not name the file (file:{file})")));
    }
    match version {
        Some(version) if subject.version_required && !names_version => {
            Err(SignatureError::VersionMissing {
                comment: comment.to_owned(),
                version: version.to_owned(),
            })
        }
        _ => Ok(()),
    }
}

/// One trusted public key and the file it came from.
#[derive(Clone)]
pub struct TrustedKey {
    /// The file, for messages.
    pub file: PathBuf,
    id: [u8; 8],
    key: PublicKey,
}

impl TrustedKey {
    /// The key id, as minisign prints it.
    pub fn id(&self) -> String {
        key_id_text(self.id)
    }
}

/// Reads every `*.pub` file in `dir` (blocking). A key file that does not parse is an
/// error naming it: a broken key configuration must not quietly shrink the trusted set.
pub fn load_trusted_keys(dir: &Path) -> Result<Vec<TrustedKey>, SignatureError> {
    let keys_error = |e: std::io::Error| SignatureError::Keys(format!("{}: {e}", dir.display()));
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(keys_error(e)),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "pub"))
        .collect();
    files.sort();
    let mut keys = Vec::new();
    for file in files {
        let mut text = String::new();
        std::fs::File::open(&file)
            .and_then(|f| f.take(MAX_KEY_FILE_BYTES).read_to_string(&mut text))
            .map_err(|e| SignatureError::Keys(format!("{}: {e}", file.display())))?;
        let bad =
            || SignatureError::Keys(format!("{} is not a minisign public key", file.display()));
        let key = PublicKey::decode(&text).map_err(|_| bad())?;
        let (_, id) = text
            .lines()
            .nth(1)
            .and_then(algorithm_and_key_id)
            .ok_or_else(bad)?;
        keys.push(TrustedKey { file, id, key });
    }
    Ok(keys)
}

/// A signature that passed every check that needs no artifact bytes, with its key.
#[derive(Clone)]
pub struct CheckedSignature {
    parsed: ParsedSignature,
    key: TrustedKey,
}

/// Parses `bytes`, finds the trusted key that made it, and checks the trusted comment
/// against `subject`.
pub fn check(
    bytes: &[u8],
    subject: Subject<'_>,
    keys: &[TrustedKey],
    keys_dir: &Path,
) -> Result<CheckedSignature, SignatureError> {
    let parsed = parse(bytes)?;
    let Some(key) = keys.iter().find(|k| k.id == parsed.key_id) else {
        let trusted = if keys.is_empty() {
            format!("no *.pub key in {}", keys_dir.display())
        } else {
            keys.iter()
                .map(|k| format!("{} ({})", k.file.display(), k.id()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(SignatureError::UntrustedKey {
            key_id: key_id_text(parsed.key_id),
            trusted,
        });
    };
    // Only authenticated once the bytes are verified; checked now so that a signature for
    // another file or version costs no download.
    check_trusted_comment(parsed.trusted_comment(), subject)?;
    Ok(CheckedSignature {
        key: key.clone(),
        parsed,
    })
}

impl CheckedSignature {
    /// Verifies the bytes `reader` yields, in chunks (blocking when the reader blocks).
    pub fn verify_reader(&self, mut reader: impl Read) -> Result<(), SignatureError> {
        let mismatch = || SignatureError::Mismatch {
            key_id: self.key.id(),
            key_file: self.key.file.display().to_string(),
        };
        let mut verifier = self
            .key
            .key
            .verify_stream(&self.parsed.signature)
            .map_err(|_| mismatch())?;
        let mut buffer = vec![0u8; 256 * 1024];
        loop {
            let n = match reader.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(SignatureError::Io(e.to_string())),
            };
            verifier.update(&buffer[..n]);
        }
        verifier.finalize().map_err(|_| mismatch())
    }
}

/// The artifact's signature, downloaded and checked as far as it can be without the
/// artifact's bytes; `None` when the artifact has no `signatureUrl` (the node policy has
/// already refused that where signatures are required). The trusted comment must name the
/// plan's kubernetesVersion where `require_signatures` says so.
pub async fn prepare(
    fetcher: &dyn Fetcher,
    artifact: &Artifact,
    kubernetes_version: Option<&str>,
    policy: &Policy,
) -> Result<Option<Arc<CheckedSignature>>, Failure> {
    let vouch = Vouch {
        version: kubernetes_version,
        version_required: policy.require_signatures,
    };
    prepare_vouching(fetcher, artifact, vouch, &policy.trusted_keys_dir)
        .await
        .map_err(|e| match e {
            PrepareError::Fetch(failure) => failure,
            PrepareError::Signature(e) => e.into_failure(&artifact.name),
        })
}

/// The version a signature must vouch for besides the file, and whether it must name it.
#[derive(Debug, Clone, Copy)]
pub struct Vouch<'a> {
    /// The version (`version:` in the trusted comment).
    pub version: Option<&'a str>,
    /// Whether the comment must name it.
    pub version_required: bool,
}

/// Why a signature could not be prepared: its download failed, or it was refused.
#[derive(Debug)]
pub enum PrepareError {
    /// The signature could not be downloaded (the fetcher's reason).
    Fetch(Failure),
    /// The signature was refused (always `SignatureInvalid`).
    Signature(SignatureError),
}

/// [`prepare`] with the version to vouch for given by the caller (the agent image's own
/// version, always required), and the refusal left for the caller to word.
pub async fn prepare_vouching(
    fetcher: &dyn Fetcher,
    artifact: &Artifact,
    vouch: Vouch<'_>,
    keys_dir: &Path,
) -> Result<Option<Arc<CheckedSignature>>, PrepareError> {
    let Some(url) = &artifact.signature_url else {
        return Ok(None);
    };
    let bytes = fetcher
        .fetch_small(
            &format!("{} (signature)", artifact.name),
            url,
            MAX_SIGNATURE_BYTES,
        )
        .await
        .map_err(|e| {
            PrepareError::Fetch(Failure {
                reason: e.reason(),
                message: e.to_string(),
            })
        })?;
    // The API validation makes sure a signed artifact's URL ends in a file name.
    let file = url::Url::parse(&artifact.url)
        .ok()
        .and_then(|u| inplace_proto::validate::url_basename(&u).map(str::to_owned))
        .unwrap_or_default();
    let version = vouch.version.map(str::to_owned);
    let keys_dir = keys_dir.to_path_buf();
    let version_required = vouch.version_required;
    tokio::task::spawn_blocking(move || {
        let keys = load_trusted_keys(&keys_dir)?;
        let subject = Subject {
            file: &file,
            version: version.as_deref(),
            version_required,
        };
        check(&bytes, subject, &keys, &keys_dir)
    })
    .await
    .unwrap_or_else(|e| Err(SignatureError::Io(e.to_string())))
    .map(|c| Some(Arc::new(c)))
    .map_err(PrepareError::Signature)
}

/// Verifies the file at `path` against `signature` on a blocking thread; nothing to do
/// without one.
pub async fn verify_file(
    signature: Option<&Arc<CheckedSignature>>,
    artifact: &str,
    path: &Path,
) -> Result<(), Failure> {
    let Some(signature) = signature.cloned() else {
        return Ok(());
    };
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&path)
            .map_err(|e| SignatureError::Io(format!("{}: {e}", path.display())))?;
        signature.verify_reader(file)
    })
    .await
    .unwrap_or_else(|e| Err(SignatureError::Io(e.to_string())))
    .map_err(|e| e.into_failure(artifact))
}

/// [`verify_file`] for a fresh download: a file that fails is removed, so nothing unsigned
/// stays on the node.
pub async fn verify_download(
    signature: Option<&Arc<CheckedSignature>>,
    artifact: &str,
    temp: &Path,
) -> Result<(), Failure> {
    let verified = verify_file(signature, artifact, temp).await;
    if verified.is_err()
        && let Err(e) = tokio::fs::remove_file(temp).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %temp.display(), error = %e, "cannot remove a file whose signature failed");
    }
    verified
}

#[cfg(test)]
mod tests;
