//! Writing around the page cache (`O_DIRECT`): the blocks of a large download go straight
//! from the fetcher's memory to the disk, without a copy into the page cache, the dirty
//! pages' writeback and their reclaim; those cost as much CPU as the hash on a node with
//! few cores. A file system that refuses it (overlayfs on some kernels, tmpfs before 6.6)
//! gets buffered writes for the rest of the download, correct either way.
//!
//! A write around the page cache waits for the disk, so the blocks are large and several
//! are queued (`blocks::BLOCK`, `QUEUED`). With 512 KiB blocks, two queued, on the 2-core
//! machine beside another build (12 alternating runs each) it already took 1.43 s for 1 GiB
//! against 1.50 buffered, and 0.85 s of system CPU against 1.15: the CPU it saves is what
//! the hash and the receiving share.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use super::blocks::ALIGN;

/// The two system calls the direct path makes, so that a test can refuse either without a
/// file system that does.
#[derive(Clone, Copy)]
pub(in crate::fetch) struct DirectIo {
    /// A second descriptor on the same file that writes around the page cache.
    pub(in crate::fetch) open: fn(&File) -> std::io::Result<File>,
    /// One positional write on that descriptor.
    pub(in crate::fetch) write_at: fn(&File, &[u8], u64) -> std::io::Result<()>,
}

impl DirectIo {
    /// The kernel's: the file reopened through `/proc/self/fd` (the same inode whatever
    /// happened to its name) with `O_DIRECT`.
    pub(in crate::fetch) const KERNEL: DirectIo = DirectIo {
        open: reopen_direct,
        write_at: |file, bytes, at| file.write_all_at(bytes, at),
    };
}

fn reopen_direct(file: &File) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Whether the direct descriptor is there, not tried yet, or refused for this download.
pub(super) enum Direct {
    Untried(DirectIo),
    Open(DirectIo, File),
    Refused,
}

/// What became of a block offered to [`Direct::write`].
pub(super) enum Written {
    /// On disk around the page cache.
    Direct,
    /// Not written: the caller writes it through the page cache.
    Buffered,
}

impl Direct {
    /// Writes `bytes` at `at` in `file` around the page cache when all three are aligned
    /// (memory, length, offset) and the file system takes it. A
    /// refusal (the descriptor cannot be opened, or a write answers `EINVAL`) turns the
    /// direct path off for good and leaves the block to the caller: positional writes make
    /// writing it again in full correct whatever part of it the refused write left.
    pub(super) fn write(&mut self, file: &File, bytes: &[u8], at: u64) -> std::io::Result<Written> {
        let aligned = at.is_multiple_of(ALIGN as u64)
            && bytes.len().is_multiple_of(ALIGN)
            && (bytes.as_ptr() as usize).is_multiple_of(ALIGN);
        if !aligned {
            return Ok(Written::Buffered);
        }
        if let Direct::Untried(io) = self {
            *self = match (io.open)(file) {
                Ok(file) => Direct::Open(*io, file),
                Err(e) => {
                    tracing::debug!(error = %e, "writes go through the page cache: O_DIRECT refused");
                    Direct::Refused
                }
            };
        }
        let Direct::Open(io, direct) = self else {
            return Ok(Written::Buffered);
        };
        match (io.write_at)(direct, bytes, at) {
            Ok(()) => Ok(Written::Direct),
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                tracing::debug!(error = %e, "writes go through the page cache: O_DIRECT write refused");
                *self = Direct::Refused;
                Ok(Written::Buffered)
            }
            Err(e) => Err(e),
        }
    }
}
