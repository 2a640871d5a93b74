//! The agent's TOML configuration: any text gives settings or an error naming the key.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = inplace_agent::settings::from_toml(text, || Some("node-1".to_owned()));
});
