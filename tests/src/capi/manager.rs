//! Cluster API's core controller manager (`sigs.k8s.io/cluster-api/core` of the release
//! `tests/capi/go.mod` pins, built by `tests/capi/build-manager.sh`) run against a bed's
//! kube-apiserver the way CAPI's release manifests install it, minus the Deployment: all of
//! its CRDs from the module with the conversion webhook its kustomize patches add, its
//! mutating and validating webhook configurations from the module, both pointed at the
//! manager's webhook server on loopback with a serving certificate from the bed's CA, and the
//! feature gates of the in-place flow (`InPlaceUpdates`, `RuntimeSDK`). What is CAPI's and
//! what is the bed's: tests/capi/README-manager.md.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use serde::Deserialize;
use serde_yaml::Value;

use crate::apiserver::ApiServer;

/// The feature gates the in-place flow needs (both alpha, off by default in v1.14).
pub const FEATURE_GATES: &str = "InPlaceUpdates=true,RuntimeSDK=true";

/// How long a cold manager on a loaded machine may take to answer `/readyz`.
const STARTUP_LIMIT: Duration = Duration::from_secs(180);

/// The manager's log, in its directory.
const LOG: &str = "capi-manager.log";

/// How long it may take to stop after SIGTERM (it drains its controllers' workers).
const STOP_LIMIT: Duration = Duration::from_secs(60);

/// The manager binary, built once per test process (a check of file times when `make test`
/// built it before the suites).
pub fn binary() -> anyhow::Result<PathBuf> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build() -> anyhow::Result<PathBuf> {
    let out = crate::apiserver::target_dir().join("capi/bin");
    let script = crate::apiserver::repo_root().join("tests/capi/build-manager.sh");
    let output = Command::new(&script)
        .arg(&out)
        .output()
        .context("running tests/capi/build-manager.sh (is Go installed?)")?;
    if !output.status.success() {
        bail!(
            "tests/capi/build-manager.sh failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(out.join("capi-manager"))
}

/// A running manager; [`CapiManager::stop`] stops it cleanly, dropping it kills it.
pub struct CapiManager {
    child: Child,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    webhook_configurations: PathBuf,
}

impl CapiManager {
    /// Installs Cluster API's CRDs and webhooks into `server` and starts the manager as its
    /// admin; returns once `/readyz` answers and the webhooks are registered.
    pub async fn start(server: &ApiServer) -> anyhow::Result<CapiManager> {
        Self::start_with(server, &[]).await
    }

    /// [`Self::start`] with the Services the manager reaches by name: each
    /// `NAME.NAMESPACE.svc` resolves to the loopback address the bed serves it on (an
    /// `/etc/hosts` of the manager's own mount namespace; the bed has no cluster DNS).
    pub async fn start_with(
        server: &ApiServer,
        services: &[(&str, std::net::Ipv4Addr)],
    ) -> anyhow::Result<CapiManager> {
        let binary = tokio::task::spawn_blocking(binary).await??;
        let dir = tempfile::Builder::new()
            .prefix("inplace-capi-manager-")
            .tempdir()
            .context("creating the manager's directory")?;
        let webhook_port = crate::ports::free_port()?;
        let health_port = crate::ports::free_port()?;
        let diagnostics_port = crate::ports::free_port()?;
        let certs = dir.path().join("certs");
        server.issue_serving_cert(&certs, &["127.0.0.1", "localhost"])?;
        let webhook = Webhook {
            url: format!("https://127.0.0.1:{webhook_port}"),
            ca_bundle: base64::engine::general_purpose::STANDARD.encode(server.ca_pem()?),
        };
        let crds = dir.path().join("crds");
        write_crds(&webhook, &crds)?;
        server.apply_crd_dir(&crds).await?;

        let log = std::fs::File::create(dir.path().join(LOG))?;
        let kubeconfig = server.admin_kubeconfig();
        // setpriv's parent-death signal: the manager dies with the thread that started it
        // however the test ends (no orphan holding ports). unshare and sh exec, so the
        // child's PID is the manager's.
        let hosts = dir.path().join("hosts");
        let mut text = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        for (name, address) in services {
            text.push_str(&format!("{address} {name}\n"));
        }
        std::fs::write(&hosts, text)?;
        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private", "--"])
            .args(["setpriv", "--pdeathsig", "KILL", "--"])
            .args(["sh", "-c", "mount --bind \"$0\" /etc/hosts && exec \"$@\""])
            .arg(&hosts)
            .arg(&binary)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg(format!("--feature-gates={FEATURE_GATES}"))
            .arg(format!("--webhook-port={webhook_port}"))
            .arg("--webhook-cert-dir")
            .arg(&certs)
            .arg(format!("--health-addr=127.0.0.1:{health_port}"))
            .arg(format!(
                "--diagnostics-address=127.0.0.1:{diagnostics_port}"
            ))
            .arg("--insecure-diagnostics")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut manager = CapiManager {
            child,
            webhook_configurations: dir.path().join("webhook-configurations.yaml"),
            dir,
            kubeconfig,
        };
        manager.wait_ready(health_port).await?;
        // Registered only once the server answers: every webhook fails closed.
        write_webhook_configurations(&webhook, &manager.webhook_configurations)?;
        crate::apiserver::run_kubectl(
            &manager.kubeconfig,
            &[
                "apply",
                "--server-side",
                "-f",
                path_str(&manager.webhook_configurations)?,
            ],
        )?;
        Ok(manager)
    }

    async fn wait_ready(&mut self, health_port: u16) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "capi-manager exited ({status}) before it was ready:\n{}",
                    self.log_tail()
                );
            }
            if http_status(health_port, "/readyz") == Some(200) {
                return Ok(());
            }
            if started.elapsed() > STARTUP_LIMIT {
                bail!(
                    "capi-manager was not ready after {STARTUP_LIMIT:?}:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The manager's log so far (klog text).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Where the manager writes its log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG)
    }

    /// The last lines of the log, for a failure message.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Unregisters the webhooks (so the API server keeps serving CAPI's kinds without it),
    /// then stops the manager with SIGTERM as the kubelet would; its exit status.
    pub async fn stop(mut self) -> anyhow::Result<ExitStatus> {
        crate::apiserver::run_kubectl(
            &self.kubeconfig,
            &[
                "delete",
                "--wait=true",
                "-f",
                path_str(&self.webhook_configurations)?,
            ],
        )?;
        let pid = i32::try_from(self.child.id()).context("pid")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if started.elapsed() > STOP_LIMIT {
                bail!(
                    "capi-manager still running {STOP_LIMIT:?} after SIGTERM:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for CapiManager {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Where the API server reaches the manager's webhook server, and the CA it trusts for it.
struct Webhook {
    url: String,
    ca_bundle: String,
}

impl Webhook {
    /// A `clientConfig` of CAPI's manifests (`service: {name, namespace, path}`, resolved by
    /// kustomize in a release) pointed at this server.
    fn point(&self, client_config: &mut Value) -> anyhow::Result<()> {
        let path = client_config["service"]["path"]
            .as_str()
            .context("a clientConfig without service.path")?
            .to_owned();
        let mut point = serde_yaml::Mapping::new();
        point.insert("url".into(), format!("{}{path}", self.url).into());
        point.insert("caBundle".into(), self.ca_bundle.clone().into());
        *client_config = Value::Mapping(point);
        Ok(())
    }
}

/// Every CRD of the module's `core/config/crd/bases`, each with the conversion webhook that
/// `core/config/crd/patches/webhook_in_*.yaml` gives it, written into `out`.
fn write_crds(webhook: &Webhook, out: &Path) -> anyhow::Result<()> {
    let config = super::module_files(&["core/config/crd"])?.remove(0);
    let mut conversions = std::collections::BTreeMap::new();
    for patch in yaml_files(&config.join("patches"))? {
        let mut patch: Value = serde_yaml::from_str(&std::fs::read_to_string(&patch)?)?;
        let name = patch["metadata"]["name"]
            .as_str()
            .context("patch without a name")?
            .to_owned();
        let conversion = &mut patch["spec"]["conversion"];
        webhook.point(&mut conversion["webhook"]["clientConfig"])?;
        conversions.insert(name, conversion.clone());
    }
    std::fs::create_dir_all(out)?;
    for base in yaml_files(&config.join("bases"))? {
        let mut crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&base)?)?;
        let name = crd["metadata"]["name"]
            .as_str()
            .context("CRD without a name")?
            .to_owned();
        if let Some(conversion) = conversions.remove(&name) {
            crd["spec"]["conversion"] = conversion;
        }
        let file = out.join(base.file_name().context("CRD file name")?);
        std::fs::write(&file, serde_yaml::to_string(&crd)?)?;
    }
    if !conversions.is_empty() {
        bail!(
            "conversion patches for CRDs not in bases: {:?}",
            conversions.keys()
        );
    }
    Ok(())
}

/// The module's `core/config/webhook/manifests.yaml` (one mutating and one validating
/// configuration), named as CAPI's release names them and pointed at this server.
fn write_webhook_configurations(webhook: &Webhook, out: &Path) -> anyhow::Result<()> {
    let manifests = super::module_files(&["core/config/webhook/manifests.yaml"])?.remove(0);
    let text = std::fs::read_to_string(&manifests)?;
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let mut object = Value::deserialize(document)?;
        if object.is_null() {
            continue;
        }
        let name = object["metadata"]["name"]
            .as_str()
            .context("unnamed configuration")?;
        object["metadata"]["name"] = format!("capi-{name}").into();
        for hook in object["webhooks"]
            .as_sequence_mut()
            .context("a configuration without webhooks")?
        {
            webhook.point(&mut hook["clientConfig"])?;
        }
        documents.push(serde_yaml::to_string(&object)?);
    }
    std::fs::write(out, documents.join("---\n"))?;
    Ok(())
}

fn yaml_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

/// The HTTP status of `GET path` on 127.0.0.1:`port`, `None` while nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
