//! Resuming a download across agent restarts. A partial download has a name fixed by the
//! artifact (its name and sha256), and beside it the validator (ETag or Last-Modified) of
//! the object its bytes came from. A new process re-hashes the bytes on disk and continues
//! with `Range` + `If-Range`; without a validator it starts from zero, as a server that
//! gives none cannot promise the rest belongs to the same object. The sha256 check at the
//! end is what makes the result trustworthy either way.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use inplace_proto::Artifact;
use sha2::{Digest, Sha256};

use super::partial::{DirectIo, Partial, Sink};

/// A validator is a short header value; anything longer is not ours.
const MAX_VALIDATOR_BYTES: u64 = 1024;

/// The file names of `artifact`'s partial download and of its validator, in the directory
/// it is downloaded to. Both are dot-files ending in `.partial`, so the sweep of leftovers
/// (`store::remove_partials`) knows them.
pub fn partial_names(artifact: &Artifact) -> [String; 2] {
    let id = artifact.sha256.get(..16).unwrap_or(&artifact.sha256);
    [
        format!(".{}.{id}.partial", artifact.name),
        format!(".{}.{id}.validator.partial", artifact.name),
    ]
}

impl Partial {
    /// The partial download of `artifact` in `dir`: what an earlier process left there
    /// (re-hashed, with its validator) when it can be resumed and is no longer than
    /// `limit`, else an empty file. Blocking.
    pub(super) fn open(artifact: &Artifact, dir: &Path, limit: u64) -> std::io::Result<Self> {
        let [data, validator] = partial_names(artifact);
        let (path, validator_path) = (dir.join(data), dir.join(validator));
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut partial = Partial {
            path,
            validator_path,
            sink: None,
            done: 0,
            validator: None,
        };
        let resumable = read_validator(&partial.validator_path).filter(|_| {
            file.metadata()
                .is_ok_and(|m| m.len() > 0 && m.len() <= limit)
        });
        let (hasher, len) = match &resumable {
            Some(_) => hash_all(&mut file)?,
            None => {
                file.set_len(0)?;
                (Sha256::new(), 0)
            }
        };
        partial.sink = Some(Sink::new(file, hasher, len, DirectIo::KERNEL));
        partial.done = len;
        partial.validator = resumable.filter(|_| len > 0);
        Ok(partial)
    }

    /// Records the validator of the object the bytes now come from (none: forget it, so a
    /// restart starts from zero). Written before the body, so the file never holds bytes
    /// of an object other than the recorded one for longer than a crash window; a mix-up
    /// there costs a sha256 mismatch and a new download, never a wrong file.
    pub(super) async fn remember_validator(&mut self) -> std::io::Result<()> {
        let path = self.validator_path.clone();
        let value = self.validator.clone();
        tokio::task::spawn_blocking(move || match value {
            Some(value) => std::fs::write(&path, value),
            None => remove_if_present(&path),
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Removes the validator file (the download is done, or given up).
    pub(super) async fn forget_validator(&self) {
        let path = self.validator_path.clone();
        let _ = tokio::task::spawn_blocking(move || remove_if_present(&path)).await;
    }
}

fn remove_if_present(path: &PathBuf) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn read_validator(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_VALIDATOR_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The sha256 state and length of everything in `file`, read from the start.
fn hash_all(file: &mut std::fs::File) -> std::io::Result<(Sha256, u64)> {
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 256 << 10];
    let mut len = 0u64;
    loop {
        let n = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buffer[..n]);
        len += n as u64;
    }
    Ok((hasher, len))
}
