//! The `[policy]` table of docs/usage/security-model.md, rendered from the defaults this build
//! applies (a settings file with no `[policy]`), so the guide cannot state a default the code
//! does not have. `make docs` writes it between `<!-- policy-defaults:begin -->` and
//! `<!-- policy-defaults:end -->`; a test fails when the guide is stale.

use std::fmt::Display;
use std::path::Path;

use crate::settings::{Policy, SettingsError, from_toml};

/// The Markdown table: each `[policy]` key, its default, what it bounds.
pub fn markdown_table() -> Result<String, SettingsError> {
    let Policy {
        allowed_url_prefixes,
        allow_http,
        allowed_target_dirs,
        allowed_config_roots,
        allowed_units,
        max_artifact_size,
        reserved_disk_space,
        allow_remote_health_checks,
        require_signatures,
        trusted_keys_dir,
    } = from_toml("", || Some("node".into()))?.policy;
    let rows = [
        (
            "allowed_url_prefixes",
            list(&allowed_url_prefixes, "**no download at all**"),
            "where artifacts (and every redirect) may come from: same scheme, host and port, \
             then the prefix's path segments, percent-decoded and compared whole (a prefix must \
             end with `/`; an encoded `/`, `.` or `..` in a URL's segment admits it nowhere)",
        ),
        (
            "allow_http",
            code(allow_http),
            "plain-http downloads and redirects",
        ),
        (
            "allowed_target_dirs",
            list(
                &allowed_target_dirs
                    .iter()
                    .map(|d| path(d))
                    .collect::<Vec<_>>(),
                "none",
            ),
            "where Binary `path`s and Archive members may be linked (the directory or below)",
        ),
        (
            "allowed_config_roots",
            list(
                &allowed_config_roots
                    .iter()
                    .map(|d| path(d))
                    .collect::<Vec<_>>(),
                "none",
            ),
            "where Config artifacts' `path`s may be linked (below the directory); `/` and `/etc` are refused",
        ),
        (
            "allowed_units",
            list(&allowed_units, "none"),
            "which units a plan may restart or health-check",
        ),
        (
            "max_artifact_size",
            size(max_artifact_size),
            "the largest artifact, also the cap when a plan states no size, and the most an \
             archive's `maxExtractedSize` may say (without it an archive may expand to 256 MiB)",
        ),
        (
            "reserved_disk_space",
            size(reserved_disk_space),
            "free space on the state directory's file system that extracting an archive may not \
             eat into (kubelet and containerd usually share it)",
        ),
        (
            "allow_remote_health_checks",
            code(allow_remote_health_checks),
            "HTTP health checks to non-loopback hosts (no probing your network from nodes)",
        ),
        (
            "require_signatures",
            code(require_signatures),
            "artifacts must carry a signature by a key the node trusts (see [signing.md](signing.md))",
        ),
        (
            "trusted_keys_dir",
            code(path(&trusted_keys_dir)),
            "where the public keys the node trusts are kept",
        ),
    ];
    let mut table = String::from("| key | default | bounds |\n|---|---|---|\n");
    for (key, default, bounds) in rows {
        table.push_str(&format!("| `{key}` | {default} | {bounds} |\n"));
    }
    Ok(table)
}

fn code(value: impl Display) -> String {
    format!("`{value}`")
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

fn list(items: &[impl Display], empty: &str) -> String {
    if items.is_empty() {
        return format!("empty: {empty}");
    }
    items.iter().map(code).collect::<Vec<_>>().join(", ")
}

fn size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    match bytes {
        b if b % GIB == 0 => format!("{} GiB", b / GIB),
        b if b % MIB == 0 => format!("{} MiB", b / MIB),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_model_states_the_defaults_the_code_applies() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/usage/security-model.md");
        let text = std::fs::read_to_string(&path).unwrap();
        let begin = text
            .find("<!-- policy-defaults:begin -->\n")
            .expect("begin marker")
            + "<!-- policy-defaults:begin -->\n".len();
        let end = text
            .find("<!-- policy-defaults:end -->")
            .expect("end marker");
        assert!(
            text[begin..end] == markdown_table().unwrap(),
            "docs/usage/security-model.md's [policy] table is stale; run `make docs` and commit"
        );
    }

    #[test]
    fn the_table_shows_the_real_defaults() {
        let table = markdown_table().unwrap();
        assert!(
            table.contains("| `allowed_target_dirs` | `/opt/bin` |"),
            "{table}"
        );
        assert!(
            table.contains("| `allowed_units` | `kubelet.service`, `containerd.service` |"),
            "{table}"
        );
        assert!(table.contains("| `max_artifact_size` | 8 GiB |"), "{table}");
    }
}
