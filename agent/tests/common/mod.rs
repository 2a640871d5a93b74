//! Fake edges (fetcher, systemd, probes) and a test bed in a temporary directory, shared
//! by the integration tests.
//!
//! The fake systemd behaves according to the sysext image the link currently points at,
//! so a rollback really restores health: an image whose bytes contain `restart-fails`
//! makes kubelet's restart job fail, `unhealthy` makes kubelet fail after start,
//! `incompatible` makes systemd-sysext skip it.
//!
//! `systemd-sysext.service` behaves as on systemd 252: its start runs `merge`, which
//! fails while `/usr` is merged (by hand, with the unit inactive); its stop unmerges.
//! Every other unit gets a new invocation on each restart, except kubelet from an image
//! containing `no-start` (its restart job ends `done` without a start, as with a
//! `Condition…=` not met).

pub mod power;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use inplace_agent::fetch::{FetchError, Fetched, Fetcher, Progress};
use inplace_agent::health::{NodeReport, Probes, ReadyCondition};
use inplace_agent::self_update::host::RunningAgent;
use inplace_agent::settings::{self, Settings};
use inplace_agent::status::{MemorySink, StatusSink};
use inplace_agent::systemd::{ExtensionClass, SystemdError, SystemdManager, UnitState};
use inplace_agent::update::{Agent, Host};
use inplace_proto::{Artifact, NodeUpdatePlan, Phase};
use minisign::KeyPair;
use sha2::{Digest, Sha256};
use std::io::Cursor;
use tokio::sync::Notify;

pub const NODE: &str = "worker-1";

use power::FakePower;

pub struct FakeFetcher {
    pub objects: Mutex<HashMap<String, Vec<u8>>>,
    pub calls: AtomicUsize,
    /// Every download hangs (to simulate a crash in the middle of one).
    pub hang: AtomicBool,
    /// Told when a download has begun to hang.
    pub hung: Notify,
}

#[async_trait]
impl Fetcher for FakeFetcher {
    async fn fetch(
        &self,
        artifact: &Artifact,
        dir: &Path,
        progress: Progress<'_>,
    ) -> Result<Fetched, FetchError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if artifact.url.contains("/hang/") || self.hang.load(Ordering::SeqCst) {
            // A download that never ends; leaves a partial file like a real one would.
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(
                dir.join(format!(".{}.hang.partial", artifact.name)),
                b"part",
            )
            .unwrap();
            self.hung.notify_one();
            futures::future::pending::<()>().await;
        }
        let bytes = self.objects.lock().unwrap().get(&artifact.url).cloned();
        let Some(bytes) = bytes else {
            return Err(FetchError::Http {
                artifact: artifact.name.clone(),
                url: artifact.url.clone(),
                status: 404,
            });
        };
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != artifact.sha256 {
            return Err(FetchError::HashMismatch {
                artifact: artifact.name.clone(),
                expected: artifact.sha256.clone(),
                actual,
            });
        }
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join(format!(
            ".{}.{}.partial",
            artifact.name,
            rand::random::<u32>()
        ));
        std::fs::write(&path, &bytes).unwrap();
        progress(bytes.len() as u64);
        Ok(Fetched {
            path,
            source: artifact.url.clone(),
            skipped: vec![],
        })
    }

    async fn fetch_small(
        &self,
        what: &str,
        url: &str,
        limit: usize,
    ) -> Result<Vec<u8>, FetchError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.objects.lock().unwrap().get(url) {
            Some(bytes) if bytes.len() > limit => Err(FetchError::SizeMismatch {
                artifact: what.into(),
                detail: format!("{url} is larger than the limit of {limit} bytes"),
            }),
            Some(bytes) => Ok(bytes.clone()),
            None => Err(FetchError::Http {
                artifact: what.into(),
                url: url.into(),
                status: 404,
            }),
        }
    }
}

pub struct FakeSystemd {
    pub settings: Settings,
    pub calls: Mutex<Vec<String>>,
    /// Every restart fails from now on (a broken node: rollback cannot succeed).
    pub broken: AtomicBool,
    /// kubelet's restart never finishes (to simulate a crash in the middle).
    pub hang: AtomicBool,
    /// Told when kubelet's restart has begun to hang.
    pub hung: Notify,
    pub restarts: AtomicUsize,
    /// `systemd-sysext.service` is active.
    pub sysext_active: AtomicBool,
    /// Starts per unit (its `InvocationID`).
    pub invocations: Mutex<HashMap<String, u64>>,
    /// Units that are not active (every other one is).
    pub inactive: Mutex<Vec<String>>,
}

impl FakeSystemd {
    fn linked_image(&self) -> String {
        let link = self.settings.paths.extensions_dir.join("kubernetes.raw");
        std::fs::read_to_string(link).unwrap_or_default()
    }

    fn release_dir(&self) -> PathBuf {
        self.settings
            .paths
            .merged_root
            .join("usr/lib/extension-release.d")
    }

    /// Whether any extension is merged over `/usr`.
    pub fn merged(&self) -> bool {
        std::fs::read_dir(self.release_dir()).is_ok_and(|mut d| d.next().is_some())
    }

    fn unmerge(&self) {
        let _ = std::fs::remove_dir_all(self.release_dir());
    }

    /// The images linked in the extensions directory (`systemd-sysext list`).
    fn linked_images(&self) -> Vec<(String, String)> {
        let Ok(dir) = std::fs::read_dir(&self.settings.paths.extensions_dir) else {
            return Vec::new();
        };
        dir.filter_map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().to_string();
            let name = name.strip_suffix(".raw")?.to_owned();
            Some((
                name,
                std::fs::read_to_string(entry.path()).unwrap_or_default(),
            ))
        })
        .collect()
    }

    /// `systemd-sysext merge`: an extension-release file for every compatible linked
    /// image.
    fn merge(&self) {
        let release_dir = self.release_dir();
        std::fs::create_dir_all(&release_dir).unwrap();
        for (name, content) in self.linked_images() {
            if !content.contains("incompatible") {
                std::fs::write(
                    release_dir.join(format!("extension-release.{name}")),
                    "ID=_any\n",
                )
                .unwrap();
            }
        }
    }

    /// `systemd-sysext refresh` run by hand: the unit stays as it was.
    pub fn refresh_by_hand(&self) {
        self.unmerge();
        self.merge();
    }
}

#[async_trait]
impl SystemdManager for FakeSystemd {
    async fn restart_unit(&self, unit: &str) -> Result<(), SystemdError> {
        self.calls.lock().unwrap().push(format!("restart {unit}"));
        if self.broken.load(Ordering::SeqCst) {
            return Err(SystemdError::JobFailed {
                unit: unit.into(),
                result: "failed".into(),
            });
        }
        if unit == "systemd-sysext.service" {
            // Stop unmerges; start (only with an image linked) merges, and on systemd
            // 252 fails when /usr is merged already.
            if self.sysext_active.swap(false, Ordering::SeqCst) {
                self.unmerge();
            }
            if self.linked_images().is_empty() {
                return Ok(());
            }
            if self.merged() {
                return Err(SystemdError::JobFailed {
                    unit: unit.into(),
                    result: "failed".into(),
                });
            }
            self.merge();
            self.sysext_active.store(true, Ordering::SeqCst);
            return Ok(());
        }
        if unit == "kubelet.service" && self.linked_image().contains("no-start") {
            return Ok(());
        }
        if unit == "kubelet.service" {
            if self.hang.load(Ordering::SeqCst) {
                self.hung.notify_one();
                futures::future::pending::<()>().await;
            }
            self.restarts.fetch_add(1, Ordering::SeqCst);
            if self.linked_image().contains("restart-fails") {
                return Err(SystemdError::JobFailed {
                    unit: unit.into(),
                    result: "failed".into(),
                });
            }
        }
        *self
            .invocations
            .lock()
            .unwrap()
            .entry(unit.to_owned())
            .or_default() += 1;
        Ok(())
    }

    async fn refresh_extensions(&self, class: ExtensionClass) -> Result<(), SystemdError> {
        if class == ExtensionClass::Confext {
            // No configuration extension in these flows: systemd 252 has no confext.
            self.calls.lock().unwrap().push("refresh confexts".into());
            return Err(SystemdError::JobFailed {
                unit: class.refresh_unit().into(),
                result: "failed".into(),
            });
        }
        self.calls.lock().unwrap().push("refresh extensions".into());
        if self.broken.load(Ordering::SeqCst) {
            return Err(SystemdError::JobFailed {
                unit: inplace_agent::systemd::SYSEXT_REFRESH_UNIT.into(),
                result: "failed".into(),
            });
        }
        self.refresh_by_hand();
        Ok(())
    }

    async fn unmerge_extensions(&self, class: ExtensionClass) -> Result<(), SystemdError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("unmerge {class:?}"));
        if class == ExtensionClass::Sysext {
            self.unmerge();
        }
        Ok(())
    }

    async fn version(&self) -> Result<u32, SystemdError> {
        // The sysext this fake models is systemd 252's (a start fails when merged).
        Ok(252)
    }

    async fn daemon_reload(&self) -> Result<(), SystemdError> {
        self.calls.lock().unwrap().push("daemon-reload".into());
        Ok(())
    }

    /// PID 1's chown, done here (the tests run as root, with the capability).
    async fn chown(&self, paths: &[PathBuf], uid: u32, gid: u32) -> Result<(), SystemdError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("chown {uid}:{gid}"));
        for path in paths {
            std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(|e| {
                SystemdError::JobFailed {
                    unit: inplace_agent::systemd::CHOWN_UNIT.into(),
                    result: e.to_string(),
                }
            })?;
        }
        Ok(())
    }

    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        let unhealthy = unit == "kubelet.service" && self.linked_image().contains("unhealthy");
        if self.inactive.lock().unwrap().iter().any(|u| u == unit) {
            return Ok(UnitState {
                active_state: "inactive".into(),
                sub_state: "dead".into(),
                n_restarts: None,
                active_enter_monotonic: 0,
                active_enter_realtime: 0,
                invocation_id: String::new(),
            });
        }
        Ok(UnitState {
            active_state: if unhealthy { "failed" } else { "active" }.into(),
            sub_state: if unhealthy { "failed" } else { "running" }.into(),
            n_restarts: Some(0),
            active_enter_monotonic: if unit == "kubelet.service" {
                self.restarts.load(Ordering::SeqCst) as u64
            } else {
                0
            },
            // No wall-clock start: the Node reports of these flows carry no heartbeat to
            // compare with (health::tests has the kubelet's start against them).
            active_enter_realtime: 0,
            invocation_id: self
                .invocations
                .lock()
                .unwrap()
                .get(unit)
                .map_or_else(String::new, |n| format!("{n:032x}")),
        })
    }
}

/// HTTP checks pass; the Node reports kubelet v1.31.2 and Ready, unless the linked image
/// says `not-ready`: a kubelet that runs but never gets the Node Ready.
pub struct FakeProbes {
    systemd: Arc<FakeSystemd>,
}

#[async_trait]
impl Probes for FakeProbes {
    async fn http_ok(&self, _url: &str) -> Result<(), String> {
        Ok(())
    }
    async fn node_status(&self) -> Result<NodeReport, String> {
        let ready = if self.systemd.linked_image().contains("not-ready") {
            ReadyCondition {
                status: "False".into(),
                reason: "KubeletNotReady".into(),
                message: "container runtime network not ready".into(),
                last_heartbeat: None,
            }
        } else {
            ReadyCondition {
                status: "True".into(),
                reason: "KubeletReady".into(),
                message: "kubelet is posting ready status".into(),
                last_heartbeat: None,
            }
        };
        Ok(NodeReport {
            kubelet_version: Some("v1.31.2".into()),
            ready: Some(ready),
        })
    }
}

pub struct Bed {
    pub dir: tempfile::TempDir,
    pub settings: Settings,
    pub fetcher: Arc<FakeFetcher>,
    pub systemd: Arc<FakeSystemd>,
    pub status: Arc<MemorySink>,
    /// The agent the bed's coordinator runs as (its version and binary).
    pub running: RunningAgent,
    /// Every sd_notify `STATUS=` line, in order.
    pub notified: Arc<Mutex<Vec<String>>>,
    /// logind and the boot ID.
    pub power: Arc<FakePower>,
}

impl Bed {
    pub fn new() -> Bed {
        Bed::with_config_root(None)
    }

    /// A bed whose Configs may also go below `config_root` (besides `<root>/etc/kubernetes`),
    /// e.g. a directory on another file system than the bed's state directory.
    pub fn with_config_root(config_root: Option<&Path>) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().display().to_string();
        let extra_config_root = config_root
            .map(|p| format!(", \"{}\"", p.display()))
            .unwrap_or_default();
        let text = format!(
            r#"
node_name = "{NODE}"
state_dir = "{root}/state"
[policy]
allowed_url_prefixes = ["https://dl.example/"]
allowed_target_dirs = ["{root}/opt/bin"]
allowed_config_roots = ["{root}/etc/kubernetes"{extra_config_root}]
[activation]
health_interval = "5ms"
max_attempts = 3
[paths]
extensions_dir = "{root}/etc/extensions"
images_dir = "{root}/opt/extensions"
merged_root = "{root}/merged"
lock_file = "{root}/run/lock"
"#
        );
        let settings = settings::from_toml(&text, || None).unwrap();
        let systemd = Arc::new(FakeSystemd {
            settings: settings.clone(),
            calls: Mutex::new(Vec::new()),
            broken: AtomicBool::new(false),
            hang: AtomicBool::new(false),
            hung: Notify::new(),
            restarts: AtomicUsize::new(0),
            sysext_active: AtomicBool::new(false),
            inactive: Mutex::new(Vec::new()),
            invocations: Mutex::new(HashMap::new()),
        });
        let exe = dir.path().join("usr/bin/inplace-agent");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        std::fs::write(&exe, "agent 0.1.0").unwrap();
        Bed {
            running: RunningAgent {
                version: "0.1.0".into(),
                exe,
            },
            notified: Arc::default(),
            power: Arc::default(),
            dir,
            settings,
            fetcher: Arc::new(FakeFetcher {
                objects: Mutex::new(HashMap::new()),
                calls: AtomicUsize::new(0),
                hang: AtomicBool::new(false),
                hung: Notify::new(),
            }),
            systemd,
            status: Arc::new(MemorySink::default()),
        }
    }

    pub async fn agent(&self) -> Agent {
        self.agent_with(self.status.clone()).await
    }

    /// An agent that writes status to `status` instead of the bed's memory sink.
    pub async fn agent_with(&self, status: Arc<dyn StatusSink>) -> Agent {
        let host = Host {
            systemd: self.systemd.clone(),
            fetcher: self.fetcher.clone(),
            probes: self.probes(),
            status,
            notify: {
                let notified = self.notified.clone();
                Arc::new(move |line: &str| notified.lock().unwrap().push(line.to_owned()))
            },
            running: self.running.clone(),
            power: self.power.clone(),
        };
        Agent::open(self.settings.clone(), host).await.unwrap()
    }

    /// The probes the bed's agents use, reading the bed's host.
    pub fn probes(&self) -> Arc<FakeProbes> {
        Arc::new(FakeProbes {
            systemd: self.systemd.clone(),
        })
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// A plan with a sysext image of `image` bytes and a kubectl binary of `binary` bytes.
    pub fn plan(&self, image: &str, binary: &str, desired: &str) -> NodeUpdatePlan {
        let mut objects = self.fetcher.objects.lock().unwrap();
        let image_url = format!(
            "https://dl.example/k8s/{}/kubernetes.raw",
            hex::encode(&Sha256::digest(image)[..4])
        );
        let binary_url = format!(
            "https://dl.example/bin/{}/kubectl",
            hex::encode(&Sha256::digest(binary)[..4])
        );
        objects.insert(image_url.clone(), image.as_bytes().to_vec());
        objects.insert(binary_url.clone(), binary.as_bytes().to_vec());
        let plan = serde_json::json!({
            "apiVersion": "inplace.dev/v1alpha1",
            "kind": "NodeUpdatePlan",
            "metadata": {"name": NODE, "generation": 1},
            "spec": {
                "nodeName": NODE,
                "desiredState": desired,
                "kubernetesVersion": "v1.31.2",
                "artifacts": [
                    {"name": "kubernetes", "type": "Sysext", "url": image_url,
                     "sha256": hex::encode(Sha256::digest(image)), "size": image.len()},
                    {"name": "kubectl", "type": "Binary", "url": binary_url,
                     "sha256": hex::encode(Sha256::digest(binary)),
                     "path": format!("{}/opt/bin/kubectl", self.root().display())},
                ],
                "activation": {"restartUnits": ["kubelet.service"]},
                "healthChecks": {"units": ["kubelet.service"], "nodeKubeletVersion": true,
                                 "window": "20ms", "timeout": "20s"},
            }
        });
        serde_json::from_value(plan).unwrap()
    }

    pub fn link(&self) -> String {
        std::fs::read_to_string(self.settings.paths.extensions_dir.join("kubernetes.raw"))
            .unwrap_or_default()
    }

    pub fn kubectl(&self) -> String {
        std::fs::read_to_string(self.root().join("opt/bin/kubectl")).unwrap_or_default()
    }

    pub fn last(&self) -> inplace_proto::NodeUpdatePlanStatus {
        self.status.last().expect("a status")
    }

    pub fn phases(&self) -> Vec<Phase> {
        let mut phases: Vec<Phase> = Vec::new();
        for s in self.status.published.lock().unwrap().iter() {
            if let Some(p) = s.phase
                && phases.last() != Some(&p)
            {
                phases.push(p);
            }
        }
        phases
    }

    pub fn ready(&self) -> (String, String, String) {
        let status = self.last();
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    pub fn degraded(&self) -> (String, String) {
        let status = self.last();
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap();
        (c.status.clone(), c.reason.clone())
    }

    /// The node reboots: a new boot ID, the linked extensions merged at boot.
    pub fn boot(&self) {
        self.power.next_boot();
        self.systemd.refresh_by_hand();
    }

    /// Installs v1 and returns the agent.
    pub async fn with_v1(&self) -> Agent {
        let mut agent = self.agent().await;
        agent
            .handle(Some(&self.plan("OK v1", "kubectl v1", "Active")))
            .await
            .unwrap();
        assert_eq!(self.last().phase, Some(Phase::Succeeded));
        agent
    }
}

/// A minisign key pair.
pub struct Signer(KeyPair);

impl Signer {
    pub fn new() -> Signer {
        Signer(KeyPair::generate_unencrypted_keypair().unwrap())
    }

    /// The public key file, as `minisign -G` writes it.
    pub fn public_file(&self) -> String {
        self.0.pk.to_box().unwrap().into_string()
    }

    /// A detached signature over `bytes` with this trusted comment.
    pub fn sign(&self, bytes: &[u8], trusted_comment: &str) -> Vec<u8> {
        minisign::sign(
            Some(&self.0.pk),
            &self.0.sk,
            Cursor::new(bytes),
            Some(trusted_comment),
            None,
        )
        .unwrap()
        .into_string()
        .into_bytes()
    }
}

impl Default for Signer {
    fn default() -> Self {
        Signer::new()
    }
}

/// A bed whose node trusts `signer` (keys in the bed's own directory) and, when `require`,
/// requires signatures.
pub fn bed_trusting(signer: &Signer, require: bool) -> Bed {
    let mut bed = Bed::new();
    let keys = bed.root().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::write(keys.join("release.pub"), signer.public_file()).unwrap();
    // Not a key file: ignored.
    std::fs::write(keys.join("README"), "keys end in .pub").unwrap();
    // Agent images are trusted by the same keys unless a test says otherwise, as on a node
    // that leaves [self_update] trusted_keys_dir at its default.
    bed.settings.self_update.trusted_keys_dir = keys.clone();
    bed.settings.policy.trusted_keys_dir = keys;
    bed.settings.policy.require_signatures = require;
    bed
}
