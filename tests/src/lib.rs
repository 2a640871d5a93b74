//! Test beds for inplace: the real Kubernetes API server ([`apiserver`]), the API emulator, real systemd hosts booted with
//! `systemd-nspawn`, and a controllable artifact server. The end-to-end suites live in
//! `tests/tests/`.
//!
//! - [`nspawn`]: a cached Debian bookworm root filesystem and [`nspawn::Node`], a booted
//!   systemd 252 container with a real D-Bus and real `systemd-sysext`.
//! - [`agent_images`]: the agent built at other versions, as signed sysext images (good and
//!   broken), for the agent-update suites and the demo.
//! - [`sysext`]: real squashfs system-extension images built with `mksquashfs`.
//! - [`artifact_server`]: an HTTP/1.1 server on loopback that can misbehave on request.
//! - [`metrics_guide`]: checks that the metrics reference lists every metric family.
//! - [`docs`]: the commands a docs/usage page documents, for tests that run them as written.
//! - [`ignition`]: applies an Ignition config's files, links and units to a node, as
//!   Ignition does before a Flatcar node's first boot.
//! - [`kube_node`]: real Kubernetes nodes (real kubelets, containerd, Pods) and whole clusters
//!   on them.
//! - [`install`]: inplace installed into a test cluster and onto a node as its docs say.
//! - [`registry`]: a real OCI registry on loopback, and files pushed to it with `crane`.
//! - [`slow_link`]: a throttled, cuttable TCP link to a server that cannot be slowed itself.
//! - [`sim_agent`]: simulated agents that follow the agent's status protocol on plans, on
//!   timers ([`sim_agent::Fleet`]) or a phase per call ([`sim_agent::Stepper`]).
//! - [`prereq`]: checks that the host has what the real test beds need, with install hints.

pub mod agent_images;
pub mod apiserver;
pub mod artifact_server;
pub mod capi;
pub mod docs;
pub mod error;
pub mod fake_kubelet;
pub mod fixtures;
pub mod ignition;
pub mod install;
pub mod kube_node;
pub mod metrics_guide;
pub mod module_maps;
pub mod nspawn;
pub mod plans;
pub mod ports;
pub mod prereq;
pub mod registry;
pub mod sim_agent;
pub mod slow_link;
pub mod sysext;
pub mod test_api;
pub mod tools;
pub mod workspace_build;

pub use error::{Error, Result};
