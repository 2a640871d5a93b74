//! The extension installed into a bed's management cluster the way
//! `packaging/kubernetes/capi/` installs it, with the bed standing in for what a cluster
//! provides: cert-manager (a serving certificate from the bed's CA in the Secret
//! `inplace-capi-tls`, with `ca.crt` as cert-manager writes it), the Deployment's Pod (the
//! workspace's `inplace-controller capi` run on the host with the ServiceAccount's identity
//! and the Deployment's arguments), and the Service's address (a loopback address that
//! Cluster API's manager resolves `inplace-capi.inplace-system.svc` to, see
//! [`super::manager::CapiManager::start_with`]). The Namespace, RBAC, Service and
//! ExtensionConfig are the packaged files, unchanged: Cluster API injects the CA bundle from
//! the Secret, discovers the handlers and calls them over TLS.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::apiserver::{ApiServer, repo_root};

/// The host name Cluster API builds from the ExtensionConfig's `service` reference.
pub const SERVICE_HOST: &str = "inplace-capi.inplace-system.svc";
/// The Service's port (the ExtensionConfig's `service.port`).
const SERVICE_PORT: u16 = 443;
/// The ServiceAccount the packaged RBAC grants the extension's rights to.
const USER: &str = "system:serviceaccount:inplace-system:inplace-capi";
const STARTUP_LIMIT: Duration = Duration::from_secs(120);

/// A loopback address for the Service, different per process (parallel suites each bind
/// port 443 on their own).
pub fn service_address() -> Ipv4Addr {
    let pid = std::process::id();
    Ipv4Addr::new(
        127,
        36,
        ((pid >> 8) & 0xff) as u8,
        (pid & 0xff).max(1) as u8,
    )
}

/// The extension's log, in its directory.
const LOG: &str = "capi.log";

/// The running extension; dropping it stops it.
pub struct CapiExtension {
    _child: tokio::process::Child,
    dir: tempfile::TempDir,
}

impl CapiExtension {
    /// Installs inplace's CRDs and the extension's packaged objects into `server` and starts
    /// the extension on `address`:443; returns once it accepts connections, after the
    /// ExtensionConfig is applied (Cluster API's manager should be running: its webhooks
    /// default and validate the ExtensionConfig).
    pub async fn start(server: &ApiServer, address: Ipv4Addr) -> anyhow::Result<CapiExtension> {
        let admin = server.admin_kubeconfig();
        crate::install::install_manifests(&admin)?;
        let capi = repo_root().join("packaging/kubernetes/capi");
        let file = |name: &str| capi.join(name).display().to_string();
        server.run_kubectl(&[
            "apply",
            "-f",
            &file("namespace.yaml"),
            "-f",
            &file("rbac.yaml"),
            "-f",
            &file("service.yaml"),
        ])?;
        let dir = tempfile::Builder::new()
            .prefix("inplace-capi-extension-")
            .tempdir()?;
        let tls = dir.path().join("tls");
        server.issue_serving_cert(
            &tls,
            &[SERVICE_HOST, &format!("{SERVICE_HOST}.cluster.local")],
        )?;
        let tls_file = |name: &str| format!("--from-file={name}={}", tls.join(name).display());
        server.run_kubectl(&[
            "-n",
            "inplace-system",
            "create",
            "secret",
            "generic",
            "inplace-capi-tls",
            "--type=kubernetes.io/tls",
            &tls_file("tls.crt"),
            &tls_file("tls.key"),
            &tls_file("ca.crt"),
        ])?;
        let kubeconfig = dir.path().join("inplace-capi.kubeconfig");
        server.write_kubeconfig(
            &kubeconfig,
            USER,
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:inplace-system",
            ],
        )?;
        let child = spawn(&tls, &kubeconfig, address, &dir.path().join(LOG)).await?;
        let extension = CapiExtension { _child: child, dir };
        extension.wait_listening(address).await?;
        server.run_kubectl(&["apply", "-f", &file("extensionconfig.yaml")])?;
        Ok(extension)
    }

    async fn wait_listening(&self, address: Ipv4Addr) -> anyhow::Result<()> {
        let started = Instant::now();
        while tokio::net::TcpStream::connect((address, SERVICE_PORT))
            .await
            .is_err()
        {
            if started.elapsed() > STARTUP_LIMIT {
                bail!(
                    "the extension did not listen on {address}:{SERVICE_PORT} within {STARTUP_LIMIT:?}:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// The extension's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Where the extension writes its log.
    pub fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join(LOG)
    }
}

/// `inplace-controller capi` with the Deployment's arguments, listening on the Service's
/// address instead of the Pod's.
async fn spawn(
    tls: &std::path::Path,
    kubeconfig: &std::path::Path,
    address: Ipv4Addr,
    log_path: &std::path::Path,
) -> anyhow::Result<tokio::process::Child> {
    let binary: PathBuf =
        tokio::task::spawn_blocking(|| crate::workspace_build::workspace_bin("inplace-controller"))
            .await??;
    let log = std::fs::File::create(log_path)?;
    tokio::process::Command::new(&binary)
        .arg("capi")
        .arg(format!("--cert={}", tls.join("tls.crt").display()))
        .arg(format!("--key={}", tls.join("tls.key").display()))
        .arg(format!("--listen={address}:{SERVICE_PORT}"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))
}
