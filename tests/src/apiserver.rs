//! The real Kubernetes control plane for tests and the demo: etcd, kube-apiserver and
//! kube-controller-manager of the release pinned in `tests/kube/go.mod`, built from the
//! official Go modules by `tests/kube/build.sh` (cached), started by `kube-testbed serve`.
//!
//! The server runs with `--authorization-mode=Node,RBAC`, `NodeRestriction` and
//! ValidatingAdmissionPolicy, anonymous access off. Identities are x509 client certificates
//! signed by the server's CA: the admin (`system:masters`) and, per node, `system:node:NAME`
//! in `system:nodes`, as a kubelet's are. One [`ApiServer`] per test process, its own or its
//! turn on the one its nextest run shares (`shared.rs`); startup on a loaded 2-core machine
//! can take half a minute, so nothing here asserts a duration.

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::wait::{await_condition, conditions::is_crd_established};

mod shared;

/// How long a (cold, loaded) server may take to answer `/readyz`.
const STARTUP_LIMIT: Duration = Duration::from_secs(300);

/// How long a (loaded) server may take to serve a CRD it has just created.
const CRD_ESTABLISHED_LIMIT: Duration = Duration::from_secs(120);

/// The repository root (this crate is `tests/`).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Where `tests/kube/build.sh` puts `kube-testbed` and the release's `kubectl`:
/// `$INPLACE_KUBE_BIN_DIR`, else `target/kube/bin` under the cargo target directory.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("INPLACE_KUBE_BIN_DIR") {
        return PathBuf::from(dir);
    }
    target_dir().join("kube").join("bin")
}

/// The cargo target directory: `$CARGO_TARGET_DIR`, else `target` at the repository root.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// The `kube-testbed` binary, built first if it is missing or older than its sources
/// (`make test` builds it before the suites, so this is a check of file times).
pub fn binary() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| ensure_built().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// kubectl of the pinned release (built beside `kube-testbed`).
pub fn kubectl() -> anyhow::Result<PathBuf> {
    Ok(binary()?.with_file_name("kubectl"))
}

fn ensure_built() -> anyhow::Result<PathBuf> {
    let source = repo_root().join("tests").join("kube");
    let binary = bin_dir().join("kube-testbed");
    if is_newer_than_sources(&binary, &source)? {
        return Ok(binary);
    }
    eprintln!(
        "building kube-apiserver, etcd and kubectl from the pinned Go modules (tests/kube; minutes the first time)"
    );
    let output = Command::new(source.join("build.sh"))
        .arg(bin_dir())
        .output()
        .context("running tests/kube/build.sh (is Go installed?)")?;
    if !output.status.success() {
        bail!(
            "tests/kube/build.sh failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(binary)
}

pub(crate) fn is_newer_than_sources(binary: &Path, source: &Path) -> anyhow::Result<bool> {
    let Ok(built) = binary.metadata().and_then(|m| m.modified()) else {
        return Ok(false);
    };
    let mut newest = SystemTime::UNIX_EPOCH;
    for entry in
        std::fs::read_dir(source).with_context(|| format!("reading {}", source.display()))?
    {
        let path = entry?.path();
        let relevant = path
            .extension()
            .is_some_and(|e| e == "go" || e == "mod" || e == "sum" || e == "sh");
        if relevant {
            newest = newest.max(path.metadata()?.modified()?);
        }
    }
    Ok(built >= newest)
}

/// Runs kubectl of the pinned release with `kubeconfig` and `args`; its standard output, or
/// an error with its standard error.
pub fn run_kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(kubectl()?)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .context("running kubectl")?;
    if !output.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A running control plane: a test's own, which dropping it stops, or its turn on the one its
/// nextest run shares ([`ApiServer::start_shared`]).
pub struct ApiServer {
    dir: PathBuf,
    _tempdir: Option<tempfile::TempDir>,
    owner: Owner,
    url: String,
}

enum Owner {
    /// Started for this test: its processes end with it.
    Test {
        child: Child,
        // Held open: `serve --exit-on-stdin-eof` stops when this test process ends, however
        // it ends.
        _stdin: ChildStdin,
    },
    /// The run's shared server; the lock on its turn file is this test's turn, released when
    /// this test process ends, however it ends.
    Run {
        _turn: crate::nspawn::host::FileLock,
    },
}

impl ApiServer {
    /// Starts a server in a new temporary directory.
    pub async fn start() -> anyhow::Result<ApiServer> {
        Self::start_with(&[]).await
    }

    /// Starts a server in a new temporary directory with extra kube-apiserver flags (e.g.
    /// `--etcd-compaction-interval=1s`).
    pub async fn start_with(apiserver_args: &[&str]) -> anyhow::Result<ApiServer> {
        let args = apiserver_args
            .iter()
            .map(|arg| format!("--apiserver-arg={arg}"));
        Self::start_in_tempdir(args.collect()).await
    }

    /// Starts a server in a new temporary directory whose kube-apiserver tries `port` first
    /// and, if something holds it, another free port.
    pub async fn start_trying_port_first(port: u16) -> anyhow::Result<ApiServer> {
        Self::start_in_tempdir(vec![format!("--first-apiserver-port={port}")]).await
    }

    async fn start_in_tempdir(serve_args: Vec<String>) -> anyhow::Result<ApiServer> {
        let tempdir = tempfile::Builder::new()
            .prefix("inplace-kube-")
            .tempdir()
            .context("creating the server's directory")?;
        let mut server = Self::spawn(tempdir.path(), serve_args).await?;
        server._tempdir = Some(tempdir);
        Ok(server)
    }

    /// Starts a server for real kubelets, keeping its state in `dir`: with kube-scheduler
    /// and the controllers of Deployments, ReplicaSets, DaemonSets and node lifecycle
    /// (`serve --workloads`).
    pub async fn start_for_kubelets(dir: &Path) -> anyhow::Result<ApiServer> {
        Self::spawn(dir, vec!["--workloads".into()]).await
    }

    /// The cluster CA's certificate (PEM), which kubelets trust for client certificates.
    pub fn ca_pem(&self) -> anyhow::Result<Vec<u8>> {
        let path = self.dir.join("pki").join("ca.crt");
        std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Starts a server keeping its state (CA, etcd data, logs, kubeconfigs) in `dir`, and
    /// writes `dir/NAME.kubeconfig` for each of `nodes`.
    pub async fn start_in(dir: &Path, nodes: &[String]) -> anyhow::Result<ApiServer> {
        let args = nodes
            .iter()
            .flat_map(|node| ["--node".to_string(), node.clone()]);
        Self::spawn(dir, args.collect()).await
    }

    /// Runs `kube-testbed serve --dir DIR SERVE_ARGS` and waits until it says it is ready.
    async fn spawn(dir: &Path, serve_args: Vec<String>) -> anyhow::Result<ApiServer> {
        let binary = tokio::task::spawn_blocking(binary).await??;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let _ = std::fs::remove_file(dir.join("ready"));
        let log = std::fs::File::create(dir.join("serve.log"))?;
        let mut command = Command::new(&binary);
        command
            .args(["serve", "--exit-on-stdin-eof", "--dir"])
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log);
        command.args(serve_args);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdin = child.stdin.take().context("no stdin pipe")?;
        let started = Instant::now();
        let url = loop {
            if let Some(url) = started_url(dir, &mut child, started)? {
                break url;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        Ok(ApiServer {
            dir: dir.to_path_buf(),
            _tempdir: None,
            owner: Owner::Test {
                child,
                _stdin: stdin,
            },
            url,
        })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's state directory (logs: `kube-apiserver.log`, `etcd.log`, ...).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin's kubeconfig (`system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// Writes a kubeconfig for `user` in `groups` (a new client certificate) to `out`.
    pub fn write_kubeconfig(&self, out: &Path, user: &str, groups: &[&str]) -> anyhow::Result<()> {
        let mut command = Command::new(binary()?);
        command
            .args(["kubeconfig", "--dir"])
            .arg(&self.dir)
            .args(["--user", user]);
        for group in groups {
            command.args(["--group", group]);
        }
        let output = command.arg("--out").arg(out).output()?;
        if !output.status.success() {
            bail!(
                "writing a kubeconfig for {user}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// The kubeconfig of `node`'s kubelet identity (`system:node:NODE` in `system:nodes`),
    /// written once into the server's directory.
    pub fn node_kubeconfig(&self, node: &str) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(format!("{node}.kubeconfig"));
        if !path.exists() {
            self.write_kubeconfig(&path, &format!("system:node:{node}"), &["system:nodes"])?;
        }
        Ok(path)
    }

    /// A kube client configuration from a kubeconfig file of this server.
    pub async fn config_from(&self, kubeconfig: &Path) -> anyhow::Result<kube::Config> {
        let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
        Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?)
    }

    /// A kube client acting as the admin.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(
            self.config_from(&self.admin_kubeconfig()).await?,
        )?)
    }

    /// A kube client acting as `node`'s kubelet identity.
    pub async fn client_as_node(&self, node: &str) -> anyhow::Result<kube::Client> {
        let kubeconfig = self.node_kubeconfig(node)?;
        Ok(kube::Client::try_from(
            self.config_from(&kubeconfig).await?,
        )?)
    }

    /// kubectl of the server's release, as the admin.
    pub fn kubectl(&self) -> anyhow::Result<Command> {
        let mut command = Command::new(kubectl()?);
        command.arg("--kubeconfig").arg(self.admin_kubeconfig());
        Ok(command)
    }

    /// Runs kubectl as the admin with `args`; its standard output, or an error with its
    /// standard error.
    pub fn run_kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        run_kubectl(&self.admin_kubeconfig(), args)
    }

    /// A serving certificate signed by the server's CA for `names` (DNS names or IP
    /// addresses): `tls.crt`, `tls.key` and `ca.crt` in `out`, the files cert-manager puts in a
    /// TLS Secret and controller-runtime reads from its certificate directory.
    pub fn issue_serving_cert(&self, out: &Path, names: &[&str]) -> anyhow::Result<()> {
        std::fs::create_dir_all(out)?;
        let pki = self.dir.join("pki");
        let alt_names: Vec<String> = names
            .iter()
            .map(|name| match name.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{name}"),
                Err(_) => format!("DNS:{name}"),
            })
            .collect();
        let extensions = out.join("extensions.cnf");
        std::fs::write(
            &extensions,
            format!(
                "subjectAltName={}\nextendedKeyUsage=serverAuth\n",
                alt_names.join(",")
            ),
        )?;
        let file = |name: &str| out.join(name).display().to_string();
        let (key, csr, cert) = (file("tls.key"), file("tls.csr"), file("tls.crt"));
        let subject = format!("/CN={}", names.first().copied().unwrap_or("localhost"));
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &subject,
            "-keyout",
            &key,
            "-out",
            &csr,
        ])?;
        let (ca_cert, ca_key) = (pki.join("ca.crt"), pki.join("ca.key"));
        openssl(&[
            "x509",
            "-req",
            "-days",
            "7",
            "-set_serial",
            &format!("{}", std::process::id()),
            "-in",
            &csr,
            "-CA",
            &ca_cert.display().to_string(),
            "-CAkey",
            &ca_key.display().to_string(),
            "-extfile",
            &extensions.display().to_string(),
            "-out",
            &cert,
        ])?;
        std::fs::copy(&ca_cert, out.join("ca.crt"))?;
        Ok(())
    }

    /// Applies the CRDs in `dir` (or in one YAML file; server-side, forced) and waits until
    /// each is Established (served). Through the kube client, not kubectl: every test that
    /// starts a server applies them, and `kubectl apply` then `kubectl wait` cost 0.45
    /// CPU-seconds in kubectl besides the server's answers to its discovery (the shipped
    /// manifests are applied with the real kubectl by `real_apiserver`'s test and the docs'
    /// pages).
    pub async fn apply_crd_dir(&self, dir: &Path) -> anyhow::Result<()> {
        let client = self.client().await?;
        let names = inplace_api_emulator::apply_crd_files(&client, dir, "inplace-tests").await?;
        let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client);
        for name in names {
            let established = await_condition(crds.clone(), &name, is_crd_established());
            tokio::time::timeout(CRD_ESTABLISHED_LIMIT, established)
                .await
                .with_context(|| {
                    format!("CRD {name} not Established within {CRD_ESTABLISHED_LIMIT:?}")
                })?
                .with_context(|| format!("waiting for CRD {name} to be Established"))?;
        }
        Ok(())
    }

    /// The processes of the control plane, by name: `etcd` (embedded in the `kube-testbed
    /// serve` process), `kube-apiserver`, `kube-controller-manager`.
    pub fn processes(&self) -> anyhow::Result<Vec<(&'static str, u32)>> {
        let Owner::Test { child, .. } = &self.owner else {
            bail!("the processes of the run's shared server are not this test's");
        };
        let mut processes = vec![("etcd", child.id())];
        for name in ["kube-apiserver", "kube-controller-manager"] {
            let pid = std::fs::read_to_string(self.dir.join(format!("{name}.pid")))?;
            processes.push((
                name,
                pid.trim().parse().with_context(|| format!("{name}.pid"))?,
            ));
        }
        Ok(processes)
    }

    /// Kills kube-apiserver (SIGKILL, as a crash) and keeps it down until [`Self::resume`];
    /// etcd keeps the data.
    pub fn kill_apiserver(&self) -> anyhow::Result<()> {
        if let Owner::Run { .. } = self.owner {
            bail!("the run's shared server is not this test's to kill: start a server of its own");
        }
        std::fs::File::create(self.dir.join("apiserver.hold"))?;
        let pid = std::fs::read_to_string(self.dir.join("kube-apiserver.pid"))?;
        let pid: i32 = pid.trim().parse().context("kube-apiserver.pid")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        Ok(())
    }

    /// Lets the supervisor start kube-apiserver again (on the same port).
    pub fn resume(&self) -> anyhow::Result<()> {
        std::fs::remove_file(self.dir.join("apiserver.hold"))?;
        Ok(())
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // The children die with it (parent-death signal); etcd runs inside it.
        if let Owner::Test { child, .. } = &mut self.owner {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn openssl(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl (is it installed?)")?;
    if !output.status.success() {
        bail!(
            "openssl {}: {}",
            args.first().unwrap_or(&""),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// The URL of the `serve` in `dir` (`child`, started at `started`) once it says it is ready;
/// None while it starts; an error once it has exited or [`STARTUP_LIMIT`] has passed.
fn started_url(dir: &Path, child: &mut Child, started: Instant) -> anyhow::Result<Option<String>> {
    if dir.join("ready").exists() {
        return Ok(Some(std::fs::read_to_string(dir.join("server-url"))?));
    }
    if let Some(status) = child.try_wait()? {
        bail!(
            "kube-testbed serve exited ({status}) before the API server was ready:\n{}",
            log_tails(dir)
        );
    }
    if started.elapsed() > STARTUP_LIMIT {
        let _ = child.kill();
        bail!(
            "the API server was not ready after {STARTUP_LIMIT:?}:\n{}",
            log_tails(dir)
        );
    }
    Ok(None)
}

/// The last lines of each component's log, for a failure message.
fn log_tails(dir: &Path) -> String {
    let mut text = String::new();
    for name in [
        "serve.log",
        "kube-apiserver.log",
        "etcd.log",
        "kube-controller-manager.log",
    ] {
        if let Ok(log) = std::fs::read_to_string(dir.join(name)) {
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            let _ = writeln!(text, "--- {name} (last lines)\n{tail}");
        }
    }
    text
}
