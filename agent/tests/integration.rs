//! The agent's integration suites: its HTTP API, the fetcher, the update flow on fakes, and
//! the suites on real systemd-nspawn nodes.
//!
//! One test binary for the package's suites (each file here is a module of it): every
//! integration-test binary links the whole dependency graph, so one per package is built
//! and linked once (docs/development/testing.md § Where the time goes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

mod common;
mod crash_bed;
mod real_node;

mod agent_switch;
mod api;
mod cli;
mod config;
mod containment;
mod crash_matrix;
mod e2e_nspawn;
mod fetch;
mod fetch_mirrors;
mod fetch_oci;
mod fetch_tls;
mod flow;
mod metrics;
mod reboot;
mod signatures;
