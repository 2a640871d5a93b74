//! How many activation slots a rollout has, rounded the way Kubernetes rounds
//! `maxUnavailable` for Deployments: a percentage of the selected nodes, rounded down,
//! but never fewer than one (a rollout that can never activate a node is useless).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Parses `"10%"` into 10. Accepts 1% to 100%.
pub fn parse_percent(text: &str) -> Option<u32> {
    let number = text.strip_suffix('%')?;
    if number.is_empty() || number.len() > 3 || !number.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let value: u32 = number.parse().ok()?;
    (1..=100).contains(&value).then_some(value)
}

/// The number of nodes that may stage at once out of `total` selected nodes
/// (`spec.staging.maxConcurrent`), rounded as activation slots are.
pub fn staging_slots(max_concurrent: &IntOrString, total: usize) -> usize {
    activation_slots(max_concurrent, total)
}

/// The number of nodes that may activate at once out of `total` selected nodes.
/// Invalid values (already refused by validation) count as one slot.
pub fn activation_slots(max_unavailable: &IntOrString, total: usize) -> usize {
    let slots = match max_unavailable {
        IntOrString::Int(n) => usize::try_from(*n).unwrap_or(1),
        IntOrString::String(text) => match parse_percent(text) {
            Some(percent) => total * percent as usize / 100,
            None => text.parse::<usize>().unwrap_or(1),
        },
    };
    slots.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_down_with_a_floor_of_one() {
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(activation_slots(&pct("10%"), 30_000), 3_000);
        assert_eq!(activation_slots(&pct("10%"), 15), 1);
        assert_eq!(activation_slots(&pct("10%"), 5), 1);
        assert_eq!(activation_slots(&pct("25%"), 10), 2);
        assert_eq!(activation_slots(&pct("100%"), 7), 7);
        assert_eq!(activation_slots(&IntOrString::Int(3), 2), 3);
        assert_eq!(activation_slots(&IntOrString::Int(0), 2), 1);
    }

    #[test]
    fn percent_parsing() {
        assert_eq!(parse_percent("1%"), Some(1));
        assert_eq!(parse_percent("100%"), Some(100));
        for bad in ["0%", "101%", "%", "10", "1.5%", "-5%", "1000%"] {
            assert_eq!(parse_percent(bad), None, "{bad}");
        }
    }
}
