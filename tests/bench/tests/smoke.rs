//! Keeps `inplace-bench` working: the cheap measurement in `--quick` mode (16 MiB, one
//! repetition) produces its rows. Never asserts on a timing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn has(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn quick_download_produces_rows() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inplace-bench"));
    cmd.args(["download", "--quick", "--dir"]).arg(dir.path());
    // nginx is installed by `make bench` (scripts/bench.sh), not by `make test`.
    let nginx = has("nginx");
    if !nginx {
        cmd.arg("--no-nginx");
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "from artifact server: curl -o f (the disk-write limit",
        "dd conv=fsync of the cached file",
        "from artifact server: curl \\| tee f \\| openssl dgst -sha256",
        "from artifact server: agent fetcher",
        "fetcher peak RSS",
        "openssl dgst -sha256 (cached file",
    ] {
        assert!(stdout.contains(row), "no row {row:?} in\n{stdout}");
    }
    if nginx {
        assert!(stdout.contains("from nginx: agent fetcher"), "{stdout}");
    }
}
