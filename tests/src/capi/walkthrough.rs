//! docs/usage/cluster-api.md § With Cluster API's controllers, read from the page and run as
//! written against a bed's management API server: what a test proves and what the demo shows
//! are the commands a user types.

use std::ffi::OsString;
use std::path::Path;

use crate::apiserver::{kubectl, repo_root};
use crate::docs::{run_as_a_person, shell_block};

/// The page of the walk-through, from the checkout's root.
pub const PAGE: &str = "docs/usage/cluster-api.md";
/// The block that registers the extension (`kubectl apply` of the ExtensionConfig, wait for
/// discovery).
pub const REGISTER: &str = "### Register the extension with Cluster API";
/// The block that bumps the MachineDeployment `workers` to v1.36.3 and waits until its
/// rollout is done and every Machine is up to date.
pub const BUMP: &str = "### Bump the MachineDeployment's version and watch it roll out in place";

/// Runs the block after `heading` in the checkout's root with the pinned kubectl on `PATH`
/// and `KUBECONFIG` set to `kubeconfig` (the management cluster's); its standard output. Blocking: call it from
/// `spawn_blocking` in async code.
pub fn run(kubeconfig: &Path, heading: &str) -> anyhow::Result<String> {
    let root = repo_root();
    let block = shell_block(&root.join(PAGE), heading)?;
    let kubectl = kubectl()?;
    let mut path = OsString::from(kubectl.parent().unwrap_or(&root));
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    Ok(run_as_a_person(
        &block,
        &root,
        &[("KUBECONFIG", kubeconfig.as_os_str()), ("PATH", &path)],
    )?)
}
