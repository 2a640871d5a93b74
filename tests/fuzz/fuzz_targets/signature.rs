//! A signature file from an artifact server: parsing and the trusted-comment replay checks
//! must never panic, whatever the bytes.
#![no_main]

use inplace_agent::signature::{Subject, check_trusted_comment, parse};
use libfuzzer_sys::fuzz_target;

fn subject(version: Option<&str>, version_required: bool) -> Subject<'_> {
    Subject {
        file: "kubernetes.raw",
        version,
        version_required,
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(parsed) = parse(data) {
        let _ = check_trusted_comment(parsed.trusted_comment(), subject(Some("v1.31.2"), true));
    }
    // The comment rules on their own, over any text (a signature need not parse to reach
    // them in a later version of the format).
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = check_trusted_comment(text, subject(Some("v1.31.2"), true));
        let _ = check_trusted_comment(text, subject(Some("v1.31.2"), false));
        let _ = check_trusted_comment(text, subject(None, true));
    }
});
