//! Packed images kept by what they hold. Packing a real kubelet (an 80 MiB binary) costs
//! mksquashfs a third of a CPU-second (zstd, level 1), and every cluster, demo and crash bed of a test run packs the
//! same few; `pack` gives the same bytes for the same content (no owner, time or xattr of
//! the build machine), so a copy of the kept image is the image a new pack would make.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::{COMPRESSION, Entry, SysextBuilder, SysextImage, sha256_hex};
use crate::Result;
use crate::error::IoContext;

/// How `build` packs a tree (with [`COMPRESSION`]): part of every key, so that an image kept
/// by an earlier way of packing is never taken for a new one. Change it with `build` or `pack`.
const PACKING: &str = "chmod -R u+rwX,go+rX,go-w; mksquashfs -noappend -all-root -no-xattrs \
                       -mkfs-time 0 -all-time 0";

impl SysextBuilder {
    /// [`SysextBuilder::build`] through `cache`: the first build of this content (in any
    /// process) packs it there, the others copy it to `out`.
    pub async fn build_cached(&self, out: &Path, cache: &Path) -> Result<SysextImage> {
        let key = self.content_key();
        let kept = cache.join(format!("{key}.raw"));
        if !tokio::fs::try_exists(&kept).await.unwrap_or(false) {
            // Packed beside the kept name and renamed: a concurrent build of the same
            // content renames the same bytes, and no reader sees a half-written image.
            let partial = cache.join(format!(".{key}.{}.partial", std::process::id()));
            self.build(&partial).await?;
            tokio::fs::rename(&partial, &kept)
                .await
                .ctx(|| format!("renaming {} to {}", partial.display(), kept.display()))?;
        }
        if let Some(parent) = out.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .ctx(|| format!("creating {}", parent.display()))?;
        }
        tokio::fs::copy(&kept, out)
            .await
            .ctx(|| format!("copying {} to {}", kept.display(), out.display()))?;
        let bytes = tokio::fs::read(out)
            .await
            .ctx(|| format!("reading {}", out.display()))?;
        Ok(SysextImage {
            name: self.name.clone(),
            path: out.to_path_buf(),
            sha256: sha256_hex(&bytes),
            size: bytes.len() as u64,
        })
    }

    /// The sha256 of everything the image is packed from, each part length-prefixed.
    fn content_key(&self) -> String {
        let mut hash = Sha256::new();
        let mut part = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        part(PACKING.as_bytes());
        for option in COMPRESSION {
            part(option.as_bytes());
        }
        part(self.name.as_bytes());
        part(self.release_dir.as_bytes());
        part(self.release_file_name.as_bytes());
        let release = self.release.as_ref().map(|r| r.render());
        part(release.unwrap_or_default().as_bytes());
        for (path, entry) in &self.entries {
            part(path.as_os_str().as_encoded_bytes());
            match entry {
                Entry::File { contents, mode } => {
                    part(b"file");
                    part(&mode.to_le_bytes());
                    part(contents);
                }
                Entry::Symlink { target } => {
                    part(b"symlink");
                    part(target.as_os_str().as_encoded_bytes());
                }
            }
        }
        hex::encode(hash.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_of_the_content_changes_the_key() {
        let base = SysextBuilder::new("kubernetes").file("usr/bin/kubelet", b"a".to_vec(), 0o755);
        let key = base.content_key();
        assert_eq!(key, base.clone().content_key());
        let others = [
            SysextBuilder::new("kubernetes").file("usr/bin/kubelet", b"b".to_vec(), 0o755),
            SysextBuilder::new("kubernetes").file("usr/bin/kubelet", b"a".to_vec(), 0o700),
            SysextBuilder::new("kubernetes").file("usr/bin/kubectl", b"a".to_vec(), 0o755),
            SysextBuilder::new("other").file("usr/bin/kubelet", b"a".to_vec(), 0o755),
            base.clone().release(None),
            base.clone().symlink("usr/bin/k", "kubelet"),
        ];
        for other in others {
            assert_ne!(other.content_key(), key, "{other:?}");
        }
    }

    /// A second build of the same content, here from the cache, is the image a pack makes.
    #[tokio::test]
    async fn a_kept_image_is_the_image_a_new_pack_makes() {
        crate::prereq::require_squashfs_tools().expect("prerequisites");
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let builder = SysextBuilder::new("kubernetes").file("usr/bin/x", b"x".to_vec(), 0o755);
        let first = builder
            .build_cached(&dir.path().join("1.raw"), &cache)
            .await
            .unwrap();
        let second = builder
            .build_cached(&dir.path().join("2.raw"), &cache)
            .await
            .unwrap();
        let packed = builder.build(&dir.path().join("3.raw")).await.unwrap();
        assert_eq!(
            (first.sha256.clone(), first.size),
            (packed.sha256, packed.size)
        );
        assert_eq!((second.sha256, second.size), (first.sha256, first.size));
        assert_eq!(second.path, dir.path().join("2.raw"));
        assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 1);
    }
}
