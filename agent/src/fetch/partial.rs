//! The partial download between attempts (and, through `resume`, between processes): the
//! temporary file, the running hash of what it holds, and the streaming of one response body
//! into it with the stall and minimum-speed checks. The body is cut into page-aligned blocks
//! (`blocks`) that go to disk around the page cache where they can (`direct`).

mod blocks;
mod direct;
#[cfg(test)]
mod tests;

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::{Progress, error_chain};
use blocks::{Cutter, Filled};
pub(super) use direct::DirectIo;
use direct::{Direct, Written};

/// Blocks waiting for each of the writer and the hasher: enough that the disk always has
/// the next write while the network and the hash catch up (see [`blocks::BLOCK`] for what
/// was measured); the fetcher's memory stays flat at about (QUEUED + 3) blocks, 14 MiB,
/// whatever the artifact's size (the writer and the hasher share each block, so the slower
/// of them sets the bound).
const QUEUED: usize = 4;

/// When a block cannot be written around the page cache (the first after a resume at an
/// unaligned offset, the last one, or every one where the file system refuses `O_DIRECT`),
/// every this many bytes the writer asks the kernel to start writing back and drop what is
/// already on disk, so the final `fsync` has little left to do and a 1 GiB artifact does
/// not push the node's working set out of the page cache. 1 GiB from a local nginx, quiet
/// 2-core machine, alternating `inplace-bench fetch-one` runs: 1.06 s (median of 7) with
/// 16 MiB, 1.01 with 4 MiB, 1.04 with 1 MiB, 1.45 without the hint (all of it written at the
/// `fsync`).
const WRITEBACK_WINDOW: u64 = 4 << 20;

/// The temporary file and the running hash of what it holds. While a body streams, writing
/// and hashing each run on a blocking thread of their own, block by block, while the next
/// block is received: the three overlap, so a download takes about as long as the slowest
/// of them rather than the sum of hashing and writing.
pub(super) struct Sink {
    pub(super) file: std::fs::File,
    pub(super) hasher: Sha256,
    /// Bytes in the file.
    pub(super) len: u64,
    /// Where the last writeback hint ended.
    advised: u64,
    /// The descriptor that writes around the page cache.
    direct: Direct,
    /// Bytes written around the page cache (what a test checks).
    pub(super) direct_bytes: u64,
}

impl Sink {
    /// `file` holds `len` bytes, whose hash is `hasher`; blocks are written through `io`
    /// where they can be.
    pub(super) fn new(file: std::fs::File, hasher: Sha256, len: u64, io: DirectIo) -> Self {
        Sink {
            file,
            hasher,
            len,
            advised: len,
            direct: Direct::Untried(io),
            direct_bytes: 0,
        }
    }

    /// Writes `bytes` at `at`, the end of the file (the caller hashes them). Positional
    /// writes, so the direct and the buffered descriptor can take turns.
    fn write_block(&mut self, bytes: &[u8], at: u64) -> std::io::Result<()> {
        debug_assert_eq!(at, self.len, "blocks arrive in order");
        let end = at + bytes.len() as u64;
        if let Written::Direct = self.direct.write(&self.file, bytes, at)? {
            self.direct_bytes += bytes.len() as u64;
            // Nothing of it is in the page cache to hint about.
            self.len = end;
            self.advised = end;
            return Ok(());
        }
        self.file.write_all_at(bytes, at)?;
        self.len = end;
        if self.len - self.advised >= WRITEBACK_WINDOW {
            // Pages still dirty from the last window are dropped by this call's successor;
            // the hint is advisory, so its failure changes nothing.
            let start = self.advised.saturating_sub(WRITEBACK_WINDOW);
            let _ = nix::fcntl::posix_fadvise(
                &self.file,
                start as i64,
                (self.len - start) as i64,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            );
            self.advised = self.len;
        }
        Ok(())
    }

    pub(super) fn truncate(&mut self) -> std::io::Result<()> {
        self.file.set_len(0)?;
        self.hasher = Sha256::new();
        self.len = 0;
        self.advised = 0;
        Ok(())
    }
}

/// The partial download carried between attempts.
pub(super) struct Partial {
    pub(super) path: PathBuf,
    /// Where `validator` is kept for a process that resumes after this one.
    pub(super) validator_path: PathBuf,
    /// `None` only while a blocking task holds it.
    pub(super) sink: Option<Sink>,
    pub(super) done: u64,
    /// ETag or Last-Modified of the object the bytes came from.
    pub(super) validator: Option<String>,
}

impl Partial {
    /// Runs `work` on the sink on a blocking thread (file I/O never runs on the runtime).
    pub(super) async fn with_sink<R: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Sink) -> std::io::Result<R> + Send + 'static,
    ) -> std::io::Result<R> {
        let mut sink = self.take_sink()?;
        let (sink, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut sink);
            (sink, result)
        })
        .await
        .map_err(std::io::Error::other)?;
        self.sink = Some(sink);
        result
    }

    fn take_sink(&mut self) -> std::io::Result<Sink> {
        self.sink
            .take()
            .ok_or_else(|| std::io::Error::other("the temporary file was lost by a failed write"))
    }

    pub(super) async fn reset(&mut self) -> std::io::Result<()> {
        self.with_sink(Sink::truncate).await?;
        self.done = 0;
        self.validator = None;
        self.remember_validator().await
    }

    /// Streams `body` into the sink: one thread writes a block and another hashes it while
    /// the next is received. Every byte received is in the file (and the hash) when this
    /// returns, so a retry resumes exactly at `done`; after a write error the download is
    /// given up, so a hash ahead of the file is never used.
    pub(super) async fn stream<B>(
        &mut self,
        body: &mut B,
        limit: u64,
        stall: Duration,
        min_speed: u64,
        progress: Progress<'_>,
    ) -> Result<BodyEnd, std::io::Error>
    where
        B: futures::Stream<Item = reqwest::Result<Bytes>> + Unpin,
    {
        let mut sink = self.take_sink()?;
        let mut hasher = std::mem::take(&mut sink.hasher);
        let mut cutter = Cutter::new(sink.len);
        let (blocks, mut incoming) = tokio::sync::mpsc::channel::<Filled>(QUEUED);
        let (to_hash, mut to_hasher) = tokio::sync::mpsc::channel::<Filled>(QUEUED);
        let writer = tokio::task::spawn_blocking(move || {
            while let Some(block) = incoming.blocking_recv() {
                if let Err(e) = sink.write_block(block.bytes(), block.at) {
                    return (sink, Err(e));
                }
            }
            (sink, Ok(()))
        });
        let hashing = tokio::task::spawn_blocking(move || {
            while let Some(block) = to_hasher.blocking_recv() {
                hasher.update(block.bytes());
            }
            hasher
        });
        // Both threads get the same block (shared memory, not a copy); the cutter reuses it
        // once the slower one is done with it, so memory stays flat at the slower side's queue.
        let send = |full: Vec<Filled>| {
            let (blocks, to_hash) = (&blocks, &to_hash);
            async move {
                for block in full {
                    let hashed = to_hash.send(block.clone()).await.is_ok();
                    if !(hashed && blocks.send(block).await.is_ok()) {
                        return false;
                    }
                }
                true
            }
        };
        let mut full = Vec::new();
        let mut window = SpeedWindow::new(stall, min_speed);
        let end = loop {
            let chunk = match tokio::time::timeout(stall, body.next()).await {
                Err(_) => break BodyEnd::Stalled,
                Ok(None) => break BodyEnd::Complete,
                Ok(Some(Err(e))) => break BodyEnd::Broken(error_chain(&e)),
                Ok(Some(Ok(chunk))) => chunk,
            };
            if self.done + chunk.len() as u64 > limit {
                break BodyEnd::TooLong;
            }
            if window.too_slow(chunk.len() as u64) {
                break BodyEnd::TooSlow;
            }
            self.done += chunk.len() as u64;
            cutter.push(&chunk, &mut full);
            if !send(std::mem::take(&mut full)).await {
                // The writer stopped on an error; it is returned below.
                break BodyEnd::Complete;
            }
            progress(self.done);
        };
        let _ = send(cutter.finish().into_iter().collect()).await;
        drop((blocks, to_hash));
        let (mut sink, written) = writer.await.map_err(std::io::Error::other)?;
        sink.hasher = hashing.await.map_err(std::io::Error::other)?;
        self.done = sink.len;
        self.sink = Some(sink);
        written.map(|()| end)
    }
}

/// Bytes received per window of `length`: a transfer is too slow when a whole window
/// brought fewer than `min_speed` bytes per second (curl's `--speed-limit`/`--speed-time`).
struct SpeedWindow {
    length: Duration,
    min_speed: u64,
    started: std::time::Instant,
    bytes: u64,
}

impl SpeedWindow {
    fn new(length: Duration, min_speed: u64) -> Self {
        SpeedWindow {
            length,
            min_speed,
            started: std::time::Instant::now(),
            bytes: 0,
        }
    }

    /// Counts `received` bytes; true when the window that just closed was too slow.
    fn too_slow(&mut self, received: u64) -> bool {
        self.bytes += received;
        let elapsed = self.started.elapsed();
        if self.min_speed == 0 || elapsed < self.length {
            return false;
        }
        let slow = (self.bytes as f64) < self.min_speed as f64 * elapsed.as_secs_f64();
        self.started = std::time::Instant::now();
        self.bytes = 0;
        slow
    }
}

/// How a response body ended.
pub(super) enum BodyEnd {
    Complete,
    Stalled,
    TooSlow,
    Broken(String),
    /// More bytes than the limit arrived (the excess was not written).
    TooLong,
}
