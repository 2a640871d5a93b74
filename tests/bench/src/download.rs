//! (1) Download + verify of one large artifact from loopback HTTP servers (Debian's nginx
//! and the test bed's artifact server): the agent's fetcher against `curl -o f` (the
//! disk-write limit), `curl -o f && sha256sum f` and `curl | tee f | openssl dgst -sha256`.
//!
//! The served file is in the page cache (read once before every run); every contender
//! writes to the same directory on the same disk; the destination is removed and `sync`
//! run before every run so no run pays for an earlier one's writeback. Repetitions are
//! interleaved (contender order rotates per repetition) and medians reported.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use inplace_agent::fetch::{Fetcher, HttpFetcher};
use inplace_agent::settings::{DownloadSettings, Policy};
use inplace_proto::{Artifact, ArtifactType};
use inplace_tests::artifact_server::{self, ArtifactServer};
use sha2::{Digest, Sha256};

use crate::util::{median, secs, timed_sh};
use crate::{Opts, Row};

const MIB: u64 = 1 << 20;

/// Child-process entry: one fetch with the agent's `HttpFetcher`; prints
/// `<seconds> <VmHWM KiB>` on stdout.
pub async fn fetch_one(url: &str, sha256: &str, size: u64, dir: &Path) -> Result<()> {
    let settings = DownloadSettings {
        attempts: 1,
        connect_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_secs(30),
        min_speed: 0,
        artifact_deadline: Duration::from_secs(3600),
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(1),
    };
    let policy = Policy {
        // The whole origin of the bench's own server (a prefix names scheme, host and port).
        allowed_url_prefixes: vec![
            format!("{}/", url::Url::parse(url)?.origin().ascii_serialization())
                .parse()
                .map_err(anyhow::Error::msg)?,
        ],
        allow_http: true,
        allowed_target_dirs: vec![],
        allowed_config_roots: vec![],
        allowed_units: vec![],
        max_artifact_size: size,
        reserved_disk_space: 0,
        allow_remote_health_checks: false,
        require_signatures: false,
        trusted_keys_dir: "/etc/inplace/keys".into(),
    };
    let fetcher = HttpFetcher::new(&settings, &policy)?;
    let artifact = Artifact {
        size: Some(size),
        ..Artifact::new("bench", ArtifactType::Sysext, url, sha256)
    };
    let started = Instant::now();
    let path = fetcher.fetch(&artifact, dir, &|_| {}).await?.path;
    let took = started.elapsed();
    let hwm = crate::util::status_field("self", "VmHWM").unwrap_or(0);
    println!("{:.6} {hwm} {}", took.as_secs_f64(), path.display());
    Ok(())
}

/// A file of `size` pseudo-random bytes (cached by size); returns its sha256.
fn ensure_source(path: &Path, size: u64) -> Result<String> {
    let sha_path = path.with_extension("sha256");
    if let (Ok(meta), Ok(sha)) = (std::fs::metadata(path), std::fs::read_to_string(&sha_path))
        && meta.len() == size
        && sha.trim().len() == 64
    {
        return Ok(sha.trim().to_owned());
    }
    eprintln!("download: writing a {} MiB source file", size / MIB);
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?,
    );
    let mut hasher = Sha256::new();
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut block = vec![0u8; MIB as usize];
    let mut left = size;
    while left > 0 {
        for chunk in block.chunks_exact_mut(8) {
            // xorshift64*: incompressible, cheap.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            chunk.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(MIB) as usize;
        hasher.update(&block[..n]);
        file.write_all(&block[..n])?;
        left -= n as u64;
    }
    file.flush()?;
    let sha = hex::encode(hasher.finalize());
    std::fs::write(&sha_path, &sha)?;
    Ok(sha)
}

struct Nginx {
    child: tokio::process::Child,
    port: u16,
    conf: PathBuf,
}

impl Nginx {
    /// A fast shutdown through the master (SIGTERM), so no worker outlives it.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
            let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn start_nginx(dir: &Path, www: &Path) -> Result<Nginx> {
    let prefix = dir.join("nginx");
    std::fs::create_dir_all(&prefix)?;
    let port = free_port()?;
    let p = prefix.display();
    let conf = prefix.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n\
             \x20 client_body_temp_path {p}/body;\n  proxy_temp_path {p}/proxy;\n\
             \x20 fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n\
             \x20 types {{ }}\n  default_type application/octet-stream;\n\
             \x20 server {{ listen 127.0.0.1:{port}; root {};  }}\n}}\n",
            www.display()
        ),
    )?;
    let child = tokio::process::Command::new("nginx")
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(prefix.join("error.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting nginx (apt-get install nginx-light; scripts/bench.sh does)")?;
    let nginx = Nginx { child, port, conf };
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(nginx);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = std::fs::read_to_string(prefix.join("error.log")).unwrap_or_default();
    bail!("nginx did not listen on 127.0.0.1:{port}: {log}")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Contender {
    CurlOnly,
    CurlSync,
    CurlSha256sum,
    CurlTeeOpenssl,
    Fetcher,
}

impl Contender {
    const ALL: [Contender; 5] = [
        Contender::CurlOnly,
        Contender::CurlSync,
        Contender::CurlSha256sum,
        Contender::CurlTeeOpenssl,
        Contender::Fetcher,
    ];

    fn label(self) -> &'static str {
        match self {
            Contender::CurlOnly => {
                "curl -o f (the disk-write limit the issue names; curl exits with the data still in the page cache)"
            }
            Contender::CurlSync => "curl -o f && sync f (same durability as the fetcher)",
            Contender::CurlSha256sum => "curl -o f && sha256sum f",
            Contender::CurlTeeOpenssl => "curl | tee f | openssl dgst -sha256",
            Contender::Fetcher => "agent fetcher (HttpFetcher: sha256 while streaming, fsync)",
        }
    }

    fn shell(self, url: &str, f: &Path) -> String {
        let f = f.display();
        match self {
            Contender::CurlOnly => format!("curl -sS -o {f} {url}"),
            Contender::CurlSync => format!("curl -sS -o {f} {url} && sync {f}"),
            Contender::CurlSha256sum => format!("curl -sS -o {f} {url} && sha256sum {f}"),
            Contender::CurlTeeOpenssl => {
                format!("curl -sS {url} | tee {f} | openssl dgst -sha256")
            }
            Contender::Fetcher => String::new(),
        }
    }
}

async fn prepare(src: &Path, dst: &Path, drop_caches: bool) -> Result<()> {
    let _ = std::fs::remove_dir_all(dst);
    std::fs::create_dir_all(dst)?;
    timed_sh("sync").await?;
    if drop_caches {
        timed_sh("echo 3 > /proc/sys/vm/drop_caches").await?;
    }
    timed_sh(&format!("cat {} > /dev/null", src.display())).await?;
    Ok(())
}

/// Runs the fetcher in a child process: wall time (outside) and its peak RSS (KiB).
async fn run_fetcher(url: &str, sha: &str, size: u64, dst: &Path) -> Result<(f64, u64)> {
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let out = tokio::process::Command::new(&exe)
        .args(["fetch-one", "--url", url, "--sha256", sha, "--size"])
        .arg(size.to_string())
        .arg("--dir")
        .arg(dst)
        .output()
        .await?;
    let wall = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "fetcher failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let hwm = text
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok((wall, hwm))
}

fn gbps(bytes: u64, s: f64) -> f64 {
    bytes as f64 / s / 1e9
}

/// The artifact the contenders download, and a small one for the fetcher's memory row.
struct Files {
    /// `o.size_mib` MiB.
    size: u64,
    name: String,
    src: PathBuf,
    sha: String,
    small_mib: u64,
    small_name: String,
    small_src: PathBuf,
    small_sha: String,
    /// Where each download writes (emptied before each).
    dst: PathBuf,
}

impl Files {
    fn make(o: &Opts, www: &Path) -> Result<Files> {
        let size = o.size_mib * MIB;
        let name = format!("art-{}MiB.bin", o.size_mib);
        let src = www.join(&name);
        let sha = ensure_source(&src, size)?;
        // A smaller artifact: the fetcher's peak RSS must not grow with the size. A quarter,
        // so that both downloads fill the fetcher's pipeline (its queued blocks: 16 MiB at
        // most, given back after the download). A sixteenth (64 MiB) never filled it: 11.7
        // MiB against 22.7 for 1 GiB, where 256 MiB peaked at 22.2 (session 35).
        let small_mib = (o.size_mib / 4).max(4);
        let small_name = format!("art-{small_mib}MiB.bin");
        let small_src = www.join(&small_name);
        let small_sha = ensure_source(&small_src, small_mib * MIB)?;
        Ok(Files {
            size,
            name,
            src,
            sha,
            small_mib,
            small_name,
            small_src,
            small_sha,
            dst: o.dir.join("dst"),
        })
    }
}

/// The download rows.
pub async fn run(o: &Opts) -> Result<Vec<Row>> {
    let www = o.dir.join("www");
    std::fs::create_dir_all(&www)?;
    let files = Files::make(o, &www)?;
    let nginx = if o.no_nginx {
        None
    } else {
        Some(start_nginx(&o.dir, &www).await?)
    };
    let server = ArtifactServer::start().await?;
    server.put(
        &format!("/{}", files.name),
        artifact_server::Artifact::file(&files.src)?,
    );
    server.put(
        &format!("/{}", files.small_name),
        artifact_server::Artifact::file(&files.small_src)?,
    );
    // Each server's URLs of the full-size and the small artifact.
    let mut servers = Vec::new();
    if let Some(n) = &nginx {
        let url = |name: &str| format!("http://127.0.0.1:{}/{name}", n.port);
        servers.push(("nginx", url(&files.name), url(&files.small_name)));
    }
    servers.push((
        "artifact server",
        server.url(&format!("/{}", files.name)),
        server.url(&format!("/{}", files.small_name)),
    ));
    // The machine's limits first: the fetcher's target is measured against them.
    let (limits, limit) = limit_rows(o, &files).await?;
    let mut rows = Vec::new();
    let mut fetcher_hwm = Vec::new();
    for (server_name, url, _) in &servers {
        let medians = race(o, &files, url, server_name, &mut fetcher_hwm).await?;
        let nginx_row = nginx.as_ref().filter(|_| *server_name == "nginx");
        // The machine's limits judge the fetcher where the server is not the bottleneck:
        // nginx sends the file with sendfile, where the artifact server reads and copies it
        // in the bench's own process, on the cores the fetcher and its hashing thread use.
        let judged_by = if nginx_row.is_some() || nginx.is_none() {
            Target::MachineLimits(limit)
        } else {
            Target::SameServerPipelines
        };
        rows.extend(contender_rows(
            o,
            &files,
            url,
            server_name,
            nginx_row,
            &medians,
            judged_by,
        ));
    }
    let small_urls: Vec<&str> = servers.iter().map(|(_, _, small)| small.as_str()).collect();
    rows.push(peak_rss_row(o, &files, &small_urls, fetcher_hwm.iter().copied().max()).await?);
    rows.extend(limits);
    let _ = std::fs::remove_dir_all(&files.dst);
    if let Some(n) = nginx {
        n.stop().await;
    }
    Ok(rows)
}

/// Every contender `o.reps` times from `url`, in rotating order; the median seconds of
/// each (in [`Contender::ALL`]'s order). The fetcher's peak RSS of each run goes to `hwm`.
async fn race(
    o: &Opts,
    files: &Files,
    url: &str,
    server_name: &str,
    hwm: &mut Vec<u64>,
) -> Result<Vec<f64>> {
    let f = files.dst.join("f");
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); Contender::ALL.len()];
    for rep in 0..o.reps {
        for k in 0..Contender::ALL.len() {
            let i = (k + rep) % Contender::ALL.len();
            let c = Contender::ALL[i];
            prepare(&files.src, &files.dst, o.drop_caches).await?;
            let t = if c == Contender::Fetcher {
                let (t, peak) = run_fetcher(url, &files.sha, files.size, &files.dst).await?;
                hwm.push(peak);
                t
            } else {
                let (t, out) = timed_sh(&c.shell(url, &f)).await?;
                if c != Contender::CurlOnly && c != Contender::CurlSync && !out.contains(&files.sha)
                {
                    bail!("{}: wrong sha256 printed: {out}", c.label());
                }
                t.as_secs_f64()
            };
            eprintln!("download: {server_name} rep {rep} {}: {t:.3} s", c.label());
            times[i].push(t);
        }
    }
    Ok(times.into_iter().map(median).collect())
}

/// What the fetcher's row from one server is held to.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// Issue 39 item 6: at most 1.2 × this limit (the larger of the run's durable-write and
    /// hash limits) and faster than both pipelines.
    MachineLimits(f64),
    /// Faster than both pipelines from the same server: where the server shares the cores,
    /// the machine's limits are out of any client's reach.
    SameServerPipelines,
}

/// One row per contender from one server; the fetcher's carries `target`.
fn contender_rows(
    o: &Opts,
    files: &Files,
    url: &str,
    server_name: &str,
    nginx: Option<&Nginx>,
    med: &[f64],
    target: Target,
) -> Vec<Row> {
    let f = files.dst.join("f");
    let curl = med[0];
    let prep = format!(
        "rm -rf {d}; mkdir -p {d}; sync; cat {s} >/dev/null",
        d = files.dst.display(),
        s = files.src.display()
    );
    let mut rows = Vec::new();
    for (i, c) in Contender::ALL.iter().enumerate() {
        let value = format!("{} ({:.2} GB/s)", secs(med[i]), gbps(files.size, med[i]));
        let reproduce = if *c == Contender::Fetcher {
            format!(
                "{prep}; /usr/bin/time -v inplace-bench fetch-one --url {url} --sha256 {} --size {} --dir {}",
                files.sha,
                files.size,
                files.dst.display()
            )
        } else if let Some(nginx) = nginx {
            format!(
                "nginx -p {p} -c {conf}; hyperfine -r {r} -p '{prep}' '{cmd}'",
                p = o.dir.join("nginx").display(),
                conf = nginx.conf.display(),
                r = o.reps,
                cmd = c.shell(url, &f)
            )
        } else {
            "inplace-bench download (artifact server in-process)".to_owned()
        };
        let mut row = Row::reference(
            "1 download",
            format!("{} MiB from {server_name}: {}", o.size_mib, c.label()),
            value,
            "s",
            reproduce,
        );
        if *c == Contender::Fetcher {
            let ahead_of_pipelines = med[i] < med[2] && med[i] < med[3];
            let against_curl = format!(
                "{:.2} × curl -o f, {:.2} × curl && sync (like for like), {:.2} × sha256sum pipeline, {:.2} × openssl pipeline",
                med[i] / curl,
                med[i] / med[1],
                med[i] / med[2],
                med[i] / med[3]
            );
            row = match target {
                Target::MachineLimits(limit) => {
                    let ratio = med[i] / limit;
                    row.target(
                        format!(
                            "≤ 1.2 × max(dd conv=fsync, openssl dgst) = {:.3} s and < both pipelines; got {ratio:.2} × that limit, {against_curl}",
                            1.2 * limit
                        ),
                        ratio <= 1.2 && ahead_of_pipelines,
                    )
                }
                Target::SameServerPipelines => row.target(
                    format!(
                        "< both pipelines from this server (the machine's limits judge the nginx row: this server shares the bench's process and cores); got {against_curl}"
                    ),
                    ahead_of_pipelines,
                ),
            };
        }
        rows.push(row);
    }
    rows
}

/// The fetcher's peak RSS for the full-size artifact (`big_hwm`, the largest of the
/// races) against the small one, fetched as often from the same servers: streaming keeps
/// it flat. Largest against largest: one run's peak depends on how many blocks wait for
/// the disk at its worst moment (one small run peaked at 22.2 MiB, another at 17.5), and
/// the largest of ten runs against one small run judged that, not the size.
async fn peak_rss_row(
    o: &Opts,
    files: &Files,
    small_urls: &[&str],
    big_hwm: Option<u64>,
) -> Result<Row> {
    let small_size = files.small_mib * MIB;
    let mut small_hwm = 0;
    for url in small_urls {
        for _ in 0..o.reps {
            prepare(&files.small_src, &files.dst, false).await?;
            let (_, hwm) = run_fetcher(url, &files.small_sha, small_size, &files.dst).await?;
            small_hwm = small_hwm.max(hwm);
        }
    }
    let small_url = small_urls.last().copied().unwrap_or_default();
    let big_hwm = big_hwm.unwrap_or(0);
    Ok(Row::reference(
        "1 download",
        format!(
            "fetcher peak RSS (VmHWM, the largest of {} runs each), {} MiB vs {} MiB artifact",
            o.reps * small_urls.len(),
            o.size_mib,
            files.small_mib
        ),
        format!(
            "{:.1} vs {:.1}",
            big_hwm as f64 / 1024.0,
            small_hwm as f64 / 1024.0
        ),
        "MiB",
        format!(
            "/usr/bin/time -v inplace-bench fetch-one --url {small_url} --sha256 {} --size {small_size} --dir {} (Maximum resident set size)",
            files.small_sha,
            files.dst.display()
        ),
    )
    .target(
        "flat (streaming): within 2 MiB + 10 % of the small download",
        (big_hwm as f64) <= small_hwm as f64 * 1.10 + 2048.0,
    ))
}

/// The limits: the disk's durable write speed and the hash, on the cached file.
async fn limit_rows(o: &Opts, files: &Files) -> Result<(Vec<Row>, f64)> {
    let (src, dst) = (&files.src, &files.dst);
    let mut openssl = Vec::new();
    let mut coreutils = Vec::new();
    let mut dd = Vec::new();
    let f = dst.join("f");
    let dd_cmd = format!(
        "dd if={} of={} bs=1M conv=fsync status=none",
        src.display(),
        f.display()
    );
    for _ in 0..o.reps {
        prepare(src, dst, o.drop_caches).await?;
        dd.push(timed_sh(&dd_cmd).await?.0.as_secs_f64());
        timed_sh(&format!("cat {} > /dev/null", src.display())).await?;
        openssl.push(
            timed_sh(&format!("openssl dgst -sha256 {}", src.display()))
                .await?
                .0
                .as_secs_f64(),
        );
        coreutils.push(
            timed_sh(&format!("sha256sum {}", src.display()))
                .await?
                .0
                .as_secs_f64(),
        );
    }
    let m = median(dd);
    let limit = m.max(median(openssl.clone()));
    let mut rows = vec![Row::reference(
        "1 download",
        format!(
            "{} MiB dd conv=fsync of the cached file (the durable disk-write limit: no network, no hash)",
            o.size_mib
        ),
        format!("{} ({:.2} GB/s)", secs(m), gbps(files.size, m)),
        "s",
        format!(
            "hyperfine -r {} -p 'rm -rf {d}; mkdir -p {d}; sync' '{dd_cmd}'",
            o.reps,
            d = dst.display()
        ),
    )];
    for (label, v, tool) in [
        (
            "openssl dgst -sha256 (cached file: the hash limit)",
            openssl,
            "openssl dgst -sha256",
        ),
        ("sha256sum (coreutils, cached file)", coreutils, "sha256sum"),
    ] {
        let m = median(v);
        rows.push(Row::reference(
            "1 download",
            format!("{} MiB {label}", o.size_mib),
            format!("{} ({:.2} GB/s)", secs(m), gbps(files.size, m)),
            "s",
            format!("hyperfine -r {} -w 1 '{tool} {}'", o.reps, src.display()),
        ));
    }
    Ok((rows, limit))
}
