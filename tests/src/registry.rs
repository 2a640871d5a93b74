//! A real OCI registry on loopback: go-containerregistry's, as `crane registry serve` runs
//! it (built from the module pinned in `tests/tools`), and files pushed to it by the real
//! `crane` as OCI artifacts, the way `oras push` and sysext publishers store a file: an image
//! manifest with an empty config and the file as its one layer, uncompressed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::tools::{KillOnDrop, run_ok, tool};

/// How long a loaded machine may take to start a server.
const PATIENCE: Duration = Duration::from_secs(180);

/// The media type of a sysext image layer pushed here.
pub const SYSEXT_LAYER_TYPE: &str = "application/vnd.inplace.sysext.layer.v1.raw";

/// A loopback address nothing listens on yet.
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// The status line of `GET path` (None while nothing listens).
async fn http_status(addr: &SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.ok()?;
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .map(str::to_owned)
}

/// Waits until `GET path` on `addr` answers 200; `what` names the server in the panic.
pub async fn wait_http_ok(addr: &SocketAddr, path: &str, what: &str) {
    wait_http_status(addr, path, 200, what).await;
}

/// Waits until `GET path` on `addr` answers `code`; `what` names the server in the panic.
pub async fn wait_http_status(addr: &SocketAddr, path: &str, code: u16, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    let wanted = format!(" {code} ");
    loop {
        let status = http_status(addr, path).await;
        if status.as_deref().is_some_and(|s| s.contains(&wanted)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never answered {code} on {path}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A registry on loopback, stopped when dropped.
pub struct Registry {
    _server: KillOnDrop,
    /// The token service of a registry in token mode, which fronts it.
    _token_service: Option<KillOnDrop>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// For a registry that wants credentials: the directory of the Docker `config.json`
    /// that `crane auth login` wrote for it (`DOCKER_CONFIG`), which pushes use.
    pub docker_config: Option<PathBuf>,
    _dir: Option<tempfile::TempDir>,
}

/// The Distribution registry's configuration: files under `dir`, then its `auth` section.
const DISTRIBUTION_CONFIG: &str = "version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: DIR/data
http:
  addr: ADDR
auth:
";

/// htpasswd authentication: the registry asks for HTTP Basic itself.
const HTPASSWD_AUTH: &str = "  htpasswd:
    realm: inplace-test
    path: DIR/htpasswd
";

/// Token authentication: the registry answers `Bearer realm=…` and trusts the JWTs the
/// token service (`tests/registry/tokenservice`, in front of it) signs with its JWKS' key.
const TOKEN_AUTH: &str = "  token:
    realm: http://TOKEN/token
    service: inplace-test-registry
    issuer: inplace-test-issuer
    jwks: DIR/jwks.json
";

/// The OAuth2 refresh token (an `identitytoken`) a registry in token mode accepts.
pub const REFRESH_TOKEN: &str = "refresh-5b2e9c-never-printed";

/// A file pushed as an artifact.
#[derive(Debug, Clone)]
pub struct Pushed {
    /// The manifest's digest, 64 hex digits (what `crane push` printed).
    pub manifest_digest: String,
    /// The file's sha256 (its layer's digest), 64 hex digits.
    pub sha256: String,
    /// The file's size.
    pub size: u64,
}

impl Registry {
    /// Starts a registry and waits until it answers.
    pub async fn start() -> anyhow::Result<Registry> {
        let addr = free_addr();
        let child = Command::new(tool("crane")?)
            .args(["registry", "serve", "--address", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting crane registry serve")?;
        let server = KillOnDrop(child);
        wait_http_ok(&addr, "/v2/", "the registry").await;
        Ok(Registry {
            _server: server,
            _token_service: None,
            addr,
            docker_config: None,
            _dir: None,
        })
    }

    /// Starts the CNCF Distribution registry (built from `tests/registry`) that admits
    /// `user` with `password` only (htpasswd, HTTP Basic), and logs in to it with the real
    /// `crane auth login` into [`Registry::docker_config`].
    pub async fn start_distribution(user: &str, password: &str) -> anyhow::Result<Registry> {
        let dir = tempfile::tempdir()?;
        let line = run_ok(
            Command::new(crate::tools::distribution_tool("distribution-htpasswd")?)
                .args([user, password]),
        );
        std::fs::write(dir.path().join("htpasswd"), line)?;
        let addr = free_addr();
        let serving = Serving {
            listen: addr,
            reached: addr,
            token_service: None,
        };
        serve_distribution(dir, HTPASSWD_AUTH, serving, user, password).await
    }

    /// Starts the CNCF Distribution registry in token mode: it answers 401 with a `Bearer`
    /// challenge naming a token service that gives tokens to `user` with `password` (HTTP
    /// Basic) or to [`REFRESH_TOKEN`] (an OAuth2 refresh-token grant), and nobody else. The
    /// token service fronts the registry ([`Registry::addr`] is its address, `/token` its
    /// realm), as crane trusts a token service on a loopback address only there. Logged in
    /// to with the real `crane auth login` as [`Registry::start_distribution`].
    pub async fn start_distribution_with_token_service(
        user: &str,
        password: &str,
    ) -> anyhow::Result<Registry> {
        let dir = tempfile::tempdir()?;
        let (front, behind) = (free_addr(), free_addr());
        let (password_file, refresh_file) =
            (dir.path().join("password"), dir.path().join("refresh"));
        std::fs::write(&password_file, password)?;
        std::fs::write(&refresh_file, REFRESH_TOKEN)?;
        let jwks = dir.path().join("jwks.json");
        let child = Command::new(crate::tools::distribution_tool(
            "distribution-token-service",
        )?)
        .arg(front.to_string())
        .arg(&jwks)
        .args(["inplace-test-issuer", "inplace-test-registry", user])
        .arg(&password_file)
        .arg(&refresh_file)
        .arg(behind.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the token service")?;
        let token_service = KillOnDrop(child);
        // It writes the JWKS before it listens, so the registry finds the key at start.
        wait_http_status(&front, "/token", 401, "the token service").await;
        let auth = TOKEN_AUTH.replace("TOKEN", &front.to_string());
        let serving = Serving {
            listen: behind,
            reached: front,
            token_service: Some(token_service),
        };
        serve_distribution(dir, &auth, serving, user, password).await
    }

    /// Overwrites the stored blob `sha256` (64 hex digits) of a Distribution registry with
    /// other bytes of the same length: a mirror whose storage went bad, which still serves
    /// the blob under its digest (Distribution does not re-hash what it reads).
    pub fn corrupt_blob(&self, sha256: &str) -> anyhow::Result<()> {
        let dir = self
            ._dir
            .as_ref()
            .context("only a Distribution registry keeps its storage here")?;
        let data = dir.path().join(format!(
            "data/docker/registry/v2/blobs/sha256/{}/{sha256}/data",
            &sha256[..2]
        ));
        let mut bytes = std::fs::read(&data).with_context(|| data.display().to_string())?;
        for b in &mut bytes {
            *b = !*b;
        }
        std::fs::write(&data, bytes)?;
        Ok(())
    }

    /// `127.0.0.1:PORT`, as references name it.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Pushes `file` (titled `title`) to `repository:tag` with `crane push`: an OCI image
    /// layout with an empty config and the file as its one layer.
    pub fn push_file(
        &self,
        repository: &str,
        tag: &str,
        title: &str,
        file: &[u8],
    ) -> anyhow::Result<Pushed> {
        self.push_platform_file(repository, tag, title, file, None)
    }

    /// [`Registry::push_file`] with the platform (`linux/arm64`) in the manifest's config,
    /// where `crane index append` reads it (as `oras push --artifact-platform` writes it).
    pub fn push_platform_file(
        &self,
        repository: &str,
        tag: &str,
        title: &str,
        file: &[u8],
        platform: Option<&str>,
    ) -> anyhow::Result<Pushed> {
        let layout = tempfile::tempdir()?;
        let pushed = write_layout(layout.path(), title, file, platform)?;
        let target = format!("{}/{repository}:{tag}", self.host());
        let mut push = Command::new(tool("crane")?);
        push.arg("push").arg(layout.path()).arg(&target);
        if let Some(config) = &self.docker_config {
            push.env("DOCKER_CONFIG", config);
        }
        let printed = run_ok(&mut push);
        let expected = format!(
            "{}/{repository}@sha256:{}",
            self.host(),
            pushed.manifest_digest
        );
        if printed.trim() != expected {
            bail!("crane push printed {printed:?}, expected {expected}");
        }
        Ok(pushed)
    }

    /// Pushes an index of `manifests` (digests, 64 hex digits, already in `repository`) to
    /// `repository:tag` with `crane index append`, which gives each entry the platform of
    /// its manifest's config; the index's digest (64 hex digits).
    pub fn push_index(
        &self,
        repository: &str,
        tag: &str,
        manifests: &[&str],
    ) -> anyhow::Result<String> {
        let name = format!("{}/{repository}", self.host());
        let mut append = Command::new(tool("crane")?);
        append.args(["index", "append", "-t", &format!("{name}:{tag}")]);
        for digest in manifests {
            append.args(["-m", &format!("{name}@sha256:{digest}")]);
        }
        if let Some(config) = &self.docker_config {
            append.env("DOCKER_CONFIG", config);
        }
        let printed = run_ok(&mut append);
        printed
            .trim()
            .strip_prefix(&format!("{name}@sha256:"))
            .map(str::to_owned)
            .with_context(|| format!("crane index append printed {printed:?}"))
    }
}

/// Where a Distribution registry listens and is reached, and what fronts it.
struct Serving {
    listen: SocketAddr,
    reached: SocketAddr,
    token_service: Option<KillOnDrop>,
}

/// Serves the Distribution registry from `dir` with the `auth` section, and logs in to it
/// as `user` with `crane auth login`.
async fn serve_distribution(
    dir: tempfile::TempDir,
    auth: &str,
    serving: Serving,
    user: &str,
    password: &str,
) -> anyhow::Result<Registry> {
    let (listen, addr) = (serving.listen, serving.reached);
    let config = format!("{DISTRIBUTION_CONFIG}{auth}")
        .replace("DIR", &dir.path().display().to_string())
        .replace("ADDR", &listen.to_string());
    let config_path = dir.path().join("config.yml");
    std::fs::write(&config_path, config)?;
    let child = Command::new(crate::tools::distribution_tool("distribution-registry")?)
        .arg("serve")
        .arg(&config_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the Distribution registry")?;
    let server = KillOnDrop(child);
    wait_http_status(&addr, "/v2/", 401, "the Distribution registry").await;
    let docker_config = dir.path().join("docker");
    crane_login(&docker_config, &addr.to_string(), user, password)?;
    Ok(Registry {
        _server: server,
        _token_service: serving.token_service,
        addr,
        docker_config: Some(docker_config),
        _dir: Some(dir),
    })
}

/// `crane auth login REGISTRY -u USER --password-stdin` into `DOCKER_CONFIG=dir`: the
/// Docker `config.json` a person's login writes (`dir/config.json`).
pub fn crane_login(dir: &Path, registry: &str, user: &str, password: &str) -> anyhow::Result<()> {
    let mut child = Command::new(tool("crane")?)
        .args(["auth", "login", registry, "-u", user, "--password-stdin"])
        .env("DOCKER_CONFIG", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("crane auth login")?;
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().context("crane's stdin")?;
        stdin.write_all(password.as_bytes())?;
    }
    if !child.wait()?.success() {
        bail!("crane auth login {registry} failed");
    }
    Ok(())
}

/// Writes an OCI image layout holding one artifact manifest for `file`, for `platform`
/// (`os/architecture`) when given.
fn write_layout(
    dir: &Path,
    title: &str,
    file: &[u8],
    platform: Option<&str>,
) -> anyhow::Result<Pushed> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let put = |bytes: &[u8]| -> anyhow::Result<String> {
        let digest = hex::encode(Sha256::digest(bytes));
        std::fs::write(blobs.join(&digest), bytes)?;
        Ok(digest)
    };
    // Without a platform the empty config of an OCI artifact; with one an image config
    // that names it, the only place a manifest says what it is built for.
    let (config, config_type) = match platform.map(|p| p.split_once('/')) {
        None => (b"{}".to_vec(), "application/vnd.oci.empty.v1+json"),
        Some(Some((os, architecture))) => (
            serde_json::to_vec(&serde_json::json!({"architecture": architecture, "os": os}))?,
            "application/vnd.oci.image.config.v1+json",
        ),
        Some(None) => bail!("{platform:?} is not os/architecture"),
    };
    let config = config.as_slice();
    let config_digest = put(config)?;
    let sha256 = put(file)?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": SYSEXT_LAYER_TYPE,
        "config": {
            "mediaType": config_type,
            "digest": format!("sha256:{config_digest}"),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": SYSEXT_LAYER_TYPE,
            "digest": format!("sha256:{sha256}"),
            "size": file.len(),
            "annotations": {"org.opencontainers.image.title": title},
        }],
    }))?;
    let manifest_digest = put(&manifest)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
        }],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(Pushed {
        manifest_digest,
        sha256,
        size: file.len() as u64,
    })
}
