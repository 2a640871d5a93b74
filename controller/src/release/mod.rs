//! The NodeRelease wing: the controller that validates releases and reports their revision,
//! and the `release from-sha256sums` and `release from-oci` commands that build one from a
//! published `SHA256SUMS` or a registry's manifest.

pub mod cli;
pub mod controller;
pub mod extension;
pub mod fetch;
pub mod import;
pub mod oci;
