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
mod tests {
    use super::*;

    fn keypair() -> minisign::KeyPair {
        minisign::KeyPair::generate_unencrypted_keypair().expect("a key pair")
    }

    fn sign(pair: &minisign::KeyPair, bytes: &[u8], comment: &str) -> String {
        minisign::sign(Some(&pair.pk), &pair.sk, bytes, Some(comment), None)
            .expect("a signature")
            .into_string()
    }

    fn trusted(pair: &minisign::KeyPair) -> (tempfile::TempDir, Vec<TrustedKey>) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let text = pair.pk.to_box().expect("a key box").into_string();
        std::fs::write(dir.path().join("release.pub"), text).expect("written");
        let keys = load_trusted_keys(dir.path()).expect("keys");
        (dir, keys)
    }

    fn subject<'a>(file: &'a str, version: Option<&'a str>, required: bool) -> Subject<'a> {
        Subject {
            file,
            version,
            version_required: required,
        }
    }

    /// minisign's default comment names no version. Under `require_signatures` that is
    /// refused for a plan with a kubernetesVersion (it would vouch for any release of the
    /// file name); without it, it is accepted, as the docs say.
    #[test]
    fn a_comment_without_a_version_is_refused_only_where_signatures_are_required() {
        let default = "timestamp:1\tfile:k.raw\thashed";
        let err = check_trusted_comment(default, subject("k.raw", Some("v1.31.2"), true))
            .expect_err("no version under require_signatures");
        assert_eq!(err.kind(), "VersionMissing");
        assert!(
            err.to_string()
                .contains("does not name the version (version:v1.31.2)"),
            "{err}"
        );
        check_trusted_comment(default, subject("k.raw", Some("v1.31.2"), false))
            .expect("no version, signatures not required");
        check_trusted_comment(default, subject("k.raw", None, true)).expect("no version to name");
        check_trusted_comment(
            "file:k.raw version:v1.31.2",
            subject("k.raw", Some("v1.31.2"), true),
        )
        .expect("file and version");
    }

    #[test]
    fn trusted_comment_must_name_the_file_and_the_version_when_it_has_one() {
        let ok = |c: &str| check_trusted_comment(c, subject("k.raw", Some("v1.31.2"), false));
        ok("file:k.raw").expect("file only");
        ok("timestamp:1\tfile:k.raw\thashed").expect("minisign's default");
        ok("file:k.raw version:v1.31.2").expect("file and version");
        for bad in [
            "",
            "timestamp:1",
            "file:other.raw",
            "file:k.raw file:other.raw",
            "file:k.raw version:v1.30.0",
            "file:k.raw version:",
            "filek.raw",
            "file:k.raw.minisig",
        ] {
            let err = ok(bad).expect_err(bad);
            assert_eq!(err.kind(), "WrongSubject", "{bad}");
        }
        let err = check_trusted_comment("file:k.raw version:v1.31.2", subject("k.raw", None, true))
            .expect_err("a version the plan does not name");
        assert!(
            err.to_string().contains("names no kubernetesVersion"),
            "{err}"
        );
    }

    #[test]
    fn parse_refuses_what_is_not_a_prehashed_minisign_signature() {
        let pair = keypair();
        let good = sign(&pair, b"bytes", "file:k.raw");
        parse(good.as_bytes()).expect("a good signature parses");
        let mut lines: Vec<String> = good.lines().map(str::to_owned).collect();
        // The same signature marked legacy ("Ed": signed over the raw bytes).
        let mut raw = base64::engine::general_purpose::STANDARD
            .decode(&lines[1])
            .expect("base64");
        raw[1] = b'd';
        lines[1] = base64::engine::general_purpose::STANDARD.encode(raw);
        let legacy = lines.join("\n");
        let long = "x".repeat(MAX_SIGNATURE_BYTES + 1);
        for (bad, why) in [
            (&b""[..], "empty"),
            (&b"\xff\xfe"[..], "not UTF-8"),
            (
                &b"untrusted comment: x\nnot base64\ntrusted comment: y\nAAAA\n"[..],
                "garbage",
            ),
            (&good.as_bytes()[..good.len() / 2], "truncated"),
            (legacy.as_bytes(), "legacy"),
            (long.as_bytes(), "too long"),
        ] {
            let err = parse(bad).err().unwrap_or_else(|| panic!("{why} parsed"));
            assert_eq!(err.kind(), "Malformed", "{why}: {err}");
        }
        assert!(
            parse(legacy.as_bytes())
                .err()
                .is_some_and(|e| e.to_string().contains("legacy")),
        );
    }

    #[test]
    fn verifies_the_bytes_with_the_key_that_made_the_signature() {
        let pair = keypair();
        let (dir, keys) = trusted(&pair);
        let signature = sign(&pair, b"the artifact", "file:k.raw version:v1.31.2");
        let checked = check(
            signature.as_bytes(),
            subject("k.raw", Some("v1.31.2"), true),
            &keys,
            dir.path(),
        )
        .expect("checked");
        checked
            .verify_reader(&b"the artifact"[..])
            .expect("verified");
        let err = checked
            .verify_reader(&b"the artifacT"[..])
            .expect_err("other bytes");
        assert_eq!(err.kind(), "Mismatch");

        let stranger = sign(&keypair(), b"the artifact", "file:k.raw");
        let err = check(
            stranger.as_bytes(),
            subject("k.raw", None, false),
            &keys,
            dir.path(),
        )
        .err()
        .expect("an untrusted key");
        assert_eq!(err.kind(), "UntrustedKey");
        assert!(err.to_string().contains("release.pub"), "{err}");
        let err = check(
            stranger.as_bytes(),
            subject("k.raw", None, false),
            &[],
            dir.path(),
        )
        .err()
        .expect("no keys");
        assert!(err.to_string().contains("no *.pub key in"), "{err}");
    }

    #[test]
    fn a_forged_trusted_comment_fails_verification() {
        let pair = keypair();
        let (dir, keys) = trusted(&pair);
        let signature = sign(&pair, b"bytes", "file:old.raw");
        let forged = signature.replace("file:old.raw", "file:k.raw");
        let checked = check(
            forged.as_bytes(),
            subject("k.raw", None, false),
            &keys,
            dir.path(),
        )
        .expect("passes the checks that need no bytes");
        let err = checked.verify_reader(&b"bytes"[..]).expect_err("forged");
        assert_eq!(err.kind(), "Mismatch");
    }

    #[test]
    fn trusted_keys_are_the_pub_files_and_a_broken_one_is_an_error() {
        let missing = tempfile::tempdir().expect("a temp dir");
        let keys = load_trusted_keys(&missing.path().join("none")).expect("no dir: no keys");
        assert!(keys.is_empty());
        let pair = keypair();
        let (dir, keys) = trusted(&pair);
        assert_eq!(keys.len(), 1);
        std::fs::write(dir.path().join("notes.txt"), "not a key").expect("written");
        assert_eq!(load_trusted_keys(dir.path()).expect("keys").len(), 1);
        std::fs::write(
            dir.path().join("broken.pub"),
            "untrusted comment: x\nAAAA\n",
        )
        .expect("written");
        let err = load_trusted_keys(dir.path())
            .err()
            .expect("a broken key file");
        assert!(err.to_string().contains("broken.pub"), "{err}");
    }

    /// Made with the minisign 0.11 CLI (Debian's package), so the agent is proven against
    /// the tool people sign with, not only against the Rust port the other tests use. In
    /// `agent/tests/fixtures/minisign/`, the secret key thrown away afterwards:
    ///
    /// ```sh
    /// minisign -G -W -p release.pub -s release.key
    /// minisign -S -s release.key -m kubernetes-v1.31.2.raw \
    ///   -t "file:kubernetes-v1.31.2.raw version:v1.31.2"
    /// minisign -S -s release.key -m kubernetes-v1.31.2.raw -x default-comment.minisig
    /// ```
    #[test]
    fn signatures_made_by_the_minisign_cli_verify() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/minisign");
        let keys = load_trusted_keys(&dir).expect("the fixture key");
        assert_eq!(keys.len(), 1);
        // The id `minisign -G` printed in the key's untrusted comment.
        assert_eq!(keys[0].id(), "6203DB16E330565B");
        let file = "kubernetes-v1.31.2.raw";
        let bytes = std::fs::read(dir.join(file)).expect("the fixture file");
        for signature in [format!("{file}.minisig"), "default-comment.minisig".into()] {
            let text = std::fs::read(dir.join(&signature)).expect("the fixture signature");
            let checked =
                check(&text, subject(file, Some("v1.31.2"), false), &keys, &dir).expect(&signature);
            checked.verify_reader(&bytes[..]).expect(&signature);
            let mut tampered = bytes.clone();
            tampered[0] ^= 1;
            assert!(checked.verify_reader(&tampered[..]).is_err(), "{signature}");
        }
        // Under require_signatures minisign's default comment names no version.
        let text = std::fs::read(dir.join("default-comment.minisig")).expect("the fixture");
        let err = check(&text, subject(file, Some("v1.31.2"), true), &keys, &dir)
            .err()
            .expect("the default comment under require_signatures");
        assert_eq!(err.kind(), "VersionMissing");
    }
}
