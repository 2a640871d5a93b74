//! Archives from the network: any bytes are extracted or refused whole, and nothing is
//! ever written outside the staging directory.
#![no_main]

use inplace_agent::archive::{Limits, extract_members};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else { return };
    let archive = dir.path().join("input.tar");
    if std::fs::write(&archive, data).is_err() {
        return;
    }
    let staging = dir.path().join("staging");
    let limits = Limits { max_entries: 64, max_bytes: 1 << 20, reserved_disk_space: 0 };
    let _ = extract_members(&archive, &["bin/kubeadm", "a"], &staging, limits);
    // Only the input and (at most) the staging directory may exist afterwards.
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    names.sort();
    names.retain(|n| n != "input.tar" && n != "staging");
    assert!(names.is_empty(), "archive extraction wrote outside staging: {names:?}");
});
