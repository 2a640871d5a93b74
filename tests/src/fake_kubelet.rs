//! The stand-in kubelet's behaviour file, shared by the `fake-kubelet` binary (which reads it)
//! and the image builders (which write it). Its behaviour is part of the image content, so a
//! "kubelet built to crash" is simply an image whose file says `crash=true`.
//!
//! Format: `key=value` lines, `#` comments. Keys: `version` (`v1.31.2`), `port` (10248),
//! `crash` (`true`: exit 1 after `crash_after_ms`), `crash_after_ms` (500), `healthz`
//! (`ok` | `fail`: answer 500 | `hang`: never answer).

use std::fmt::Write as _;

/// Where the image puts the behaviour file.
pub const CONFIG_PATH: &str = "/usr/lib/fake-kubelet/config";
/// The kubelet's default healthz port.
pub const DEFAULT_PORT: u16 = 10248;

/// Finds the built `fake-kubelet` binary for code that is not an integration test of this
/// crate (those use `env!("CARGO_BIN_EXE_fake-kubelet")`): next to the running executable,
/// or one directory up (cargo puts test binaries in `target/<profile>/deps/`).
pub fn binary_path() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("fake-kubelet"), dir.parent()?.join("fake-kubelet")]
        .into_iter()
        .find(|p| p.is_file())
}

/// How `/healthz` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Healthz {
    /// 200 `ok`.
    Ok,
    /// 500 `unhealthy`.
    Fail,
    /// Accepts the connection and never answers.
    Hang,
}

/// The behaviour of one fake kubelet build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeKubeletConfig {
    /// Reported by `--version` (`Kubernetes <version>`) and `/version`.
    pub version: String,
    /// Port for `/healthz` and `/version` on 127.0.0.1.
    pub port: u16,
    /// Exit non-zero shortly after start (a crash loop under `Restart=always`).
    pub crash: bool,
    /// How long a crashing build runs before it exits.
    pub crash_after_ms: u64,
    /// How `/healthz` answers.
    pub healthz: Healthz,
}

impl FakeKubeletConfig {
    /// A healthy kubelet of `version` on the default port.
    pub fn healthy(version: &str) -> Self {
        Self {
            version: version.to_owned(),
            port: DEFAULT_PORT,
            crash: false,
            crash_after_ms: 500,
            healthz: Healthz::Ok,
        }
    }

    /// A kubelet of `version` that exits 1 half a second after every start.
    pub fn crashing(version: &str) -> Self {
        Self {
            crash: true,
            ..Self::healthy(version)
        }
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut s = String::from("# fake-kubelet behaviour (inplace test bed)\n");
        let healthz = match self.healthz {
            Healthz::Ok => "ok",
            Healthz::Fail => "fail",
            Healthz::Hang => "hang",
        };
        let _ = write!(
            s,
            "version={}\nport={}\ncrash={}\ncrash_after_ms={}\nhealthz={}\n",
            self.version, self.port, self.crash, self.crash_after_ms, healthz
        );
        s
    }

    /// Parses the file's text; unknown keys are errors so typos do not go unnoticed.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut cfg = Self::healthy("v0.0.0");
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| format!("line {}: expected key=value", n + 1))?;
            let (key, value) = (key.trim(), value.trim());
            let bad = |what: &str| format!("line {}: bad {what} {value:?}", n + 1);
            match key {
                "version" => cfg.version = value.to_owned(),
                "port" => cfg.port = value.parse().map_err(|_| bad("port"))?,
                "crash" => cfg.crash = value.parse().map_err(|_| bad("crash"))?,
                "crash_after_ms" => {
                    cfg.crash_after_ms = value.parse().map_err(|_| bad("crash_after_ms"))?;
                }
                "healthz" => {
                    cfg.healthz = match value {
                        "ok" => Healthz::Ok,
                        "fail" => Healthz::Fail,
                        "hang" => Healthz::Hang,
                        _ => return Err(bad("healthz")),
                    }
                }
                _ => return Err(format!("line {}: unknown key {key:?}", n + 1)),
            }
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_parse_round_trip() {
        let mut cfg = FakeKubeletConfig::crashing("v1.32.0");
        cfg.port = 12345;
        cfg.healthz = Healthz::Hang;
        assert_eq!(FakeKubeletConfig::parse(&cfg.render()), Ok(cfg));
        assert!(FakeKubeletConfig::parse("colour=blue").is_err());
        assert!(FakeKubeletConfig::parse("port=x").is_err());
    }
}
