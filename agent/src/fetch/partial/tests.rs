//! Blocks cut at the file offset, written around the page cache where they are aligned,
//! and the download still right when the file system refuses that.

use std::os::unix::fs::FileExt;
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::blocks::{ALIGN, BLOCK, Cutter};
use super::{BodyEnd, DirectIo, Partial, Sink};

/// Stands in for `O_DIRECT` on any file system: a plain second descriptor whose writes
/// fail the test unless memory, length and offset are aligned as `O_DIRECT` needs.
const CHECKED: DirectIo = DirectIo {
    open: |file| file.try_clone(),
    write_at: |file, bytes, at| {
        assert_eq!(at % ALIGN as u64, 0, "offset");
        assert_eq!(bytes.len() % ALIGN, 0, "length");
        assert_eq!(bytes.as_ptr() as usize % ALIGN, 0, "memory");
        file.write_all_at(bytes, at)
    },
};

fn einval() -> std::io::Error {
    std::io::Error::from_raw_os_error(nix::libc::EINVAL)
}

/// Bytes that differ from block to block, so a block written at the wrong place shows.
fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + i / 4099) as u8).collect()
}

/// A partial download in a new temporary directory that already holds `data[..done]`.
fn partial(dir: &tempfile::TempDir, data: &[u8], done: usize, io: DirectIo) -> Partial {
    let path = dir.path().join("f.partial");
    std::fs::write(&path, &data[..done]).unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let hasher = Sha256::new_with_prefix(&data[..done]);
    Partial {
        path,
        validator_path: dir.path().join("v.partial"),
        sink: Some(Sink::new(file, hasher, done as u64, io)),
        done: done as u64,
        validator: None,
    }
}

/// Streams `data[partial.done..]` in chunks of odd sizes; the stream's result.
async fn stream(partial: &mut Partial, data: &[u8]) -> std::io::Result<BodyEnd> {
    let rest = data[partial.done as usize..].to_vec();
    let sizes = [100_003, 7, 65_536, 300_001];
    let mut chunks = Vec::new();
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at == rest.len() {
            break;
        }
        let end = (at + size).min(rest.len());
        chunks.push(Ok(Bytes::copy_from_slice(&rest[at..end])));
        at = end;
    }
    let mut body = futures::stream::iter(chunks);
    let limit = data.len() as u64;
    partial
        .stream(&mut body, limit, Duration::from_secs(10), 0, &|_| {})
        .await
}

/// The file and the hash hold exactly `data`; the bytes written around the page cache.
fn check(partial: &Partial, data: &[u8]) -> u64 {
    assert_eq!(partial.done, data.len() as u64);
    assert!(
        std::fs::read(&partial.path).unwrap() == data,
        "file contents"
    );
    let sink = partial.sink.as_ref().unwrap();
    assert_eq!(sink.len, data.len() as u64);
    assert_eq!(
        sink.hasher.clone().finalize(),
        Sha256::digest(data),
        "running hash"
    );
    sink.direct_bytes
}

async fn download(done: usize, io: DirectIo) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let data = data(3 * BLOCK + 777);
    let mut partial = partial(&dir, &data, done, io);
    let end = stream(&mut partial, &data).await.unwrap();
    assert!(matches!(end, BodyEnd::Complete));
    check(&partial, &data)
}

#[test]
fn blocks_end_at_multiples_of_block_of_the_file_offset() {
    let mut cutter = Cutter::new(1000);
    let mut full = Vec::new();
    cutter.push(&data(BLOCK), &mut full);
    cutter.push(&data(BLOCK + 5), &mut full);
    let cuts: Vec<_> = full.iter().map(|b| (b.at, b.len)).collect();
    assert_eq!(cuts, [(1000, BLOCK - 1000), (BLOCK as u64, BLOCK)]);
    let last = cutter.finish().unwrap();
    assert_eq!((last.at, last.len), (2 * BLOCK as u64, 1005));
    assert!(
        full.iter()
            .all(|b| (b.bytes().as_ptr() as usize).is_multiple_of(ALIGN))
    );
}

#[test]
fn blocks_are_reused_once_no_thread_holds_them() {
    let mut cutter = Cutter::new(0);
    let mut full = Vec::new();
    cutter.push(&data(BLOCK), &mut full);
    let first = full.pop().unwrap().block;
    let address = first.bytes().as_ptr();
    drop(first);
    cutter.push(&data(2 * BLOCK), &mut full);
    // The block being filled was taken before the first was free; the one after reuses it.
    assert_eq!(full[1].block.bytes().as_ptr(), address);
}

#[tokio::test]
async fn every_whole_block_goes_around_the_page_cache_and_the_short_last_one_does_not() {
    assert_eq!(download(0, CHECKED).await, 3 * BLOCK as u64);
}

#[tokio::test]
async fn after_an_unaligned_resume_the_first_block_is_buffered_and_the_rest_aligned() {
    assert_eq!(download(1000, CHECKED).await, 2 * BLOCK as u64);
    // A resume at a page boundary: the first block ends at the next BLOCK boundary and is
    // aligned too.
    assert_eq!(
        download(ALIGN, CHECKED).await,
        3 * BLOCK as u64 - ALIGN as u64
    );
}

#[tokio::test]
async fn a_file_system_that_refuses_o_direct_gets_buffered_writes() {
    let refused_open = DirectIo {
        open: |_| Err(einval()),
        ..CHECKED
    };
    assert_eq!(download(0, refused_open).await, 0);
    // Refused at the first write, after it scribbled on part of the block: the block is
    // written again in full, and every later one through the page cache.
    let refused_write = DirectIo {
        write_at: |file, bytes, at| {
            file.write_all_at(&vec![0xAA; bytes.len() / 2], at)?;
            Err(einval())
        },
        ..CHECKED
    };
    assert_eq!(download(1000, refused_write).await, 0);
}

#[tokio::test]
async fn a_direct_write_error_gives_the_download_up() {
    let failing = DirectIo {
        write_at: |_, _, _| Err(std::io::Error::from_raw_os_error(nix::libc::EIO)),
        ..CHECKED
    };
    let dir = tempfile::tempdir().unwrap();
    let data = data(2 * BLOCK);
    let mut partial = partial(&dir, &data, 0, failing);
    let error = stream(&mut partial, &data).await.err().expect("an error");
    assert_eq!(error.raw_os_error(), Some(nix::libc::EIO));
}

#[tokio::test]
async fn the_kernels_o_direct_or_its_refusal_gives_the_same_file() {
    download(1000, DirectIo::KERNEL).await;
    download(0, DirectIo::KERNEL).await;
}
