//! Builds a NodeRelease from a sysext-bakery style `SHA256SUMS` file: parse the file
//! strictly, pick the one image that matches the wanted extension, version and
//! architecture, and turn it into a release that passes the API's own validation.
//!
//! Everything here is pure; `release::fetch` brings the text.

use std::collections::HashMap;
use std::fmt;

use inplace_proto::validate::{check_artifact_name, check_sha256};
use inplace_proto::{NodeRelease, Problems};

use super::extension::{Image, release_for};
use url::Url;

/// How many candidates an error lists before it only counts the rest.
const MAX_LISTED: usize = 20;

/// Why no release could be built. Each variant has a stable [`ImportError::kind`].
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A command-line value cannot be used.
    #[error("{flag} {value:?}: {message}")]
    InvalidArgument {
        /// The flag or argument, as typed (`--version`).
        flag: &'static str,
        /// The value given.
        value: String,
        /// What is wrong with it.
        message: String,
    },
    /// A line of the SHA256SUMS file is not `<64 hex digits>  <file name>`.
    #[error("SHA256SUMS line {line}: {message}")]
    MalformedLine {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The same file is listed twice.
    #[error("SHA256SUMS line {line}: {file} is listed again (first on line {first_line})")]
    DuplicateFile {
        /// 1-based line number of the repeat.
        line: usize,
        /// 1-based line number of the first listing.
        first_line: usize,
        /// The file name.
        file: String,
    },
    /// No listed image matches.
    #[error("no image in SHA256SUMS matches {wanted}; {}", Listing(.candidates))]
    NoMatch {
        /// What was looked for.
        wanted: Wanted,
        /// The images that were listed (same extension first, else every image).
        candidates: Vec<String>,
    },
    /// More than one listed image matches.
    #[error("several images in SHA256SUMS match {wanted}: {}; give --version and --arch exactly as one of them spells them", .matches.join(", "))]
    SeveralMatches {
        /// What was looked for.
        wanted: Wanted,
        /// Every match.
        matches: Vec<String>,
    },
    /// The release built from the file does not pass the API's validation.
    #[error("the release would be invalid: {0}")]
    InvalidRelease(#[source] Problems),
}

impl ImportError {
    /// A short, stable, machine-readable kind (printed with the message).
    pub fn kind(&self) -> &'static str {
        match self {
            ImportError::InvalidArgument { .. } => "invalid_argument",
            ImportError::MalformedLine { .. } => "malformed_line",
            ImportError::DuplicateFile { .. } => "duplicate_file",
            ImportError::NoMatch { .. } => "no_match",
            ImportError::SeveralMatches { .. } => "several_matches",
            ImportError::InvalidRelease(_) => "invalid_release",
        }
    }
}

/// The candidates of a [`ImportError::NoMatch`], in words.
struct Listing<'a>(&'a [String]);

impl fmt::Display for Listing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("it lists no .raw images");
        }
        let shown = &self.0[..self.0.len().min(MAX_LISTED)];
        write!(f, "it lists {}", shown.join(", "))?;
        if self.0.len() > shown.len() {
            write!(f, " and {} more", self.0.len() - shown.len())?;
        }
        Ok(())
    }
}

/// One line of a SHA256SUMS file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChecksumEntry {
    /// 1-based line number.
    pub line: usize,
    /// 64 lowercase hex digits.
    pub sha256: String,
    /// The file name, relative to the SHA256SUMS file.
    pub file: String,
}

/// Parses the output of `sha256sum` (text `  ` or binary ` *` mode): every non-empty line
/// must be a digest and a file name, and no file may be listed twice.
pub fn parse_sha256sums(text: &str) -> Result<Vec<ChecksumEntry>, ImportError> {
    let mut entries = Vec::new();
    let mut first_line_of: HashMap<&str, usize> = HashMap::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let malformed = |message: String| ImportError::MalformedLine { line, message };
        let (digest, rest) = raw
            .split_once(' ')
            .ok_or_else(|| malformed("expected `<sha256>  <file>`".into()))?;
        if digest.starts_with('\\') {
            return Err(malformed(
                "escaped file names (a backslash before the digest) are not supported".into(),
            ));
        }
        // sha256sum accepts either case when checking; the API wants lowercase.
        let sha256 = digest.to_ascii_lowercase();
        check_sha256(&sha256).map_err(|why| malformed(format!("the digest {why}")))?;
        let file = rest
            .strip_prefix(' ')
            .or_else(|| rest.strip_prefix('*'))
            .ok_or_else(|| {
                malformed("expected two spaces (or ` *`) between digest and file name".into())
            })?;
        if file.is_empty() || file.chars().any(char::is_control) || file.trim() != file {
            return Err(malformed(format!(
                "{file:?} is not a file name (empty, or with control characters or surrounding spaces)"
            )));
        }
        if let Some(first_line) = first_line_of.insert(file, line) {
            return Err(ImportError::DuplicateFile {
                line,
                first_line,
                file: file.to_owned(),
            });
        }
        entries.push(ChecksumEntry {
            line,
            sha256,
            file: file.to_owned(),
        });
    }
    Ok(entries)
}

/// The image to pick: `<name>-<version>-<arch>.raw`, as sysext-bakery names them
/// (`kubernetes-v1.31.2-x86-64.raw`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The extension name (also the artifact name).
    pub name: String,
    /// The version as given (`v1.31.2`); matches with or without the leading `v`.
    pub version: String,
    /// The architecture in bakery spelling (`x86-64`, `arm64`).
    pub arch: String,
}

impl fmt::Display for Wanted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}.raw", self.name, self.version, self.arch)
    }
}

impl Wanted {
    /// Checks the command-line values; `arch` may also be spelled `amd64`, `x86_64` or
    /// `aarch64`.
    pub fn new(name: &str, version: &str, arch: &str) -> Result<Wanted, ImportError> {
        let invalid = |flag, value: &str, message: String| ImportError::InvalidArgument {
            flag,
            value: value.to_owned(),
            message,
        };
        check_extension(name, version)?;
        check_file_name_part(arch).map_err(|m| invalid("--arch", arch, m))?;
        Ok(Wanted {
            name: name.to_owned(),
            version: version.to_owned(),
            arch: bakery_arch(arch).to_owned(),
        })
    }

    /// Whether `file` is this image, with or without `v` before the version and with any
    /// spelling of the architecture.
    fn matches(&self, file: &str) -> bool {
        let Some(middle) = file
            .strip_prefix(self.name.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|rest| rest.strip_suffix(".raw"))
        else {
            return false;
        };
        arch_spellings(&self.arch).iter().any(|arch| {
            middle
                .strip_suffix(arch)
                .and_then(|rest| rest.strip_suffix('-'))
                .is_some_and(|version| without_v(version) == without_v(&self.version))
        })
    }

    /// The extension's images, for telling what else is there.
    fn is_same_extension(&self, file: &str) -> bool {
        file.strip_prefix(self.name.as_str())
            .is_some_and(|rest| rest.starts_with('-') && rest.ends_with(".raw"))
    }
}

/// Checks `--name` (an artifact name) and `--version` (part of a file name).
pub fn check_extension(name: &str, version: &str) -> Result<(), ImportError> {
    let invalid = |flag, value: &str, message: String| ImportError::InvalidArgument {
        flag,
        value: value.to_owned(),
        message,
    };
    check_artifact_name(name).map_err(|m| invalid("--name", name, m))?;
    check_file_name_part(version).map_err(|m| invalid("--version", version, m))
}

/// Versions and architectures become part of a file name in a URL: only characters that
/// need no escaping.
fn check_file_name_part(value: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+');
    if value.is_empty() || value.len() > 64 {
        return Err("must have 1 to 64 characters".into());
    }
    if !value.chars().all(allowed) {
        return Err("may hold only letters, digits, '.', '_', '-' and '+'".into());
    }
    Ok(())
}

pub(super) fn without_v(version: &str) -> &str {
    version.strip_prefix('v').unwrap_or(version)
}

/// The bakery's spelling of an architecture (as systemd's `%a` writes it).
fn bakery_arch(arch: &str) -> &str {
    match arch {
        "amd64" | "x86_64" => "x86-64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn arch_spellings(bakery: &str) -> Vec<&str> {
    match bakery {
        "x86-64" => vec!["x86-64", "x86_64", "amd64"],
        "arm64" => vec!["arm64", "aarch64"],
        other => vec![other],
    }
}

/// Picks the one entry that is the wanted image; when there is none or more than one, the
/// error lists what there is.
pub fn select<'e>(
    entries: &'e [ChecksumEntry],
    wanted: &Wanted,
) -> Result<&'e ChecksumEntry, ImportError> {
    let matches: Vec<&ChecksumEntry> = entries.iter().filter(|e| wanted.matches(&e.file)).collect();
    // Spellings can collide (`kubernetes-1.31.2-amd64.raw` beside `kubernetes-v1.31.2-x86-64.raw`);
    // the one spelled exactly as asked settles it.
    let exact = matches
        .iter()
        .copied()
        .find(|e| e.file == wanted.to_string());
    match (matches.as_slice(), exact) {
        ([one], _) => Ok(*one),
        ([_, _, ..], Some(one)) => Ok(one),
        ([], _) => {
            let images = |keep: &dyn Fn(&str) -> bool| -> Vec<String> {
                entries
                    .iter()
                    .filter(|e| keep(&e.file))
                    .map(|e| e.file.clone())
                    .collect()
            };
            let mut candidates = images(&|file: &str| wanted.is_same_extension(file));
            if candidates.is_empty() {
                candidates = images(&|file: &str| file.ends_with(".raw"));
            }
            Err(ImportError::NoMatch {
                wanted: wanted.clone(),
                candidates,
            })
        }
        (several, None) => Err(ImportError::SeveralMatches {
            wanted: wanted.clone(),
            matches: several.iter().map(|e| e.file.clone()).collect(),
        }),
    }
}

/// Checks the URL of a SHA256SUMS file: http(s), no credentials, a file at the end of
/// the path (the images are next to it).
pub fn parse_sums_url(text: &str) -> Result<Url, ImportError> {
    let invalid = |message: String| ImportError::InvalidArgument {
        flag: "URL",
        value: text.to_owned(),
        message,
    };
    let url = Url::parse(text).map_err(|e| invalid(format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "https" | "http") {
        return Err(invalid(format!(
            "scheme {}:// is not supported; use https",
            url.scheme()
        )));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(
            "credentials in URLs are not allowed (they would end up in the release)".into(),
        ));
    }
    if url.path().ends_with('/') {
        return Err(invalid(
            "must name the SHA256SUMS file itself, not its directory".into(),
        ));
    }
    Ok(url)
}

/// What the command line may set besides the image itself.
#[derive(Debug, Clone, Default)]
pub struct ReleaseOptions {
    /// `metadata.name`; default `<name>-<version>` in lowercase.
    pub release_name: Option<String>,
    /// When set, the artifact's `signatureUrl` is its URL with this appended (`.minisig`:
    /// the minisign signature published next to the image).
    pub signature_suffix: Option<String>,
}

/// Checks a `--signature-suffix` (before any request): it may only hold characters that
/// need no escaping and no `/`, so the signature sits next to the image.
pub fn check_signature_suffix(suffix: &str) -> Result<(), ImportError> {
    let invalid = |message: &str| ImportError::InvalidArgument {
        flag: "--signature-suffix",
        value: suffix.to_owned(),
        message: message.to_owned(),
    };
    if suffix.is_empty() {
        return Err(invalid("must not be empty (for example .minisig)"));
    }
    if !suffix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    {
        return Err(invalid(
            "may hold only letters, digits, '.', '-' and '_' (the signature is next to the image)",
        ));
    }
    Ok(())
}

/// The signature's URL: the image's URL with `suffix` appended.
fn signature_url(url: &Url, suffix: &str) -> Result<String, ImportError> {
    check_signature_suffix(suffix)?;
    // The image URL is a file joined to the SHA256SUMS file's directory: no query or
    // fragment, so appending extends its file name.
    Ok(format!("{url}{suffix}"))
}

/// Builds the release for `entry`, found in the SHA256SUMS at `sums_url`: the image next
/// to the SHA256SUMS file ([`release_for`]).
pub fn build_release(
    sums_url: &Url,
    entry: &ChecksumEntry,
    wanted: &Wanted,
    options: &ReleaseOptions,
) -> Result<NodeRelease, ImportError> {
    // The file name holds only characters that need no escaping (see `Wanted::new`), so
    // joining it cannot leave the SHA256SUMS file's directory.
    let url = sums_url
        .join(&entry.file)
        .map_err(|e| ImportError::MalformedLine {
            line: entry.line,
            message: format!("{} cannot be joined to {sums_url}: {e}", entry.file),
        })?;
    let signature_url = options
        .signature_suffix
        .as_deref()
        .map(|suffix| signature_url(&url, suffix))
        .transpose()?;
    let image = Image {
        url: url.to_string(),
        sha256: entry.sha256.clone(),
        size: None,
        signature_url,
        architecture: None,
        other_architectures: Vec::new(),
    };
    release_for(image, &wanted.name, &wanted.version, options)
}

/// Parses, selects and builds in one go.
pub fn release_from_sha256sums(
    sums_url: &Url,
    text: &str,
    wanted: &Wanted,
    options: &ReleaseOptions,
) -> Result<NodeRelease, ImportError> {
    let entries = parse_sha256sums(text)?;
    let entry = select(&entries, wanted)?;
    build_release(sums_url, entry, wanted, options)
}

#[cfg(test)]
mod tests;
