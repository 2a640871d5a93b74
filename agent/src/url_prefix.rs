//! Where artifacts may come from: a URL prefix of the node's policy, compared by parts.
//!
//! A prefix names a scheme, a host, a port and a directory. A URL is under it when the
//! scheme, host and port are equal and the prefix's path segments, percent-decoded, are the
//! first segments of the URL's. Comparing strings admitted `https://dl.example.attacker.net/`
//! under `https://dl.example`, and `.../pub/..%2f..` under `.../pub/`.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use percent_encoding::percent_decode_str;
use url::Url;

/// One entry of `policy.allowed_url_prefixes`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlPrefix {
    text: String,
    scheme: String,
    host: String,
    port: Option<u16>,
    segments: Vec<String>,
}

impl UrlPrefix {
    /// The scheme (`http` or `https`).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// Whether `url` is under this prefix: same scheme, host and port, and this prefix's
    /// decoded path segments first, followed by at least one more (a file in it). A URL whose path cannot be read unambiguously (a decoded
    /// segment holding `/`, `.` or `..`) is under no prefix.
    pub fn admits(&self, url: &Url) -> bool {
        let Some(segments) = decoded_segments(url) else {
            return false;
        };
        url.scheme() == self.scheme
            && url.host_str() == Some(self.host.as_str())
            && url.port_or_known_default() == self.port
            && segments.len() > self.segments.len()
            && self.segments.iter().zip(&segments).all(|(p, s)| p == s)
    }

    /// What follows this prefix in `url` when it admits it: the rest of the path as written
    /// (still encoded) and the query, so the same file can be named under another prefix.
    pub fn remainder(&self, url: &Url) -> Option<String> {
        if !self.admits(url) {
            return None;
        }
        let rest: Vec<&str> = url.path_segments()?.skip(self.segments.len()).collect();
        let mut rest = rest.join("/");
        if let Some(query) = url.query() {
            rest.push('?');
            rest.push_str(query);
        }
        Some(rest)
    }
}

impl FromStr for UrlPrefix {
    type Err = String;

    /// Refuses a prefix that could be read two ways: one that is not `scheme://host[:port]/dir/`
    /// (credentials, a query or fragment, a path not ending in `/` that might be meant as the
    /// start of a file name, a `.`/`..` or encoded `/` in a segment).
    fn from_str(text: &str) -> Result<Self, String> {
        let url = Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{text:?}: scheme {} is not http(s)", url.scheme()));
        }
        let host = url
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| format!("{text:?} names no host"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!("{text:?}: credentials are not allowed in a prefix"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("{text:?}: a prefix has no query or fragment"));
        }
        if !url.path().ends_with('/') {
            return Err(format!(
                "{text:?} is ambiguous: prefixes are compared by whole path segments, not as \
                 strings; end it with `/` to name a directory"
            ));
        }
        let mut segments = decoded_segments(&url)
            .ok_or_else(|| format!("{text:?}: a path segment holds an encoded `/`, `.` or `..`"))?;
        segments.pop(); // the empty segment after the final `/`
        Ok(UrlPrefix {
            text: text.to_owned(),
            scheme: url.scheme().to_owned(),
            host: host.to_owned(),
            port: url.port_or_known_default(),
            segments,
        })
    }
}

impl fmt::Display for UrlPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The path's segments, percent-decoded; `None` when one decodes to something a server may
/// read as more than one segment (`a%2Fb`) or as a step up or in place (`%2e%2e`).
fn decoded_segments(url: &Url) -> Option<Vec<String>> {
    url.path_segments()?
        .map(|segment| {
            let decoded: Cow<'_, str> = percent_decode_str(segment).decode_utf8().ok()?;
            let plain = !decoded.contains(['/', '\\']) && decoded != "." && decoded != "..";
            plain.then(|| decoded.into_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admits(prefix: &str, url: &str) -> bool {
        let prefix: UrlPrefix = prefix.parse().unwrap();
        prefix.admits(&Url::parse(url).unwrap())
    }

    #[test]
    fn host_and_port_are_compared_exactly() {
        assert!(admits("https://dl.example/", "https://dl.example/a.raw"));
        assert!(admits(
            "https://dl.example/",
            "https://DL.example:443/a.raw"
        ));
        assert!(!admits(
            "https://dl.example/",
            "https://dl.example.attacker.net/a.raw"
        ));
        assert!(!admits(
            "https://dl.example/",
            "https://dl.example:8443/a.raw"
        ));
        assert!(!admits("https://dl.example/", "http://dl.example/a.raw"));
        assert!(admits("http://127.0.0.1:8080/", "http://127.0.0.1:8080/x"));
        assert!(!admits(
            "http://127.0.0.1:8080/",
            "http://127.0.0.1:18080/x"
        ));
    }

    #[test]
    fn paths_are_compared_by_decoded_segments() {
        let pub_dir = "https://dl.example/pub/";
        assert!(admits(pub_dir, "https://dl.example/pub/k8s/a.raw"));
        assert!(admits(pub_dir, "https://dl.example/pub/a%20b.raw"));
        assert!(admits(pub_dir, "https://dl.example/%70ub/a.raw"));
        assert!(!admits(pub_dir, "https://dl.example/public/a.raw"));
        assert!(!admits(pub_dir, "https://dl.example/pub"));
        assert!(!admits(pub_dir, "https://dl.example/pub/../secret/a.raw"));
        assert!(!admits(pub_dir, "https://dl.example/pub/..%2fsecret/a.raw"));
        assert!(!admits(
            pub_dir,
            "https://dl.example/pub/%2e%2e/secret/a.raw"
        ));
        assert!(!admits(pub_dir, "https://dl.example/pub/a%2Fb.raw"));
        assert!(!admits(pub_dir, "https://dl.example/pub/a%5Cb.raw"));
    }

    #[test]
    fn ambiguous_prefixes_are_refused_with_the_reason() {
        for (prefix, why) in [
            ("https://dl.example/pub", "end it with `/`"),
            ("https://dl.example/kube-", "end it with `/`"),
            ("https://dl.example/pub/#top", "no query"),
            ("https://u:p@dl.example/", "credentials"),
            ("https://dl.example/?x=1", "no query"),
            ("https://dl.example/a%2Fb/", "encoded `/`"),
            ("file:///srv/", "not http(s)"),
            ("dl.example/", "not a URL"),
        ] {
            let error = prefix.parse::<UrlPrefix>().unwrap_err();
            assert!(error.contains(why), "{prefix}: {error}");
        }
        // A host alone means its whole tree (the URL parser gives it the path `/`).
        assert!(admits("https://dl.example", "https://dl.example/any/a.raw"));
    }
}
