//! The NodeRelease wing: the controller that validates releases and reports their revision,
//! and the `release from-sha256sums` command that builds one from a published `SHA256SUMS`.

pub mod controller;
pub mod fetch;
pub mod import;
