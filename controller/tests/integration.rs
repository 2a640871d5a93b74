//! The controller's integration suites, most of them against a real kube-apiserver.
//!
//! One test binary for the package's suites (each file here is a module of it): every
//! integration-test binary links the whole dependency graph, so one per package is built
//! and linked once (docs/development/testing.md § Where the time goes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

mod support;

mod agent_rollout;
mod capi_cli;
mod drain_controls;
mod fleet_writes;
mod fleetlock;
mod foreign_disruption;
mod health_gates;
mod helm_chart;
mod kured_lock;
mod operations;
mod release_from_oci;
mod release_from_sha256sums;
mod rollout;
mod rollout_timing;
mod staging_waves;
mod steering;
mod teardown;
mod version_skew;
