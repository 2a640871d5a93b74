//! A node policy's `allowed_url_prefixes` entry and a plan's artifact URL: parsing either must
//! never panic, and an admitted URL must really lie under the prefix however it is spelled.
#![no_main]

use inplace_agent::url_prefix::UrlPrefix;
use libfuzzer_sys::fuzz_target;
use url::Url;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The first line is the prefix (policy), the rest the URL (plan).
    let (prefix_text, url_text) = text.split_once('\n').unwrap_or((text, ""));
    let Ok(prefix) = prefix_text.parse::<UrlPrefix>() else {
        return;
    };
    // A prefix that parsed reads back the same from its own text.
    assert_eq!(
        prefix.to_string().parse::<UrlPrefix>().as_ref(),
        Ok(&prefix)
    );
    let Ok(url) = Url::parse(url_text) else {
        return;
    };
    if prefix.admits(&url) {
        assert_eq!(url.scheme(), prefix.scheme());
        // The URL a server receives (its serialisation) is admitted too: no second reading.
        let reparsed = Url::parse(url.as_str()).expect("a URL's serialisation parses");
        assert!(
            prefix.admits(&reparsed),
            "{prefix} admits {url} but not its serialisation"
        );
        // Whatever a server does with `..` in the URL, it never climbs above the prefix.
        assert!(!url.path_segments().into_iter().flatten().any(|s| s == ".."));
    }
});
