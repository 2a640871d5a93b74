//! The partial download between attempts (and, through `resume`, between processes): the
//! temporary file, the running hash of what it holds, and the streaming of one response body
//! into it with the stall and minimum-speed checks.

use std::path::PathBuf;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::{Progress, error_chain};

/// Bytes are handed to the writer thread in blocks of this size: large enough that the
/// channel and thread hand-off cost nothing next to the write and the hash.
const BLOCK: usize = 512 << 10;

/// Blocks waiting for the writer. Two keep the network and the disk both busy; more would
/// only pile up in memory while the disk is the slower side (as it is for a large artifact
/// once writeback throttles), so the fetcher's memory stays flat at about
/// (QUEUED + 2) × BLOCK whatever the artifact's size (the writer and the hasher share
/// each block, so the slower of them sets the bound).
const QUEUED: usize = 2;

/// Every this many bytes the writer asks the kernel to start writing back and drop what is
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
    pub(super) advised: u64,
}

impl Sink {
    /// Writes `block` (the caller hashes it).
    fn write_block(&mut self, block: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        self.file.write_all(block)?;
        self.len += block.len() as u64;
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
        use std::io::Seek;
        self.file.set_len(0)?;
        self.file.seek(std::io::SeekFrom::Start(0))?;
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
        let (blocks, mut incoming) = tokio::sync::mpsc::channel::<Bytes>(QUEUED);
        let (to_hash, mut to_hasher) = tokio::sync::mpsc::channel::<Bytes>(QUEUED);
        let writer = tokio::task::spawn_blocking(move || {
            while let Some(block) = incoming.blocking_recv() {
                if let Err(e) = sink.write_block(&block) {
                    return (sink, Err(e));
                }
            }
            (sink, Ok(()))
        });
        let hashing = tokio::task::spawn_blocking(move || {
            while let Some(block) = to_hasher.blocking_recv() {
                hasher.update(&block);
            }
            hasher
        });
        // Both threads get the same block (a shared buffer, not a copy); it is freed when
        // the slower one is done with it, so memory stays flat at the slower side's queue.
        let send = |block: Bytes| {
            let (blocks, to_hash) = (&blocks, &to_hash);
            async move {
                let hashed = to_hash.send(block.clone()).await.is_ok();
                hashed && blocks.send(block).await.is_ok()
            }
        };
        let mut pending = BytesMut::with_capacity(BLOCK);
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
            pending.extend_from_slice(&chunk);
            if pending.len() >= BLOCK && !send(pending.split().freeze()).await {
                // The writer stopped on an error; it is returned below.
                break BodyEnd::Complete;
            }
            progress(self.done);
        };
        if !pending.is_empty() {
            let _ = send(pending.freeze()).await;
        }
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
