//! Cluster API at the version `tests/capi/go.mod` pins (downloaded and checked against
//! `tests/capi/go.sum` by the go command), never written by hand: its own CRDs for the
//! management cluster of the suites, and `hookcheck`, the Go harness that calls the extension
//! with Cluster API's own types the way Cluster API's runtime client does.

pub mod bed;
pub mod deployment;
pub mod extension;
pub mod machines;
pub mod manager;
pub mod provider;
pub mod walkthrough;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};

/// The Cluster and Machine CRDs (`cluster.x-k8s.io`, v1beta1 and v1beta2) of the pinned
/// Cluster API release.
pub fn crd_files() -> anyhow::Result<Vec<PathBuf>> {
    module_files(&[
        "core/config/crd/bases/cluster.x-k8s.io_clusters.yaml",
        "core/config/crd/bases/cluster.x-k8s.io_machines.yaml",
    ])
}

/// The CRDs of the other objects Cluster API's in-place hooks involve: MachineSet,
/// ExtensionConfig, KubeadmConfig, KubeadmConfigTemplate and KubeadmControlPlane (installed only where a suite
/// stores such objects: each CRD adds to a bed's start).
pub fn hook_object_crd_files() -> anyhow::Result<Vec<PathBuf>> {
    module_files(&[
        "core/config/crd/bases/cluster.x-k8s.io_machinesets.yaml",
        "core/config/crd/bases/runtime.cluster.x-k8s.io_extensionconfigs.yaml",
        "bootstrap/kubeadm/config/crd/bases/bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml",
        "bootstrap/kubeadm/config/crd/bases/bootstrap.cluster.x-k8s.io_kubeadmconfigtemplates.yaml",
        "controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml",
    ])
}

/// `paths` inside the pinned module.
fn module_files(paths: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let module = DIR
        .get_or_init(|| module_dir().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)?;
    Ok(paths.iter().map(|path| module.join(path)).collect())
}

/// Where the go command keeps the pinned `sigs.k8s.io/cluster-api` module.
fn module_dir() -> anyhow::Result<PathBuf> {
    let here = crate::apiserver::repo_root().join("tests").join("capi");
    let output = Command::new("go")
        .args(["mod", "download", "-json", "sigs.k8s.io/cluster-api"])
        .current_dir(&here)
        .output()
        .context("running go mod download in tests/capi (is Go installed?)")?;
    if !output.status.success() {
        bail!(
            "go mod download sigs.k8s.io/cluster-api failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
            String::from_utf8_lossy(&output.stdout).trim()
        );
    }
    let info: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("reading go mod download -json")?;
    info["Dir"]
        .as_str()
        .map(PathBuf::from)
        .context("go mod download named no module directory")
}

/// The `hookcheck` harness (`tests/capi/hookcheck`), built once per test process into
/// `capi/bin` under the cargo target directory; Go's build cache makes a rebuild with nothing changed take seconds.
pub fn hookcheck() -> anyhow::Result<PathBuf> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| build_hookcheck().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build_hookcheck() -> anyhow::Result<PathBuf> {
    let root = crate::apiserver::repo_root();
    let binary = crate::apiserver::target_dir().join("capi/bin/hookcheck");
    // tests/go-build.sh: the flags every Go build of the tests shares, and so its cache.
    let output = Command::new(root.join("tests/go-build.sh"))
        .arg("-o")
        .arg(&binary)
        .arg("./hookcheck")
        .current_dir(root.join("tests").join("capi"))
        // go.mod and go.sum are the pins: a build never rewrites them (and stamps no VCS
        // state, which a fresh clone's ownership may refuse).
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .output()
        .context("running go build in tests/capi (is Go installed?)")?;
    if !output.status.success() {
        bail!(
            "go build ./hookcheck failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(binary)
}

#[cfg(test)]
mod tests {
    /// `tests/go-build.sh -o FILE` writes a program into a directory nobody made yet, as `go
    /// build -o` does: a cold `make test` ran the `hookcheck` harness's test before Cluster
    /// API's manager had made `<target>/capi/bin`, and the copy out of the linked programs'
    /// cache failed there (session 47's cold run).
    #[test]
    fn a_go_program_is_built_into_a_directory_not_made_yet() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("witness");
        std::fs::create_dir(&module).unwrap();
        std::fs::write(module.join("go.mod"), "module witness\n\ngo 1.22\n").unwrap();
        std::fs::write(module.join("main.go"), "package main\n\nfunc main() {}\n").unwrap();
        let program = dir.path().join("not/made/yet/witness");
        let output =
            std::process::Command::new(crate::apiserver::repo_root().join("tests/go-build.sh"))
                .arg("-o")
                .arg(&program)
                .arg(".")
                .current_dir(&module)
                .env("GO_BIN_CACHE", dir.path().join("cache"))
                .output()
                .unwrap();
        assert!(output.status.success(), "{output:?}");
        assert!(program.is_file());
    }
}
