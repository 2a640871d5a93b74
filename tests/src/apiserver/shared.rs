//! The control plane the tests of one nextest run share, one test at a time: the first test
//! that asks starts it (`kube-testbed serve --resettable`, which ends with the run), and each
//! test, when its turn comes, has it reset to what it held when it became ready
//! (`tests/kube/reset.go`: every object created since is deleted, through etcd). A test's own
//! server costs a start of kube-apiserver, about 3.4 CPU-seconds; a turn, a reset.
//!
//! Its state is in `<target>/kube-shared/<NEXTEST_RUN_ID>/`; `<run>.start` (a [`FileLock`])
//! lets one test start it while the others wait, and `turn` (one held for a test's life) gives
//! it to one test at a time.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use super::{ApiServer, Owner, binary, started_url, target_dir};
use crate::nspawn::host::FileLock;

/// How long a reset may take on a loaded machine (it deletes a few hundred keys).
const RESET_LIMIT: Duration = Duration::from_secs(60);

impl ApiServer {
    /// This test's turn on the server its nextest run shares, reset to what it held when it
    /// became ready; outside nextest (`cargo test` runs a binary's tests as threads of one
    /// process), a server of the test's own. For tests whose objects are all their own: not
    /// for those that stop or restart the server, start it with flags of their own, or write
    /// into the control plane's namespaces (`kube-system`...), which a reset leaves.
    pub async fn start_shared() -> anyhow::Result<ApiServer> {
        let Ok(run) = std::env::var("NEXTEST_RUN_ID") else {
            return Self::start().await;
        };
        let server = take_turn(&run).await?;
        let client = server.client().await?;
        let crds = served_crds(&client).await?;
        let dir = server.dir.clone();
        tokio::task::spawn_blocking(move || reset(&dir)).await??;
        wait_until_unserved(&client, &crds).await?;
        Ok(server)
    }
}

async fn take_turn(run: &str) -> anyhow::Result<ApiServer> {
    let base = target_dir().join("kube-shared");
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let dir = base.join(run);
    let starting = FileLock::acquire(base.join(format!("{run}.start"))).await?;
    let url = {
        let (base, dir, run) = (base.clone(), dir.clone(), run.to_owned());
        tokio::task::spawn_blocking(move || match running_url(&dir) {
            Some(url) => Ok(url),
            None => {
                remove_finished_runs(&base, &run);
                start_detached(&dir)
            }
        })
        .await??
    };
    drop(starting);
    let turn = FileLock::acquire(dir.join("turn")).await?;
    Ok(ApiServer {
        dir,
        _tempdir: None,
        owner: Owner::Run { _turn: turn },
        url,
    })
}

/// What the CRDs of the server serve, each at its first served version: all made since it
/// became ready (it had none then), so the reset deletes every one.
async fn served_crds(client: &kube::Client) -> anyhow::Result<Vec<ApiResource>> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing the shared server's CRDs")?;
    Ok(crds
        .items
        .iter()
        .filter_map(|crd| {
            let version = crd.spec.versions.iter().find(|v| v.served)?;
            let gvk = GroupVersionKind::gvk(&crd.spec.group, &version.name, &crd.spec.names.kind);
            Some(ApiResource::from_gvk_with_plural(
                &gvk,
                &crd.spec.names.plural,
            ))
        })
        .collect())
}

/// Waits until kube-apiserver serves none of `resources`: it stops serving a CRD deleted in
/// etcd when its informer sees the deletion, a moment after the reset.
async fn wait_until_unserved(
    client: &kube::Client,
    resources: &[ApiResource],
) -> anyhow::Result<()> {
    let started = Instant::now();
    for resource in resources {
        let api = Api::<DynamicObject>::all_with(client.clone(), resource);
        loop {
            match api.list(&ListParams::default().limit(1)).await {
                Err(kube::Error::Api(status)) if status.code == 404 => break,
                _ if started.elapsed() > RESET_LIMIT => bail!(
                    "the shared server still serves {} {RESET_LIMIT:?} after a reset deleted its CRD",
                    resource.plural
                ),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
    Ok(())
}

/// The URL of the server in `dir`, if it is ready and its kube-apiserver runs.
fn running_url(dir: &Path) -> Option<String> {
    let pid = std::fs::read_to_string(dir.join("kube-apiserver.pid")).ok()?;
    let alive = Path::new("/proc").join(pid.trim()).exists();
    (alive && dir.join("ready").exists())
        .then(|| std::fs::read_to_string(dir.join("server-url")).ok())
        .flatten()
}

/// Removes what the servers of finished runs left (their etcd data: tens of megabytes each).
fn remove_finished_runs(base: &Path, run: &str) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let path: PathBuf = entry.path();
        if path.is_dir() && entry.file_name() != run && running_url(&path).is_none() {
            let _ = std::fs::remove_dir_all(&path);
            let _ = std::fs::remove_file(path.with_extension("start"));
        }
    }
}

/// Starts `serve --resettable` in `dir`, in a process group of its own (the server outlives
/// this test) that ends when this test's parent, the nextest run, does; its URL once ready.
fn start_detached(dir: &Path) -> anyhow::Result<String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let log = File::create(dir.join("serve.log"))?;
    let mut child = Command::new(binary()?)
        .args(["serve", "--resettable", "--dir"])
        .arg(dir)
        .arg("--exit-with-pid")
        .arg(std::os::unix::process::parent_id().to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting the run's shared kube-testbed serve")?;
    let started = Instant::now();
    loop {
        if let Some(url) = started_url(dir, &mut child, started)? {
            return Ok(url);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Asks the server in `dir` to delete every object created since it became ready.
fn reset(dir: &Path) -> anyhow::Result<()> {
    let socket = dir.join("reset.sock");
    let mut stream = UnixStream::connect(&socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    stream.set_read_timeout(Some(RESET_LIMIT))?;
    stream.write_all(b"reset\n")?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .context("reading the shared server's answer to a reset")?;
    if !answer.starts_with("ok") {
        bail!("resetting the run's shared API server: {}", answer.trim());
    }
    Ok(())
}
