//! The API types' integration suites: validation, revisions, generated files, architectures.
//!
//! One test binary for the package's suites (each file here is a module of it): every
//! integration-test binary links the whole dependency graph, so one per package is built
//! and linked once (docs/development/testing.md § Where the time goes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

mod architectures;
mod generated_files;
mod plan_validation;
mod revision_and_robustness;
mod revision_golden;
