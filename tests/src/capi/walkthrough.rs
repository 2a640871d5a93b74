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
/// and `KUBECONFIG` set to `kubeconfig` (the management cluster's); its standard output.
/// Blocking: call it from `spawn_blocking` in async code.
pub fn run(kubeconfig: &Path, heading: &str) -> anyhow::Result<String> {
    let kubectl = kubectl()?;
    run_with_tools(
        kubectl.parent().unwrap_or(&repo_root()),
        kubeconfig,
        heading,
    )
}

/// [`run`] with the commands in `tools` first on `PATH`.
fn run_with_tools(tools: &Path, kubeconfig: &Path, heading: &str) -> anyhow::Result<String> {
    let root = repo_root();
    let block = shell_block(&root.join(PAGE), heading)?;
    let mut path = OsString::from(tools);
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    Ok(run_as_a_person(
        &block,
        &root,
        &[("KUBECONFIG", kubeconfig.as_os_str()), ("PATH", &path)],
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `kubectl` that replays what Cluster API showed one CI run, one state per `-o
    /// jsonpath` read: first the MachineDeployment's new generation observed while its
    /// Machines still count as up to date on the old kubelet, then a rollout going on, then
    /// (from the fourth read) done on v1.36.3. `sleep` returns at once.
    const REPLAY: &str = r#"#!/bin/bash
here=$(dirname "$0")
case "$*" in
  *"-o jsonpath="*)
    n=$(( $(cat "$here/reads" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$here/reads"
    case "$*" in
      "get machinedeployment workers "*)
        case $n in 1) echo "2 2 3 3 3 False" ;; 2|3) echo "2 2 3 1 3 True" ;; *) echo "2 2 3 3 3 False" ;; esac ;;
      "get machines "*)
        if [ "$n" -ge 4 ]; then printf 'v1.36.3\nv1.36.3\nv1.36.3\n'; else printf 'v1.36.1\nv1.36.3\nv1.36.1\n'; fi ;;
    esac ;;
  *) echo "kubectl $*" ;;
esac
"#;

    #[test]
    fn the_documented_wait_outlasts_a_status_that_says_done_before_the_rollout_began() {
        use std::os::unix::fs::PermissionsExt;
        let tools = tempfile::tempdir().unwrap();
        for (name, script) in [("kubectl", REPLAY), ("sleep", "#!/bin/sh\n")] {
            let file = tools.path().join(name);
            std::fs::write(&file, script).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let shown = run_with_tools(tools.path(), &tools.path().join("kubeconfig"), BUMP)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let reads: u32 = std::fs::read_to_string(tools.path().join("reads"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(reads >= 4, "the wait ended after {reads} reads:\n{shown}");
        assert!(shown.contains("kubectl wait machines"), "{shown}");
    }
}
