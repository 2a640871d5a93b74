//! `inplace-controller capi` serves the Cluster API extension; bad flags are refused with a
//! message naming the flag, before anything is contacted.

use std::process::Command;

#[test]
fn capi_refuses_bad_settings_with_a_clear_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_inplace-controller"))
        .args([
            "capi",
            "--cert",
            "/nonexistent/tls.crt",
            "--key",
            "/nonexistent/tls.key",
        ])
        .args(["--retry-after-seconds", "0", "--drain-timeout", "10m"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("retry-after-seconds 0"), "{stderr}");
}

#[test]
fn capi_is_a_subcommand_with_its_flags() {
    let output = Command::new(env!("CARGO_BIN_EXE_inplace-controller"))
        .args(["capi", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in ["--listen", "--cert", "--key", "--drain", "--drain-timeout"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}
