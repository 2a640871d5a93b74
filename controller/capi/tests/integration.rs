//! The Cluster API extension's integration suites: its hooks against a real kube-apiserver,
//! and Cluster API's own types.
//!
//! One test binary for the package's suites (each file here is a module of it): every
//! integration-test binary links the whole dependency graph, so one per package is built
//! and linked once (docs/development/testing.md § Where the time goes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

mod common;

mod architecture;
mod capi_contract;
mod control_plane;
mod drain;
mod golden_types;
mod https_hooks;
mod manifests;
mod update_machine;
