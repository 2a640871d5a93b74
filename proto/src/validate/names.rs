//! Names and paths: an artifact's name, an archive member's, a target path on the node, a
//! unit's name and an object's, each checked on its own and explained in words.

/// Longest path accepted anywhere (Linux `PATH_MAX`).
const MAX_PATH_LEN: usize = 4096;
/// Longest unit name systemd accepts.
const MAX_UNIT_LEN: usize = 255;

/// An artifact name must be usable as a plain file name and as a sysext name.
pub fn check_artifact_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > 63 {
        return Err(format!("{} characters is longer than 63", name.len()));
    }
    if name == "." || name == ".." || name.contains('/') {
        return Err(format!("{name:?} is not a plain file name"));
    }
    let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if !name.chars().all(valid_char) || !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "{name:?} may hold only letters, digits, '.', '_' and '-', starting with a letter or digit"
        ));
    }
    Ok(())
}

/// A target path on the node: absolute, normalized, no `..`, not the root.
pub fn check_node_path(path: &str) -> Result<(), String> {
    if path.len() > MAX_PATH_LEN {
        return Err(format!(
            "{} characters is longer than {MAX_PATH_LEN}",
            path.len()
        ));
    }
    if !path.starts_with('/') {
        return Err(format!("{path:?} is not an absolute path"));
    }
    if path.ends_with('/') {
        return Err(format!("{path:?} names a directory, not a file"));
    }
    if path.contains('\0') {
        return Err("contains a NUL byte".into());
    }
    if path
        .split('/')
        .skip(1)
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!(
            "{path:?} is not a normalized path (empty, . or .. components)"
        ));
    }
    Ok(())
}

/// An archive member name: relative, normalized, no `..`.
pub(super) fn check_member_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_PATH_LEN {
        return Err(format!(
            "{} characters is longer than {MAX_PATH_LEN}",
            name.len()
        ));
    }
    if name.starts_with('/') {
        return Err(format!("{name:?} must be relative to the archive root"));
    }
    let name = name.strip_prefix("./").unwrap_or(name);
    if name
        .split('/')
        .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return Err(format!("{name:?} is not a normalized member path"));
    }
    Ok(())
}

/// A unit name the agent may act on: `<name>.service`, systemd's unit-name characters, no `/`.
pub fn check_unit_name(unit: &str) -> Result<(), String> {
    if unit.len() > MAX_UNIT_LEN {
        return Err(format!(
            "{} characters is longer than {MAX_UNIT_LEN}",
            unit.len()
        ));
    }
    if unit.contains('/') {
        return Err(format!("{unit:?} is a path, not a unit name"));
    }
    let Some(stem) = unit.strip_suffix(".service") else {
        return Err(format!("{unit:?} is not a .service unit"));
    };
    let valid_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '.' | '-' | '@' | '\\');
    if stem.is_empty() || !stem.chars().all(valid_char) {
        return Err(format!("{unit:?} is not a valid unit name"));
    }
    Ok(())
}

/// A Kubernetes object name (DNS subdomain: RFC 1123, at most 253 characters).
pub fn check_object_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err(format!("{name:?} must have 1 to 253 characters"));
    }
    let valid = name.split('.').all(|label| {
        !label.is_empty()
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid object name (RFC 1123 subdomain)"
        ))
    }
}
