//! URLs: parsed with a length limit, http(s) only and without credentials, and the file
//! name at their end.

use url::Url;

use super::{Collector, check_artifact_name};

/// Longest URL accepted anywhere.
pub(super) const MAX_URL_LEN: usize = 2048;

pub(crate) fn parse_url(text: &str) -> Result<Url, String> {
    if text.len() > MAX_URL_LEN {
        return Err(format!(
            "{} characters is longer than {MAX_URL_LEN}",
            text.len()
        ));
    }
    Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))
}

/// A `signatureUrl` (of the object at `path`), when given: a URL, http(s), no credentials.
pub(crate) fn check_signature_url(signature_url: Option<&str>, path: &str, out: &mut Collector) {
    if let Some(signature_url) = signature_url {
        let at = format!("{path}.signatureUrl");
        match parse_url(signature_url) {
            Ok(url) => check_url_scheme_and_credentials(&url, &at, out),
            Err(message) => out.invalid(at, message),
        }
    }
}

pub(crate) fn check_url_scheme_and_credentials(url: &Url, path: &str, out: &mut Collector) {
    if !matches!(url.scheme(), "https" | "http") {
        out.denied(
            path,
            format!("scheme {}:// is not allowed; use https", url.scheme()),
        );
    }
    if !url.username().is_empty() || url.password().is_some() {
        out.denied(path, "credentials in URLs are not allowed");
    }
}

/// The last path segment of a URL, when it is a usable file name.
pub fn url_file_name(url: &Url) -> Option<&str> {
    let name = url.path_segments()?.next_back()?;
    (check_artifact_name(name).is_ok()).then_some(name)
}

/// The last path segment of a URL as written (percent-encoded), when there is one: the
/// `file:` a signature's trusted comment must name.
pub fn url_basename(url: &Url) -> Option<&str> {
    url.path_segments()?
        .next_back()
        .filter(|name| !name.is_empty())
}
