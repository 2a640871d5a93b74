//! Kubernetes versions (`v1.31.2`, `v1.32.0-rc.1`) ordered by semver precedence, so that
//! the agent can tell a downgrade from an upgrade.

use std::cmp::Ordering;

/// A parsed `v<major>.<minor>.<patch>[-<pre-release>][+<build>]`. Build metadata is
/// ignored, as semver says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesVersion {
    /// Major, minor and patch as digit strings without leading zeros (no overflow, however
    /// long).
    core: [String; 3],
    /// The pre-release identifiers; empty for a release.
    pre: Vec<String>,
}

/// Longest version accepted (the API field's limit).
const MAX_LEN: usize = 64;

impl KubernetesVersion {
    /// Parses `text`; `None` when it is not a Kubernetes version.
    pub fn parse(text: &str) -> Option<KubernetesVersion> {
        if text.len() > MAX_LEN {
            return None;
        }
        let rest = text.strip_prefix('v')?;
        let core_end = rest.find(['-', '+']).unwrap_or(rest.len());
        let mut parts = rest[..core_end].split('.');
        let mut core: [String; 3] = Default::default();
        for slot in &mut core {
            let part = parts.next().filter(|p| is_digits(p))?;
            *slot = without_leading_zeros(part).to_owned();
        }
        if parts.next().is_some() {
            return None;
        }
        let pre = match rest[core_end..].strip_prefix('-') {
            Some(tail) => {
                let pre = tail.split('+').next().unwrap_or_default();
                pre.split('.').map(str::to_owned).collect()
            }
            None => Vec::new(),
        };
        Some(KubernetesVersion { core, pre })
    }

    /// Semver precedence: `v1.9.0 < v1.10.0`, `v1.31.0-rc.1 < v1.31.0`, build ignored.
    pub fn precedence(&self, other: &KubernetesVersion) -> Ordering {
        for (a, b) in self.core.iter().zip(&other.core) {
            match compare_numbers(a, b) {
                Ordering::Equal => {}
                unequal => return unequal,
            }
        }
        match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Greater,
            (false, true) => return Ordering::Less,
            (false, false) => {}
        }
        for (a, b) in self.pre.iter().zip(&other.pre) {
            let order = match (is_digits(a), is_digits(b)) {
                (true, true) => compare_numbers(without_leading_zeros(a), without_leading_zeros(b)),
                // Numeric identifiers have lower precedence than alphanumeric ones.
                (true, false) => Ordering::Less,
                (false, true) => Ordering::Greater,
                (false, false) => a.cmp(b),
            };
            if order != Ordering::Equal {
                return order;
            }
        }
        self.pre.len().cmp(&other.pre.len())
    }
}

/// The order of two builds' versions by semver precedence (`0.2.0`, `0.2.0-rc.1`, with or
/// without a leading `v`, as agent builds are versioned); `None` when either is not semver.
pub fn compare_builds(a: &str, b: &str) -> Option<Ordering> {
    let parse = |text: &str| {
        let text = text.strip_prefix('v').unwrap_or(text);
        KubernetesVersion::parse(&format!("v{text}"))
    };
    Some(parse(a)?.precedence(&parse(b)?))
}

/// Whether going from `current` to `target` lowers the version. Versions that do not parse
/// cannot be ordered, so they never count as a downgrade (the API validation refuses them).
pub fn is_downgrade(current: &str, target: &str) -> bool {
    match (
        KubernetesVersion::parse(current),
        KubernetesVersion::parse(target),
    ) {
        (Some(current), Some(target)) => target.precedence(&current) == Ordering::Less,
        _ => false,
    }
}

/// Whether `target` leaves `current`'s major version or lands more than one minor version
/// above it: Kubernetes moves a node one minor version at a time (kubelet skew policy, and
/// kubeadm upgrades minor by minor). Versions that do not parse never count.
pub fn skips_a_minor(current: &str, target: &str) -> bool {
    match (
        KubernetesVersion::parse(current),
        KubernetesVersion::parse(target),
    ) {
        (Some(current), Some(target)) => {
            let minor = |v: &KubernetesVersion| v.core[1].parse::<u128>().unwrap_or(u128::MAX);
            current.core[0] != target.core[0] || minor(&target) > minor(&current).saturating_add(1)
        }
        _ => false,
    }
}

/// Whether `version` lands on a later minor version than `bound` (or a later major): the
/// kubelet skew rule, which says a kubelet must not be newer than kube-apiserver, counts in
/// minor versions (kubeadm's preflight check compares them so), so a kubelet a patch ahead
/// of its API server is allowed. Versions that do not parse never count.
pub fn is_newer_minor(version: &str, bound: &str) -> bool {
    match (
        KubernetesVersion::parse(version),
        KubernetesVersion::parse(bound),
    ) {
        (Some(version), Some(bound)) => {
            compare_numbers(&version.core[0], &bound.core[0])
                .then_with(|| compare_numbers(&version.core[1], &bound.core[1]))
                == Ordering::Greater
        }
        _ => false,
    }
}

fn is_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

fn without_leading_zeros(digits: &str) -> &str {
    let trimmed = digits.trim_start_matches('0');
    if trimmed.is_empty() { "0" } else { trimmed }
}

/// Compares two digit strings without leading zeros by value.
fn compare_numbers(a: &str, b: &str) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(a: &str, b: &str) -> Ordering {
        let parse = |t| KubernetesVersion::parse(t).unwrap_or_else(|| panic!("{t} parses"));
        parse(a).precedence(&parse(b))
    }

    #[test]
    fn semver_precedence() {
        let ascending = [
            "v1.9.0",
            "v1.10.0-alpha",
            "v1.10.0-alpha.1",
            "v1.10.0-alpha.beta",
            "v1.10.0-beta",
            "v1.10.0-beta.2",
            "v1.10.0-beta.11",
            "v1.10.0-rc.1",
            "v1.10.0",
            "v1.10.1",
            "v2.0.0",
            "v10.0.0",
        ];
        for pair in ascending.windows(2) {
            assert_eq!(order(pair[0], pair[1]), Ordering::Less, "{pair:?}");
            assert_eq!(order(pair[1], pair[0]), Ordering::Greater, "{pair:?}");
        }
        assert_eq!(order("v1.31.2+build.1", "v1.31.2"), Ordering::Equal);
        assert_eq!(order("v01.031.2", "v1.31.2"), Ordering::Equal);
        let huge = format!("v1.{}.0", "9".repeat(40));
        assert_eq!(order(&huge, "v1.31.0"), Ordering::Greater);
    }

    #[test]
    fn minor_skips() {
        assert!(skips_a_minor("v1.31.2", "v1.33.0"));
        assert!(skips_a_minor("v1.31.2", "v2.0.0"));
        assert!(!skips_a_minor("v1.31.2", "v1.32.0"));
        assert!(!skips_a_minor("v1.31.2", "v1.31.3"));
        assert!(
            !skips_a_minor("v1.31.2", "v1.30.0"),
            "a downgrade, not a skip"
        );
        assert!(!skips_a_minor("v1.31.2", "1.33.0"));
    }

    #[test]
    fn newer_minors() {
        assert!(is_newer_minor("v1.37.0", "v1.36.3"));
        assert!(is_newer_minor("v2.0.0", "v1.36.3"));
        assert!(is_newer_minor("v1.10.0", "v1.9.9"));
        assert!(
            !is_newer_minor("v1.36.4", "v1.36.3"),
            "a patch ahead is allowed"
        );
        assert!(!is_newer_minor("v1.35.9", "v1.36.0"));
        assert!(
            !is_newer_minor("v1.34.2", "v1.34.0-inplace-emulator"),
            "a server's pre-release or build suffix does not matter"
        );
        assert!(!is_newer_minor("v1.35.0", "v1.35.1+k3s1"));
        assert!(
            !is_newer_minor("v1.37.0", "1.36.3"),
            "unparsable: not ordered"
        );
    }

    #[test]
    fn downgrades() {
        assert!(is_downgrade("v1.31.2", "v1.30.9"));
        assert!(is_downgrade("v1.31.0", "v1.31.0-rc.1"));
        assert!(!is_downgrade("v1.31.2", "v1.31.2"));
        assert!(!is_downgrade("v1.31.2", "v1.31.3"));
        assert!(
            !is_downgrade("v1.31.2", "1.30.0"),
            "unparsable: not ordered"
        );
    }

    #[test]
    fn builds_are_ordered_with_or_without_a_v() {
        assert_eq!(compare_builds("0.2.0", "0.10.0"), Some(Ordering::Less));
        assert_eq!(
            compare_builds("0.2.0-next.2", "0.2.0"),
            Some(Ordering::Less)
        );
        assert_eq!(compare_builds("v0.2.0", "0.2.0"), Some(Ordering::Equal));
        assert_eq!(compare_builds("0.3.0", "0.2.9"), Some(Ordering::Greater));
        assert_eq!(compare_builds("0.2", "0.2.0"), None);
        assert_eq!(compare_builds("0.2.0", "vv0.2.0"), None);
    }

    #[test]
    fn refuses_what_is_not_a_version() {
        for text in [
            "", "v", "1.2.3", "v1.2", "v1.2.3.4", "v1..3", "va.b.c", "v1.2.3x",
        ] {
            assert_eq!(KubernetesVersion::parse(text), None, "{text}");
        }
        assert!(KubernetesVersion::parse(&format!("v1.2.3-{}", "a".repeat(64))).is_none());
    }
}
