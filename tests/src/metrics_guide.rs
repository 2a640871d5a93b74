//! Keeps the metrics reference (`docs/usage/observability.md`) in step with the code: the
//! families a Prometheus text exposition declares, and the table rows a guide lacks for
//! them. The agent's and the controller's tests both run it against their own metrics.

/// The families declared in an exposition text, as `(name, type)` from its `# TYPE` lines.
pub fn declared_families(text: &str) -> Vec<(&str, &str)> {
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .collect()
}

/// The table rows (`` | `name` | type | ``) a Markdown guide lacks for the families of an
/// exposition text.
pub fn undocumented_families(text: &str, guide: &str) -> Vec<String> {
    declared_families(text)
        .into_iter()
        .map(|(name, kind)| format!("| `{name}` | {kind} |"))
        .filter(|row| !guide.contains(row.as_str()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_families_are_read_back_and_missing_rows_named() {
        let text = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n\
                    # HELP b B.\n# TYPE b gauge\n";
        assert_eq!(
            declared_families(text),
            vec![("a_total", "counter"), ("b", "gauge")]
        );
        assert_eq!(
            undocumented_families(text, "| `a_total` | counter | x |\n| `b` | counter |"),
            vec!["| `b` | gauge |"]
        );
    }
}
