//! Applies the `storage` and `systemd` sections of an Ignition config (the JSON `butane`
//! writes) to a booted [`Node`], the way Ignition's files stage writes them into a Flatcar
//! root before its first boot: files (fetched, then checked against their
//! `verification.hash`), symbolic links, unit files and drop-ins under
//! `/etc/systemd/system`, and `enabled` units as a preset (applied to the unit files the
//! config writes, as a first boot applies it). Anything in the config this
//! applier does not know is an error, so a Butane file that grows a section nobody applies
//! fails its test instead of being skipped. Reboot the node afterwards: that boot is the
//! node's first with the config in place.

use std::collections::BTreeMap;
use std::io::Read;

use base64::Engine;
use serde::Deserialize;
use sha2::{Digest, Sha512};

use crate::nspawn::Node;
use crate::{Error, Result};

/// Where Ignition writes the `enabled`/`disabled` units (systemd applies presets).
pub const PRESET_FILE: &str = "/etc/systemd/system-preset/20-ignition.preset";

/// An Ignition config, as far as a node install uses it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `ignition.version`.
    pub ignition: Meta,
    /// Files and links.
    #[serde(default)]
    pub storage: Storage,
    /// Units.
    #[serde(default)]
    pub systemd: Systemd,
}

/// The `ignition` section.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// The spec version, e.g. `3.3.0`.
    pub version: String,
}

/// The `storage` section (files and links only).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storage {
    /// Regular files.
    #[serde(default)]
    pub files: Vec<File>,
    /// Symbolic (or hard) links.
    #[serde(default)]
    pub links: Vec<Link>,
}

/// One `storage.files` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// Absolute path on the node.
    pub path: String,
    /// Where the bytes come from.
    pub contents: Contents,
    /// Permission bits (decimal in JSON).
    pub mode: Option<u32>,
}

/// A file's `contents`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contents {
    /// A `data:` URL or an `http(s)://` URL.
    pub source: String,
    /// `gzip` or empty.
    pub compression: Option<String>,
    /// `verification.hash`, `sha512-<hex>` or `sha256-<hex>`.
    #[serde(default)]
    pub verification: BTreeMap<String, String>,
}

/// One `storage.links` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// The link's path.
    pub path: String,
    /// What it points at.
    pub target: String,
    /// A hard link (not supported here: node installs use symbolic ones).
    #[serde(default)]
    pub hard: bool,
}

/// The `systemd` section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Systemd {
    /// Units, their drop-ins and whether to enable them.
    #[serde(default)]
    pub units: Vec<Unit>,
}

/// One `systemd.units` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unit {
    /// The unit's name.
    pub name: String,
    /// `Some(true)`: enabled by preset; `Some(false)`: disabled.
    pub enabled: Option<bool>,
    /// The whole unit file, when given.
    pub contents: Option<String>,
    /// Drop-ins under `/etc/systemd/system/<name>.d/`.
    #[serde(default)]
    pub dropins: Vec<Dropin>,
}

/// One unit drop-in.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dropin {
    /// File name inside `<unit>.d/`.
    pub name: String,
    /// Its text.
    pub contents: String,
}

impl Config {
    /// Parses Ignition JSON; a section or field this applier does not know is an error.
    pub fn parse(json: &str) -> Result<Self> {
        serde_json::from_str(json).map_err(|e| Error::Invalid(format!("Ignition config: {e}")))
    }

    /// Writes everything onto `node`. `fetch` gets the bytes of an `http(s)` source (the
    /// test decides how to reach it); every fetched or embedded file is checked against its
    /// verification hash, as Ignition does, before it is written.
    pub async fn apply(&self, node: &Node, fetch: impl Fn(&str) -> Result<Vec<u8>>) -> Result<()> {
        for file in &self.storage.files {
            let bytes = file.contents.bytes(&file.path, &fetch)?;
            node.write_file(&file.path, &bytes, file.mode.unwrap_or(0o644))
                .await?;
        }
        for link in &self.storage.links {
            if link.hard {
                return Err(Error::Invalid(format!("{}: hard links", link.path)));
            }
            node.symlink(&link.target, &link.path).await?;
        }
        let mut presets = String::new();
        let mut written = vec![];
        for unit in &self.systemd.units {
            let dir = format!("/etc/systemd/system/{}", unit.name);
            if let Some(contents) = &unit.contents {
                node.write_file(&dir, contents.as_bytes(), 0o644).await?;
                if unit.enabled.is_some() {
                    written.push(unit.name.as_str());
                }
            }
            for dropin in &unit.dropins {
                let path = format!("{dir}.d/{}", dropin.name);
                node.write_file(&path, dropin.contents.as_bytes(), 0o644)
                    .await?;
            }
            match unit.enabled {
                Some(true) => presets.push_str(&format!("enable {}\n", unit.name)),
                Some(false) => presets.push_str(&format!("disable {}\n", unit.name)),
                None => {}
            }
        }
        if !presets.is_empty() {
            node.write_file(PRESET_FILE, presets.as_bytes(), 0o644)
                .await?;
        }
        // On a node's first boot systemd applies every preset to the unit files it finds; a
        // test node has booted before, so the units this config wrote get theirs here. A unit
        // from an extension not merged yet would not be found at that moment on Flatcar
        // either (the node install upholds the agent for that reason).
        if !written.is_empty() {
            let mut args = vec!["preset"];
            args.extend(written);
            node.systemctl(&args).await?;
        }
        Ok(())
    }

    /// The file entry for `path`, if the config writes one.
    pub fn file(&self, path: &str) -> Option<&File> {
        self.storage.files.iter().find(|f| f.path == path)
    }

    /// The unit entry named `name`, if any.
    pub fn unit(&self, name: &str) -> Option<&Unit> {
        self.systemd.units.iter().find(|u| u.name == name)
    }
}

impl Contents {
    /// The bytes of the file at `path`: a `data:` URL decoded, anything else fetched; then
    /// checked against the verification hash (of the source's bytes, as Ignition checks
    /// them) and gunzipped.
    pub fn bytes(&self, path: &str, fetch: impl Fn(&str) -> Result<Vec<u8>>) -> Result<Vec<u8>> {
        let raw = match self.source.strip_prefix("data:") {
            Some(data) => decode_data_url(data)?,
            None => fetch(&self.source)?,
        };
        self.verify(path, &raw)?;
        match self.compression.as_deref() {
            None | Some("") => Ok(raw),
            Some("gzip") => {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(raw.as_slice())
                    .read_to_end(&mut out)
                    .map_err(|e| Error::Invalid(format!("gzip contents: {e}")))?;
                Ok(out)
            }
            Some(other) => Err(Error::Invalid(format!("compression {other}"))),
        }
    }

    /// Checks `verification.hash` (when given) against the source bytes' digest.
    fn verify(&self, path: &str, bytes: &[u8]) -> Result<()> {
        let Some(hash) = self.verification.get("hash") else {
            return Ok(());
        };
        let want = hash
            .strip_prefix("sha512-")
            .ok_or_else(|| Error::Invalid(format!("{path}: hash {hash}: only sha512 here")))?;
        let got = hex::encode(Sha512::digest(bytes));
        if got != want {
            return Err(Error::Invalid(format!(
                "{path}: sha512 {got}, verification.hash wants {want}"
            )));
        }
        Ok(())
    }
}

/// The body of a `data:` URL (after `data:`): `[;base64],<payload>`, percent-encoded text
/// otherwise (RFC 2397).
fn decode_data_url(data: &str) -> Result<Vec<u8>> {
    let (header, payload) = data
        .split_once(',')
        .ok_or_else(|| Error::Invalid("data URL without a comma".into()))?;
    if header.ends_with(";base64") {
        return base64::engine::general_purpose::STANDARD
            .decode(payload)
            .map_err(|e| Error::Invalid(format!("data URL: {e}")));
    }
    let mut out = Vec::with_capacity(payload.len());
    let mut bytes = payload.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex: Vec<u8> = bytes.by_ref().take(2).collect();
        let decoded = std::str::from_utf8(&hex)
            .ok()
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .ok_or_else(|| Error::Invalid("data URL: bad percent escape".into()))?;
        out.push(decoded);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls_decode_percent_and_base64() {
        assert_eq!(decode_data_url(",a%20b%0A").unwrap(), b"a b\n");
        assert_eq!(decode_data_url(";base64,aGk=").unwrap(), b"hi");
        assert!(decode_data_url(",%zz").is_err());
    }

    #[test]
    fn unknown_sections_are_refused() {
        let err = Config::parse(r#"{"ignition":{"version":"3.3.0"},"passwd":{}}"#).unwrap_err();
        assert!(err.to_string().contains("passwd"), "{err}");
    }
}
