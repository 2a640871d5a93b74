//! The test beds' own suites: the real control plane, real-kubelet nodes, the packaging and
//! install paths, Cluster API's controllers, the agent switch.
//!
//! One test binary for the package's suites (each file here is a module of it): every
//! integration-test binary links the whole dependency graph, so one per package is built
//! and linked once (docs/development/testing.md § Where the time goes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

mod support;

mod agent_self_update;
mod agent_switch_crash;
mod api_conformance;
mod artifact_server;
mod capi_machines;
mod capi_manager;
mod controller_image;
mod fake_kubelet;
mod kube_drain;
mod kube_nodes;
mod kube_reboots;
mod kube_rollouts;
mod node_install_flatcar;
mod node_install_image_builder;
mod node_steering;
mod nspawn_node;
mod packaging_arm64;
mod packaging_deb;
mod packaging_sysext;
mod real_apiserver;
mod self_update_guard;
mod sysext_images;
