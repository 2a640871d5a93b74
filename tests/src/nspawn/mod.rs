//! Real systemd hosts: Debian booted with `systemd-nspawn` — bookworm with systemd 252 as
//! PID 1 by default, trixie with systemd 257 where a test asks ([`Suite`]) — a real D-Bus
//! system bus and real `systemd-sysext` merging real squashfs images.
//!
//! ```no_run
//! # async fn demo() -> inplace_tests::Result<()> {
//! use inplace_tests::nspawn::{Node, NodeOptions};
//! let node = Node::boot(&Node::unique_name("smoke"), NodeOptions::default()).await?;
//! let out = node.exec_ok(&["systemctl", "is-system-running"]).await?;
//! node.write_file("/etc/inplace/agent.toml", b"# policy\n", 0o644).await?;
//! node.poweroff().await?;
//! # Ok(()) }
//! ```
//!
//! Host layout: the cached root filesystem in `/var/cache/inplace-testbed/rootfs-<hash>`
//! (see [`rootfs`]), each node's writable overlay, console log and owner record in
//! `/var/tmp/inplace-testbed/nodes/<name>/`, and its cgroup in
//! `/sys/fs/cgroup/systemd/inplace-testbed/<name>`. A node is torn down by
//! [`Node::poweroff`], or by `Drop` when a test panics; nodes of crashed test processes are
//! swept by the next [`Node::boot`] (or `inplace-testbed sweep`).

pub(crate) mod host;
mod node;
mod power_cut;
pub mod rootfs;

pub use node::{ExecOutput, Node, NodeFile, NodeOptions, ServiceInstall, sweep_stale_nodes};
pub use rootfs::{RootfsRecipe, Suite, ensure_rootfs, ensure_suite};

/// Where per-node directories live.
pub const NODES_DIR: &str = "/var/tmp/inplace-testbed/nodes";
