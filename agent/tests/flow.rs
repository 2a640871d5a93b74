//! The whole per-revision flow against fake edges (fetcher, systemd, probes, status) and a
//! real file system in a temporary directory.
//!
//! The fake systemd behaves according to the sysext image the link currently points at,
//! so a rollback really restores health: an image whose bytes contain `restart-fails`
//! makes kubelet's restart job fail, `unhealthy` makes kubelet fail after start,
//! `incompatible` makes systemd-sysext skip it.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use inplace_agent::fetch::{FetchError, Fetcher, Progress};
use inplace_agent::health::Probes;
use inplace_agent::journal::Step;
use inplace_agent::settings::{self, Settings};
use inplace_agent::status::MemorySink;
use inplace_agent::systemd::{SystemdError, SystemdManager, UnitState};
use inplace_agent::update::{Agent, Host};
use inplace_proto::{Artifact, NodeUpdatePlan, Phase};
use sha2::{Digest, Sha256};

const NODE: &str = "worker-1";

struct FakeFetcher {
    objects: Mutex<HashMap<String, Vec<u8>>>,
    calls: AtomicUsize,
}

#[async_trait]
impl Fetcher for FakeFetcher {
    async fn fetch(
        &self,
        artifact: &Artifact,
        dir: &Path,
        progress: Progress<'_>,
    ) -> Result<PathBuf, FetchError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
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
        Ok(path)
    }
}

struct FakeSystemd {
    settings: Settings,
    calls: Mutex<Vec<String>>,
    /// Every restart fails from now on (a broken node: rollback cannot succeed).
    broken: AtomicBool,
    /// kubelet's restart never finishes (to simulate a crash in the middle).
    hang: AtomicBool,
    restarts: AtomicUsize,
}

impl FakeSystemd {
    fn linked_image(&self) -> String {
        let link = self.settings.paths.extensions_dir.join("kubernetes.raw");
        std::fs::read_to_string(link).unwrap_or_default()
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
            // Merge: an extension-release file for every compatible linked image.
            let release_dir = self
                .settings
                .paths
                .merged_root
                .join("usr/lib/extension-release.d");
            let _ = std::fs::remove_dir_all(&release_dir);
            std::fs::create_dir_all(&release_dir).unwrap();
            for entry in std::fs::read_dir(&self.settings.paths.extensions_dir).unwrap() {
                let entry = entry.unwrap();
                let name = entry.file_name().to_string_lossy().to_string();
                let Some(name) = name.strip_suffix(".raw") else {
                    continue;
                };
                let content = std::fs::read_to_string(entry.path()).unwrap_or_default();
                if !content.contains("incompatible") {
                    std::fs::write(
                        release_dir.join(format!("extension-release.{name}")),
                        "ID=_any\n",
                    )
                    .unwrap();
                }
            }
            return Ok(());
        }
        if unit == "kubelet.service" {
            if self.hang.load(Ordering::SeqCst) {
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
        Ok(())
    }

    async fn daemon_reload(&self) -> Result<(), SystemdError> {
        self.calls.lock().unwrap().push("daemon-reload".into());
        Ok(())
    }

    async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        let unhealthy = unit == "kubelet.service" && self.linked_image().contains("unhealthy");
        Ok(UnitState {
            active_state: if unhealthy { "failed" } else { "active" }.into(),
            sub_state: if unhealthy { "failed" } else { "running" }.into(),
            n_restarts: Some(0),
            active_enter_monotonic: self.restarts.load(Ordering::SeqCst) as u64,
        })
    }
}

struct FakeProbes;

#[async_trait]
impl Probes for FakeProbes {
    async fn http_ok(&self, _url: &str) -> Result<(), String> {
        Ok(())
    }
    async fn kubelet_version(&self) -> Result<Option<String>, String> {
        Ok(Some("v1.31.2".into()))
    }
}

struct Bed {
    dir: tempfile::TempDir,
    settings: Settings,
    fetcher: Arc<FakeFetcher>,
    systemd: Arc<FakeSystemd>,
    status: Arc<MemorySink>,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().display().to_string();
        let text = format!(
            r#"
node_name = "{NODE}"
state_dir = "{root}/state"
[policy]
allowed_url_prefixes = ["https://dl.example/"]
allowed_target_dirs = ["{root}/opt/bin"]
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
            restarts: AtomicUsize::new(0),
        });
        Bed {
            dir,
            settings,
            fetcher: Arc::new(FakeFetcher {
                objects: Mutex::new(HashMap::new()),
                calls: AtomicUsize::new(0),
            }),
            systemd,
            status: Arc::new(MemorySink::default()),
        }
    }

    async fn agent(&self) -> Agent {
        let host = Host {
            systemd: self.systemd.clone(),
            fetcher: self.fetcher.clone(),
            probes: Arc::new(FakeProbes),
            status: self.status.clone(),
            notify: Arc::new(|_: &str| {}),
        };
        Agent::open(self.settings.clone(), host).await.unwrap()
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// A plan with a sysext image of `image` bytes and a kubectl binary of `binary` bytes.
    fn plan(&self, image: &str, binary: &str, desired: &str) -> NodeUpdatePlan {
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

    fn link(&self) -> String {
        std::fs::read_to_string(self.settings.paths.extensions_dir.join("kubernetes.raw"))
            .unwrap_or_default()
    }

    fn kubectl(&self) -> String {
        std::fs::read_to_string(self.root().join("opt/bin/kubectl")).unwrap_or_default()
    }

    fn last(&self) -> inplace_proto::NodeUpdatePlanStatus {
        self.status.last().expect("a status")
    }

    fn phases(&self) -> Vec<Phase> {
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

    fn ready(&self) -> (String, String, String) {
        let status = self.last();
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    fn degraded(&self) -> (String, String) {
        let status = self.last();
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap();
        (c.status.clone(), c.reason.clone())
    }

    /// Installs v1 and returns the agent.
    async fn with_v1(&self) -> Agent {
        let mut agent = self.agent().await;
        agent
            .handle(Some(&self.plan("OK v1", "kubectl v1", "Active")))
            .await
            .unwrap();
        assert_eq!(self.last().phase, Some(Phase::Succeeded));
        agent
    }
}

#[tokio::test]
async fn first_install_succeeds() {
    let bed = Bed::new();
    let plan = bed.plan("OK v1", "kubectl v1", "Active");
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(
        bed.phases(),
        vec![
            Phase::Downloading,
            Phase::Activating,
            Phase::Verifying,
            Phase::Succeeded
        ]
    );
    let status = bed.last();
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert_eq!(status.current_revision.as_deref(), Some(revision.as_str()));
    assert_eq!(status.target_revision.as_deref(), Some(revision.as_str()));
    assert_eq!(status.attempts, Some(1));
    assert_eq!(status.observed_generation, Some(1));
    assert!(status.finished_at.is_some());
    assert_eq!(status.artifacts[0].bytes_done, 5);
    assert_eq!(bed.ready().0, "True");
    assert_eq!(bed.degraded(), ("False".into(), "AsExpected".into()));
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    assert_eq!(
        *bed.systemd.calls.lock().unwrap(),
        vec![
            "restart systemd-sysext.service",
            "daemon-reload",
            "restart kubelet.service"
        ]
    );
    // The same plan again: nothing to do.
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
}

#[tokio::test]
async fn upgrades_keep_the_previous_revision_and_collect_older_ones() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let v1_target =
        std::fs::read_link(bed.settings.paths.extensions_dir.join("kubernetes.raw")).unwrap();
    agent
        .handle(Some(&bed.plan("OK v2", "kubectl v2", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.link(), "OK v2");
    assert!(v1_target.exists(), "the previous revision stays on disk");
    let journal = agent.journal();
    assert!(journal.previous.is_some());
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.link(), "OK v3");
    assert_eq!(bed.kubectl(), "kubectl v3");
    assert!(
        !v1_target.exists(),
        "revisions older than the previous one are collected"
    );
}

#[tokio::test]
async fn staged_only_leaves_the_running_revision_untouched() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    bed.systemd.calls.lock().unwrap().clear();
    let plan = bed.plan("OK v2", "kubectl v2", "Staged");
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Staged));
    assert_eq!(bed.ready().0, "True");
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    assert!(bed.systemd.calls.lock().unwrap().is_empty());
    assert_eq!(
        agent.journal().in_flight.as_ref().unwrap().step,
        Step::Staged
    );
    // Then activation reuses the staged files without downloading again.
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    agent
        .handle(Some(&bed.plan("OK v2", "kubectl v2", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(bed.link(), "OK v2");
}

async fn rolls_back(image: &str, reason: &str) {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let plan = bed.plan(image, "kubectl v2", "Active");
    agent.handle(Some(&plan)).await.unwrap();
    let phases = bed.phases();
    assert_eq!(phases.last(), Some(&Phase::RolledBack), "{phases:?}");
    assert!(phases.contains(&Phase::RollingBack));
    let (status, r, message) = bed.ready();
    assert_eq!((status.as_str(), r.as_str()), ("False", "RolledBack"));
    assert!(
        message.contains(reason),
        "{message} should mention {reason}"
    );
    assert_eq!(bed.link(), "OK v1", "the old image is linked again");
    assert_eq!(bed.kubectl(), "kubectl v1");
    let revision = inplace_proto::revision_of(&plan.spec.content);
    assert_eq!(bed.last().failed_revisions, vec![revision]);
    // Not retried: the same plan is denied without any download.
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
    assert_eq!(bed.ready().1, "RevisionDenied");
    assert_eq!(bed.last().phase, Some(Phase::Failed));
    // A new revision goes ahead.
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert!(bed.last().failed_revisions.is_empty());
}

#[tokio::test]
async fn unit_restart_failure_rolls_back() {
    rolls_back("OK v2 restart-fails", "UnitFailed").await;
}

#[tokio::test]
async fn health_failure_rolls_back() {
    rolls_back("OK v2 unhealthy", "HealthCheckFailed").await;
}

#[tokio::test]
async fn extension_not_merged_rolls_back() {
    rolls_back("OK v2 incompatible", "ExtensionNotMerged").await;
}

#[tokio::test]
async fn failed_rollback_degrades_the_node_and_stops() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    // v2's health check fails, and then nothing can be restarted any more.
    let plan = bed.plan("OK v2 unhealthy", "kubectl v2", "Active");
    let systemd = bed.systemd.clone();
    let watcher = tokio::spawn(async move {
        while systemd.restarts.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        systemd.broken.store(true, Ordering::SeqCst);
    });
    agent.handle(Some(&plan)).await.unwrap();
    watcher.await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Failed));
    assert_eq!(bed.degraded(), ("True".into(), "RollbackFailed".into()));
    assert_eq!(bed.ready().1, "RollbackFailed");
    // No further automatic action, whatever the plan says.
    let fetches = bed.fetcher.calls.load(Ordering::SeqCst);
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), fetches);
    assert_eq!(bed.degraded().0, "True");
    // Also after a restart.
    let mut agent = bed.agent().await;
    agent
        .handle(Some(&bed.plan("OK v3", "kubectl v3", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.degraded().0, "True");
}

#[tokio::test]
async fn hash_mismatch_fails_without_touching_anything() {
    let bed = Bed::new();
    let mut agent = bed.with_v1().await;
    let mut plan = bed.plan("OK v2", "kubectl v2", "Active");
    plan.spec.content.artifacts[1].sha256 = "ab".repeat(32);
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Failed));
    assert_eq!(bed.ready().1, "HashMismatch");
    assert!(bed.ready().2.contains("kubectl"));
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    // The v2 image staged before the failure is gone again; v1's stays.
    let images: Vec<_> = std::fs::read_dir(bed.settings.paths.images_dir.join("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(images.len(), 1, "{images:?}");
    assert!(agent.journal().in_flight.is_none());
}

#[tokio::test]
async fn download_404_is_permanent_and_named() {
    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.spec.content.artifacts[0].url = "https://dl.example/missing/kubernetes.raw".into();
    agent.handle(Some(&plan)).await.unwrap();
    let (_, reason, message) = bed.ready();
    assert_eq!(reason, "DownloadFailed");
    assert!(
        message.contains("404") && message.contains("kubernetes"),
        "{message}"
    );
}

#[tokio::test]
async fn invalid_and_denied_plans_are_refused_before_any_io() {
    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.spec.content.artifacts[0].sha256 = "XYZ".into();
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.ready().1, "InvalidPlan");
    assert!(bed.ready().2.contains("spec.artifacts[0].sha256"));
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.spec.content.artifacts[1].path = Some("/usr/bin/kubectl".into());
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.ready().1, "PolicyDenied");
    assert!(bed.ready().2.contains("spec.artifacts[1].path"));
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), 0);
    assert!(!bed.settings.state_dir.join("store").exists());
}

#[tokio::test]
async fn plan_for_another_node_is_ignored() {
    let bed = Bed::new();
    let mut agent = bed.agent().await;
    let mut plan = bed.plan("OK v1", "kubectl v1", "Active");
    plan.metadata.name = Some("worker-2".into());
    plan.spec.node_name = "worker-2".into();
    agent.handle(Some(&plan)).await.unwrap();
    assert!(bed.status.last().is_none());
    assert_eq!(bed.fetcher.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn crash_during_activation_resumes_on_restart() {
    let bed = Bed::new();
    drop(bed.with_v1().await);
    let plan = bed.plan("OK v2", "kubectl v2", "Active");
    bed.systemd.hang.store(true, Ordering::SeqCst);
    {
        let mut agent = bed.agent().await;
        // "kill -9" while kubelet restarts: the future is dropped mid-step.
        let run = agent.handle(Some(&plan));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(300), run)
                .await
                .is_err()
        );
    }
    assert_eq!(bed.link(), "OK v2", "the swap happened before the crash");
    bed.systemd.hang.store(false, Ordering::SeqCst);
    let mut agent = bed.agent().await;
    assert_eq!(
        agent.journal().in_flight.as_ref().unwrap().step,
        Step::Activating
    );
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::Succeeded));
    assert_eq!(
        bed.last().attempts,
        Some(2),
        "the interrupted attempt counts"
    );
    assert_eq!(bed.link(), "OK v2");
}

#[tokio::test]
async fn crash_loop_during_activation_rolls_back_and_stops() {
    let bed = Bed::new();
    drop(bed.with_v1().await);
    let plan = bed.plan("OK v2", "kubectl v2", "Active");
    bed.systemd.hang.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let mut agent = bed.agent().await;
        let run = agent.handle(Some(&plan));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(300), run)
                .await
                .is_err()
        );
    }
    bed.systemd.hang.store(false, Ordering::SeqCst);
    let mut agent = bed.agent().await;
    agent.handle(Some(&plan)).await.unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert!(
        bed.ready().2.contains("TooManyAttempts"),
        "{}",
        bed.ready().2
    );
    assert_eq!(bed.link(), "OK v1");
}

#[tokio::test]
async fn plan_deleted_mid_activation_ends_on_the_committed_revision() {
    let bed = Bed::new();
    drop(bed.with_v1().await);
    let plan = bed.plan("OK v2", "kubectl v2", "Active");
    bed.systemd.hang.store(true, Ordering::SeqCst);
    {
        let mut agent = bed.agent().await;
        let run = agent.handle(Some(&plan));
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(300), run)
                .await
                .is_err()
        );
    }
    bed.systemd.hang.store(false, Ordering::SeqCst);
    let mut agent = bed.agent().await;
    agent.handle(None).await.unwrap();
    assert_eq!(bed.link(), "OK v1");
    assert_eq!(bed.kubectl(), "kubectl v1");
    assert!(agent.journal().in_flight.is_none());
    // Superseded, not failed: the revision is not denied.
    assert!(agent.journal().failed.is_empty());
}

#[tokio::test]
async fn first_install_over_a_plain_file_restores_it_on_rollback() {
    let bed = Bed::new();
    let bin = bed.root().join("opt/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("kubectl"), "distro kubectl").unwrap();
    let mut agent = bed.agent().await;
    agent
        .handle(Some(&bed.plan("OK v1 unhealthy", "kubectl v1", "Active")))
        .await
        .unwrap();
    assert_eq!(bed.last().phase, Some(Phase::RolledBack));
    assert_eq!(bed.kubectl(), "distro kubectl");
    let meta = std::fs::symlink_metadata(bin.join("kubectl")).unwrap();
    assert!(meta.is_file());
    assert!(
        !bed.settings
            .paths
            .extensions_dir
            .join("kubernetes.raw")
            .exists()
    );
}
