//! The blocks a body is cut into on its way to the writer and the hasher: page-aligned
//! memory (what `O_DIRECT` needs), cut at multiples of [`BLOCK`] of the file offset, and
//! reused once both threads are done with them.

use std::sync::Arc;

/// Bytes are handed to the writer and hasher threads in blocks of this size, and each is
/// one write: a write around the page cache waits for the disk, which takes large writes
/// faster than small ones. 1 GiB from a local nginx, 2-core machine, alternating runs,
/// medians of 4 (with [`super::QUEUED`]): 1.05 s with 2 MiB × 4 queued, 1.17 with 1 MiB × 4,
/// 1.22 with 2 MiB × 2, 1.57 with 512 KiB × 2 (1.54 for the buffered writer before).
pub(super) const BLOCK: usize = 2 << 20;

/// What a write around the page cache needs of its memory, its length and its file
/// offset: 4096 is the largest logical block size a disk has and a multiple of every
/// smaller one.
pub(super) const ALIGN: usize = 4096;

/// Blocks kept for reuse: as many as can be alive at once (one being filled, one being
/// handed over, the slower thread's queue and the one it works on; the faster thread only
/// holds blocks the slower one still has), so a download allocates them once and then only
/// recycles.
const KEPT: usize = super::QUEUED + 4;

/// [`BLOCK`] bytes of anonymous memory mapped for this block alone: page-aligned, as a
/// write around the page cache needs, and given back to the kernel when the block is
/// dropped. From the heap, the allocator would keep a download's freed blocks (it raises
/// its thresholds for returning memory to the size of blocks freed before) in the agent's
/// memory between updates.
pub(super) struct AlignedBlock(memmap2::MmapMut);

impl AlignedBlock {
    fn new() -> Self {
        match memmap2::MmapMut::map_anon(BLOCK) {
            Ok(memory) => AlignedBlock(memory),
            // Out of memory, handled as a failed `vec!` is: Rust's handler ends the process.
            Err(_) => std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; BLOCK]>()),
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

/// A filled block: its first `len` bytes belong in the file at `at`. The writer and the
/// hasher share it (one allocation, no copy).
#[derive(Clone)]
pub(super) struct Filled {
    pub(super) block: Arc<AlignedBlock>,
    pub(super) len: usize,
    pub(super) at: u64,
}

impl Filled {
    pub(super) fn bytes(&self) -> &[u8] {
        &self.block.bytes()[..self.len]
    }
}

/// Cuts received chunks into [`Filled`] blocks that end at multiples of [`BLOCK`] of the
/// file offset: after a resume at an unaligned offset only the first block is short, and
/// every later one starts aligned and can be written around the page cache.
pub(super) struct Cutter {
    block: Arc<AlignedBlock>,
    filled: usize,
    /// Where the block being filled starts in the file.
    at: u64,
    /// Blocks handed out, reused once no thread holds them any more.
    kept: Vec<Arc<AlignedBlock>>,
}

impl Cutter {
    /// A cutter for bytes that go into the file from offset `at`.
    pub(super) fn new(at: u64) -> Self {
        Cutter {
            block: Arc::new(AlignedBlock::new()),
            filled: 0,
            at,
            kept: Vec::new(),
        }
    }

    /// Where the block being filled ends: the next multiple of [`BLOCK`] after its start.
    fn room(&self) -> usize {
        BLOCK - (self.at % BLOCK as u64) as usize
    }

    /// Copies `chunk` into blocks; every block it completes goes to `full`, in order.
    pub(super) fn push(&mut self, mut chunk: &[u8], full: &mut Vec<Filled>) {
        while !chunk.is_empty() {
            let n = chunk.len().min(self.room() - self.filled);
            let block = Arc::get_mut(&mut self.block).expect("the block being filled is ours");
            block.bytes_mut()[self.filled..self.filled + n].copy_from_slice(&chunk[..n]);
            self.filled += n;
            chunk = &chunk[n..];
            if self.filled == self.room() {
                full.push(self.take());
            }
        }
    }

    /// The bytes of the block being filled, if any (the end of the body).
    pub(super) fn finish(self) -> Option<Filled> {
        // No block after it: handed over as it is, nothing taken for the next one.
        (self.filled > 0).then(|| Filled {
            block: self.block,
            len: self.filled,
            at: self.at,
        })
    }

    fn take(&mut self) -> Filled {
        let next = self.reusable();
        let block = std::mem::replace(&mut self.block, next);
        if self.kept.len() < KEPT {
            self.kept.push(block.clone());
        }
        let filled = Filled {
            block,
            len: self.filled,
            at: self.at,
        };
        self.at += self.filled as u64;
        self.filled = 0;
        filled
    }

    /// A block no thread holds any more, or a new one.
    fn reusable(&mut self) -> Arc<AlignedBlock> {
        match self.kept.iter_mut().position(|b| Arc::get_mut(b).is_some()) {
            Some(i) => self.kept.swap_remove(i),
            None => Arc::new(AlignedBlock::new()),
        }
    }
}
