//! Prints the `[policy]` keys with their built-in defaults as the Markdown table kept in
//! docs/usage/security-model.md. `make docs` runs it.

fn main() -> Result<(), inplace_agent::settings::SettingsError> {
    print!("{}", inplace_agent::policy_table::markdown_table()?);
    Ok(())
}
