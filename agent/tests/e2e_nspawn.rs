//! End to end on a real systemd host (issue 4, "Prove it on a real host"): a Debian node
//! booted with systemd-nspawn (bookworm's systemd 252 as PID 1, trixie's 257 in
//! `e2e_bed/newer_systemd.rs`; real D-Bus, real systemd-sysext with squashfs images), the
//! real agent binary under the shipped, hardened unit with the node's own kubelet identity
//! and only the shipped RBAC and admission policy, the real kube-apiserver and an artifact
//! server on host loopback (the node shares the host's network).
//!
//! The kubelet of four tests is the test beds' stand-in (`fake-kubelet`, built for the run)
//! inside real Flatcar-like `kubernetes` sysext images with its own `kubelet.service`: it
//! serves `/healthz` and `/version` and reports whatever version it is told, so that one node
//! can walk through five kubelet versions and a build that crash-loops is just other image
//! content. Every such plan health-checks the unit *and* `/healthz` over HTTP. The fifth test
//! (`e2e_bed/real_kubelet.rs`) runs the real kubelet with containerd and a Pod. Each scenario
//! asserts the host inside the node and the plan's status (also read with the real
//! `kubectl`). Seven tests, one node boot each (one starts from v1 merged by hand, one from
//! the real kubelet merged at boot, one kills the agent mid-download; `e2e_bed/reboot.rs`
//! then reboots its node three times through logind; `e2e_bed/newer_systemd.rs` boots
//! trixie for the sysext updates every systemd must do, mutable system extensions and a
//! configuration extension); the scenarios of a test run in sequence on its node. `kill -9`
//! at every step boundary is `crash_matrix.rs`.
//!
//! Needs root, systemd-nspawn, debootstrap and squashfs-tools (a missing prerequisite fails
//! with an install hint), and Go for the first build of the pinned control plane.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inplace_proto::{DesiredState, NodeUpdatePlan, Phase};
use inplace_tests::artifact_server::ArtifactServer;
use inplace_tests::fake_kubelet::FakeKubeletConfig;
use inplace_tests::nspawn::Suite;
use inplace_tests::sysext::{
    ExtensionRelease, Incompatibility, SysextBuilder, SysextImage, kubernetes_image_file_name,
    kubernetes_sysext, sha256_hex,
};
use kube::api::{Patch, PatchParams, PostParams};
use real_node::AgentNode;
use serde_json::{Value, json};

use crate::real_node;

#[path = "e2e_bed/real_kubelet.rs"]
mod real_kubelet;

#[path = "e2e_bed/reboot.rs"]
mod reboot;

#[path = "e2e_bed/registry_mirror.rs"]
mod registry_mirror;

#[path = "e2e_bed/newer_systemd.rs"]
mod newer_systemd;

/// Builds kubernetes sysext images with the stand-in kubelet listening on one port, for the
/// nodes of one Debian release.
struct Images {
    fake_kubelet: PathBuf,
    port: u16,
    dir: PathBuf,
    suite: Suite,
}

impl Images {
    /// Images for the default (bookworm) nodes.
    async fn new(dir: &Path) -> Images {
        Self::for_suite(dir, Suite::Bookworm).await
    }

    /// Images whose extension-release matches `suite`'s nodes.
    async fn for_suite(dir: &Path, suite: Suite) -> Images {
        Images {
            fake_kubelet: real_node::fake_kubelet_binary().await,
            port: inplace_tests::ports::free_port().unwrap(),
            dir: dir.to_owned(),
            suite,
        }
    }

    /// A healthy kubelet of `version`.
    async fn healthy(&self, version: &str) -> SysextImage {
        self.build(version, FakeKubeletConfig::healthy(version), None)
            .await
    }

    /// A kubelet of `version` that exits half a second after every start
    /// (`Restart=always` makes it a crash loop).
    async fn crashing(&self, version: &str) -> SysextImage {
        self.build(version, FakeKubeletConfig::crashing(version), None)
            .await
    }

    /// A healthy kubelet in an image systemd-sysext refuses to merge.
    async fn incompatible(&self, version: &str, how: Incompatibility) -> SysextImage {
        self.build(version, FakeKubeletConfig::healthy(version), Some(how))
            .await
    }

    /// A healthy kubelet whose unit never starts (a drop-in with a `Condition…=` that
    /// is not met): its restart job ends `done` and starts nothing.
    async fn never_starting(&self) -> SysextImage {
        self.build(
            NEVER_STARTING,
            FakeKubeletConfig::healthy(NEVER_STARTING),
            None,
        )
        .await
    }

    async fn build(
        &self,
        version: &str,
        mut config: FakeKubeletConfig,
        broken: Option<Incompatibility>,
    ) -> SysextImage {
        config.port = self.port;
        let mut builder = kubernetes_sysext(&self.fake_kubelet, &config)
            .await
            .unwrap()
            .release(Some(ExtensionRelease::debian(self.suite)));
        if let Some(how) = broken {
            builder = builder.incompatible(how);
        }
        if version == NEVER_STARTING {
            builder = builder.file(
                "usr/lib/systemd/system/kubelet.service.d/10-never.conf",
                "[Unit]\nConditionPathExists=/nonexistent\n",
                0o644,
            );
        }
        // One directory per build: a crashing and a healthy build of one version share
        // the file name.
        let behaviour = sha256_hex(config.render().as_bytes());
        let dir = self.dir.join(format!(
            "{version}-{}-{}",
            &behaviour[..12],
            self.suite.name()
        ));
        tokio::fs::create_dir_all(&dir).await.unwrap();
        builder
            .build(&dir.join(kubernetes_image_file_name(version)))
            .await
            .expect("mksquashfs")
    }

    fn healthz(&self) -> String {
        format!("http://127.0.0.1:{}/healthz", self.port)
    }

    /// The configuration extension `kubelet-conf` (systemd-confext, systemd >= 254) for this
    /// suite's nodes: `/etc/inplace-test/confext` says `tag`, and `drop_in` is the kubelet's
    /// drop-in `/etc/systemd/system/kubelet.service.d/50-confext.conf`.
    async fn confext(&self, tag: &str, drop_in: &str) -> SysextImage {
        SysextBuilder::confext(CONFEXT, self.suite)
            .file("etc/inplace-test/confext", format!("{tag}\n"), 0o644)
            .file(CONFEXT_DROP_IN.trim_start_matches('/'), drop_in, 0o644)
            .build(&self.dir.join(format!("confext-{tag}/{CONFEXT}.raw")))
            .await
            .expect("mksquashfs")
    }
}

/// The configuration extension's name.
const CONFEXT: &str = "kubelet-conf";

/// The kubelet drop-in the configuration extension brings.
const CONFEXT_DROP_IN: &str = "/etc/systemd/system/kubelet.service.d/50-confext.conf";

/// A drop-in that changes nothing the kubelet needs.
const CONFEXT_DROP_IN_V1: &str = "[Service]\nEnvironment=CONFEXT=c1\n";

/// A drop-in with which the kubelet never starts: the configuration change that breaks it.
const CONFEXT_DROP_IN_BROKEN: &str = "[Service]\nExecStart=\nExecStart=/bin/false\n";

/// The version [`Images::never_starting`] builds.
const NEVER_STARTING: &str = "v1.35.0";

/// What the plans of a test share: the node, the server, the kubelet's checks.
struct Plans<'a> {
    bed: &'a AgentNode,
    images: &'a Images,
}

impl Plans<'_> {
    fn server(&self) -> &ArtifactServer {
        &self.bed.server
    }

    /// Serves `image` under `/<tag>/` and returns its artifact.
    async fn sysext(&self, tag: &str, image: &SysextImage) -> Value {
        let file = image.path.file_name().unwrap().to_str().unwrap();
        let path = format!("/{tag}/{file}");
        self.server().put_bytes(&path, image.bytes().await.unwrap());
        json!({"name": "kubernetes", "type": "Sysext", "url": self.server().url(&path),
               "sha256": image.sha256, "size": image.size})
    }

    /// Serves the configuration extension `image` under `/<tag>/` and returns its Config
    /// artifact, linked as `/var/lib/confexts/<name>.raw`.
    async fn confext(&self, tag: &str, image: &SysextImage) -> Value {
        let path = format!("/{tag}/{}.raw", image.name);
        self.server().put_bytes(&path, image.bytes().await.unwrap());
        json!({"name": image.name, "type": "Config", "url": self.server().url(&path),
               "sha256": image.sha256, "size": image.size,
               "path": format!("/var/lib/confexts/{}.raw", image.name)})
    }

    /// Serves a `kubectl` script printing `kubectl-<tag>` and returns its artifact.
    fn kubectl(&self, tag: &str) -> Value {
        let bytes = script(&format!("kubectl-{tag}"));
        let path = format!("/{tag}/kubectl");
        self.server().put_bytes(&path, bytes.clone());
        json!({"name": "kubectl", "type": "Binary", "url": self.server().url(&path),
               "sha256": sha256_hex(&bytes), "size": bytes.len(), "path": "/opt/bin/kubectl"})
    }

    /// Serves a crictl release tarball (`crictl` printing `crictl-<tag>`, and a LICENSE
    /// that is not installed) and returns its artifact: `crictl` → `/opt/bin/crictl`.
    fn crictl(&self, tag: &str) -> Value {
        let crictl = script(&format!("crictl-{tag}"));
        let bytes = tarball(&[
            ("crictl", crictl.as_slice(), 0o755),
            ("LICENSE", b"Apache-2.0\n".as_slice(), 0o644),
        ]);
        let path = format!("/{tag}/crictl-{tag}-linux-amd64.tar.gz");
        self.server().put_bytes(&path, bytes.clone());
        json!({"name": "crictl", "type": "Archive", "url": self.server().url(&path),
               "sha256": sha256_hex(&bytes), "size": bytes.len(),
               "members": [{"from": "crictl", "to": "/opt/bin/crictl"}]})
    }

    /// An Active plan for `artifacts`: restart kubelet, check the unit and `/healthz` for
    /// `window`; roll back when that has not held by `timeout`.
    fn plan(&self, artifacts: Vec<Value>, window: &str, timeout: &str) -> NodeUpdatePlan {
        self.bed.plan(
            artifacts,
            json!({"units": ["kubelet.service"], "http": [{"url": self.images.healthz()}],
                   "window": window, "timeout": timeout}),
        )
    }

    /// A plan that must commit.
    fn healthy(&self, artifacts: Vec<Value>) -> NodeUpdatePlan {
        self.plan(artifacts, "2s", "90s")
    }

    /// A plan that must roll back: a crash-looping kubelet never is healthy for a window.
    fn failing(&self, artifacts: Vec<Value>) -> NodeUpdatePlan {
        self.plan(artifacts, "2s", "10s")
    }
}

fn script(says: &str) -> Vec<u8> {
    format!("#!/bin/sh\necho {says}\n").into_bytes()
}

/// A gzipped tarball of `(name, bytes, mode)` files.
fn tarball(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, bytes, mode) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(*mode);
        header.set_mtime(0);
        header.set_cksum();
        tar.append_data(&mut header, name, *bytes).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

/// Where the agent stores the kubernetes image of `version`.
fn stored_image(version: &str) -> String {
    format!(
        "/opt/extensions/kubernetes/{}",
        kubernetes_image_file_name(version)
    )
}

fn revision(plan: &NodeUpdatePlan) -> String {
    inplace_proto::revision_of(&plan.spec.content)
}

/// Applies `plan` and waits for `want`; returns the revision.
async fn run(bed: &AgentNode, plan: &NodeUpdatePlan, want: Phase, label: &str) -> String {
    let revision = revision(plan);
    bed.apply(plan).await;
    bed.wait_final(want, &revision, label).await;
    revision
}

async fn readlink(bed: &AgentNode, path: &str) -> String {
    bed.node
        .exec_ok(&["readlink", path])
        .await
        .unwrap()
        .trim()
        .to_owned()
}

async fn output(bed: &AgentNode, cmd: &[&str]) -> String {
    bed.node.exec_ok(cmd).await.unwrap().trim().to_owned()
}

/// What the merged kubelet says about itself: `--version`, and `/version` over HTTP. Its unit
/// is `Type=simple`, active before the process listens: the first answer may take a moment
/// on a loaded machine (a read right after `active` was refused, seen in a run beside the
/// real-node suites).
async fn kubelet_answers(bed: &AgentNode, images: &Images) -> (String, String) {
    let url = format!("http://127.0.0.1:{}/version", images.port);
    let cli = output(bed, &["/usr/bin/kubelet", "--version"]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let get = bed
            .node
            .exec(&["/usr/bin/kubelet", "get", &url])
            .await
            .unwrap();
        if get.success() || std::time::Instant::now() > deadline {
            return (cli, get.stdout_text().trim().to_owned());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn assert_kubelet_runs(bed: &AgentNode, images: &Images, version: &str, label: &str) {
    bed.node
        .wait_active("kubelet.service", Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let (cli, http) = kubelet_answers(bed, images).await;
    assert_eq!(cli, format!("Kubernetes {version}"), "{label}");
    assert_eq!(http, format!("{{\"gitVersion\":\"{version}\"}}"), "{label}");
    output(bed, &["/usr/bin/kubelet", "get", &images.healthz()]).await;
}

/// The plan's phase and Ready reason as `kubectl` shows them, and its `currentRevision`.
async fn assert_status(bed: &AgentNode, phase_and_reason: &str, current: &str) {
    assert_eq!(bed.phase_and_reason_by_kubectl().await, phase_and_reason);
    let status = bed.api.get(bed.name()).await.unwrap().status.unwrap();
    assert_eq!(status.current_revision.as_deref(), Some(current));
}

/// The state of what runs: managed links, the merged extensions, kubelet's process.
async fn running_state(bed: &AgentNode) -> String {
    bed.node
        .sh_ok(
            "for l in /etc/extensions/kubernetes.raw /opt/bin/kubectl /opt/bin/crictl; do \
               echo \"$l -> $(readlink $l || echo none)\"; done; \
             systemd-sysext status --no-pager; \
             systemctl show kubelet.service -p ActiveState -p SubState -p MainPID \
               -p NRestarts -p ActiveEnterTimestampMonotonic",
        )
        .await
        .unwrap()
}

/// [`running_state`] plus every file the agent may write to, with size and mtime, and
/// its temporary directory (directories' own mtimes left out: a download started and
/// removed again changes them).
async fn host_listing(bed: &AgentNode) -> String {
    let files = bed
        .node
        .sh_ok(
            "find /etc/extensions /opt/extensions /opt/bin /var/lib/inplace/store \
                  /var/lib/inplace/tmp \\( -type d -printf '%p/\\n' \\) \
                  -o -printf '%p %y %l %s %T@\\n' 2>/dev/null | sort || true",
        )
        .await
        .unwrap();
    format!("{files}{}", running_state(bed).await)
}

/// A revision that must fail before it touches anything: it does, with `reason` and a
/// message containing each of `names`, the host listing is unchanged, and `kubectl` shows
/// the same.
async fn refused(bed: &AgentNode, plan: &NodeUpdatePlan, reason: &str, names: &[&str]) {
    let before = host_listing(bed).await;
    let revision = run(bed, plan, Phase::Failed, reason).await;
    let (got, message) = bed.ready().await;
    assert_eq!(got, reason, "{message}");
    for name in names {
        assert!(
            message.contains(name),
            "{reason}: {name:?} not in {message:?}"
        );
    }
    let status = bed.api.get(bed.name()).await.unwrap().status.unwrap();
    assert_eq!(status.target_revision, Some(revision));
    assert_ne!(status.current_revision, status.target_revision);
    assert_eq!(
        host_listing(bed).await,
        before,
        "{reason}: the host changed"
    );
    assert_eq!(
        bed.phase_and_reason_by_kubectl().await,
        format!("Failed {reason}")
    );
}

/// Sysext updates of the kubelet on bookworm's systemd 252: the updates every supported
/// systemd must do ([`sysext_updates_commit_roll_back_and_stage`]; the trixie test runs
/// them on 257), then a hash mismatch, a URL outside the node's policy, a 404, an extension
/// systemd-sysupdate also manages and a configuration extension (systemd-confext is newer
/// than 252) change nothing on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_sysext_updates_roll_back_stage_and_refuse_on_a_real_node() {
    let bed = AgentNode::start("e2e-sysext", None).await;
    let images = Images::new(bed.work.path()).await;
    let plans = Plans {
        bed: &bed,
        images: &images,
    };

    // A second instance refuses to run.
    let second = bed
        .node
        .exec(&["/usr/bin/inplace-agent", "run"])
        .await
        .unwrap();
    assert!(!second.success());
    assert!(
        second
            .stderr_text()
            .contains("another inplace-agent is running"),
        "{}",
        second.stderr_text()
    );

    let (p1, r1) = sysext_updates_commit_roll_back_and_stage(&plans).await;
    let status_text = bed
        .node
        .systemctl(&["show", "-p", "StatusText", "inplace-agent.service"])
        .await
        .unwrap();
    assert!(status_text.contains("Succeeded"), "{status_text}");
    // Structured journald fields, written by tracing-journald from tracing's spans and
    // events (the reason it replaces the design card's systemd-journal-logger:
    // docs/design/deviations.md): the node (span `agent`), the plan's revision and
    // generation (span `plan`), beside the event's message.
    let logs = output(
        &bed,
        &[
            "journalctl",
            "--no-pager",
            "-q",
            &format!("NODE={}", bed.name()),
            &format!("REVISION={r1}"),
        ],
    )
    .await;
    assert!(logs.contains("committed"), "{logs}");
    let journal = output(
        &bed,
        &[
            "journalctl",
            "--no-pager",
            "-q",
            "-o",
            "json",
            "-u",
            "inplace-agent.service",
        ],
    )
    .await;
    // journald gives a field written more than once (by a span and by the event) as an
    // array of its values.
    let says = |entry: &Value, field: &str, want: &str| match &entry[field] {
        Value::String(value) => value == want,
        Value::Array(values) => values.iter().any(|v| v == want),
        _ => false,
    };
    let committed = journal
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|entry| says(entry, "MESSAGE", "committed") && says(entry, "REVISION", &r1))
        .unwrap_or_else(|| panic!("no structured 'committed' entry for {r1} in\n{journal}"));
    assert!(says(&committed, "NODE", bed.name()), "{committed:#}");
    assert!(says(&committed, "SPAN_NAME", "plan"), "{committed:#}");
    assert!(
        says(&committed, "SYSLOG_IDENTIFIER", "inplace-agent"),
        "{committed:#}"
    );
    let generation = p1.metadata.generation.map(|g| g.to_string());
    assert!(
        !committed["GENERATION"].is_null()
            && generation.is_none_or(|g| says(&committed, "GENERATION", &g)),
        "{committed:#}"
    );

    // Refused without touching anything: a hash mismatch, a URL outside the node's
    // policy, a 404.
    let v5 = images.healthy("v1.34.0").await;
    let mut artifact = plans.sysext("v5", &v5).await;
    let wrong = sha256_hex(b"not the image");
    artifact["sha256"] = wrong.clone().into();
    refused(
        &bed,
        &plans.healthy(vec![artifact]),
        "HashMismatch",
        &["kubernetes", &wrong, &v5.sha256],
    )
    .await;
    let mut artifact = plans.sysext("v6", &v5).await;
    let elsewhere = "https://downloads.example.com/kubernetes-v1.34.0-x86-64.raw";
    artifact["url"] = elsewhere.into();
    let requests = bed.server.requests().len();
    refused(
        &bed,
        &plans.healthy(vec![artifact]),
        "PolicyDenied",
        &["spec.artifacts[0].url", elsewhere],
    )
    .await;
    assert_eq!(bed.server.requests().len(), requests, "no download tried");
    let mut artifact = plans.sysext("v7", &v5).await;
    let missing = bed.server.url("/v7/gone.raw");
    artifact["url"] = missing.clone().into();
    refused(
        &bed,
        &plans.healthy(vec![artifact]),
        "DownloadFailed",
        &["kubernetes", "404", &missing],
    )
    .await;
    assert_kubelet_runs(&bed, &images, "v1.33.1", "after the refusals").await;

    // systemd-sysupdate keeps the same extension, laid out as sysext-bakery does: refused,
    // naming the transfer file; docs/usage/flatcar.md's steps, as written, hand the
    // extension to inplace, and the next revision is applied.
    let transfer = "/etc/sysupdate.kubernetes.d/kubernetes-v1.34.conf";
    let drop_in = "/etc/systemd/system/systemd-sysupdate.service.d/kubernetes.conf";
    bed.node
        .write_file(transfer, SYSUPDATE_TRANSFER.as_bytes(), 0o644)
        .await
        .unwrap();
    bed.node
        .write_file(drop_in, SYSUPDATE_DROP_IN.as_bytes(), 0o644)
        .await
        .unwrap();
    refused(
        &bed,
        &plans.healthy(vec![plans.sysext("v8", &v5).await]),
        "PolicyDenied",
        &["spec.artifacts[0]", "systemd-sysupdate", transfer],
    )
    .await;
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/usage/flatcar.md");
    let steps =
        inplace_tests::docs::shell_block(&page, "## systemd-sysupdate on the node").unwrap();
    bed.node.sh_ok(&steps).await.unwrap();
    let v9 = plans.healthy(vec![plans.sysext("v9", &v5).await]);
    run(
        &bed,
        &v9,
        Phase::Succeeded,
        "v9, sysupdate's transfer removed",
    )
    .await;
    assert_kubelet_runs(&bed, &images, "v1.34.0", "v9").await;

    // A configuration extension on systemd 252, which has no systemd-confext: refused
    // before anything is downloaded, naming the extension and the node's systemd.
    let confext = images.confext("c1", CONFEXT_DROP_IN_V1).await;
    let requests = bed.server.requests().len();
    refused(
        &bed,
        &plans.healthy(vec![
            plans.sysext("v10", &v5).await,
            plans.confext("c1", &confext).await,
        ]),
        "PolicyDenied",
        &[
            "spec.artifacts[1].path",
            "configuration extension kubelet-conf",
            "systemd >= 254",
            "runs systemd 252",
        ],
    )
    .await;
    assert_eq!(bed.server.requests().len(), requests, "no download tried");

    bed.node.poweroff().await.unwrap();
}

/// What the agent does with the kubelet's system extension on every supported systemd (run
/// on bookworm's 252 and trixie's 257): v1 installs, v1 → v2 commits, a crash-looping v3
/// rolls back to v2, a `Staged` v4 leaves v2 running and is then activated from what was
/// staged. Returns v1's plan and revision.
async fn sysext_updates_commit_roll_back_and_stage(plans: &Plans<'_>) -> (NodeUpdatePlan, String) {
    let (bed, images) = (plans.bed, plans.images);
    // v1: the first install.
    let v1 = images.healthy("v1.31.2").await;
    let p1 = plans.healthy(vec![plans.sysext("v1", &v1).await]);
    let r1 = run(bed, &p1, Phase::Succeeded, "v1").await;
    assert_kubelet_runs(bed, images, "v1.31.2", "v1").await;
    // v1 → v2 succeeds.
    let v2 = images.healthy("v1.32.0").await;
    let p2 = plans.healthy(vec![plans.sysext("v2", &v2).await]);
    let r2 = run(bed, &p2, Phase::Succeeded, "v2").await;
    let v2_path = stored_image("v1.32.0");
    assert_eq!(
        readlink(bed, "/etc/extensions/kubernetes.raw").await,
        v2_path
    );
    let sysext = output(bed, &["systemd-sysext", "status", "--no-pager"]).await;
    assert!(
        sysext
            .lines()
            .any(|l| l.starts_with("/usr") && l.contains("kubernetes")),
        "{sysext}"
    );
    assert_kubelet_runs(bed, images, "v1.32.0", "v2").await;
    assert_status(bed, "Succeeded Succeeded", &r2).await;
    assert!(
        bed.node.exists(stored_image("v1.31.2")).await.unwrap(),
        "v1 is kept as the rollback target"
    );

    // v2 → v3 whose kubelet crash-loops: rolled back to v2, which is healthy again.
    let v3 = images.crashing("v1.33.0").await;
    let p3 = plans.failing(vec![plans.sysext("v3", &v3).await]);
    run(bed, &p3, Phase::RolledBack, "v3").await;
    let (reason, message) = bed.ready().await;
    assert_eq!(reason, "RolledBack");
    assert!(
        message.contains("HealthCheckFailed")
            && (message.contains("kubelet.service") || message.contains("/healthz")),
        "{message}"
    );
    assert_eq!(
        readlink(bed, "/etc/extensions/kubernetes.raw").await,
        v2_path
    );
    assert_kubelet_runs(bed, images, "v1.32.0", "after the rollback of v3").await;
    assert_status(bed, "RolledBack RolledBack", &r2).await;
    assert!(
        !bed.node.exists(stored_image("v1.33.0")).await.unwrap(),
        "the rolled-back image is removed"
    );

    // v4 Staged: downloaded and stored, nothing that runs is touched.
    let v4 = images.healthy("v1.33.1").await;
    let mut p4 = plans.healthy(vec![plans.sysext("v4", &v4).await]);
    p4.spec.desired_state = DesiredState::Staged;
    let running = running_state(bed).await;
    let r4 = run(bed, &p4, Phase::Staged, "v4 staged").await;
    let v4_path = stored_image("v1.33.1");
    let stored = output(bed, &["sha256sum", &v4_path]).await;
    assert!(stored.starts_with(&v4.sha256), "{stored}");
    assert_eq!(
        running_state(bed).await,
        running,
        "staging touched what runs"
    );
    assert_status(bed, "Staged Staged", &r2).await;
    // Then Active: activated from what was staged, with the image gone from the server.
    let v4_url = format!("/v4/{}", kubernetes_image_file_name("v1.33.1"));
    let requests = bed.server.requests_for(&v4_url).len();
    bed.server.remove(&v4_url);
    p4.spec.desired_state = DesiredState::Active;
    assert_eq!(run(bed, &p4, Phase::Succeeded, "v4 active").await, r4);
    assert_eq!(
        bed.server.requests_for(&v4_url).len(),
        requests,
        "not downloaded again"
    );
    assert_eq!(
        readlink(bed, "/etc/extensions/kubernetes.raw").await,
        v4_path
    );
    assert_kubelet_runs(bed, images, "v1.33.1", "v4").await;

    (p1, r1)
}

/// A sysext-bakery style transfer for the kubelet's extension: images in
/// `/opt/extensions/kubernetes`, the link `/etc/extensions/kubernetes.raw`.
const SYSUPDATE_TRANSFER: &str = include_str!("fixtures/sysupdate-kubernetes.conf");

/// The drop-in that makes `systemd-sysupdate.service` update that component.
const SYSUPDATE_DROP_IN: &str = "\
[Service]
ExecStartPre=/usr/lib/systemd/systemd-sysupdate -C kubernetes update
";

/// The first update by the agent on a node whose kubelet v1 was merged by hand, with
/// docs/usage/flatcar.md's running-node steps as written (issue 18 item 9): the unit
/// inactive while `/usr` is merged (its start, `merge`, fails "already merged"). v2
/// commits, a crash-looping v3 rolls back to v2 (never `RollbackFailed`), and a kubelet
/// whose restart starts nothing fails its activation even without health checks (issue 18
/// item 5). Merged at boot by the unit is the real kubelet's case (`real_kubelet.rs`);
/// nothing merged before the first update is the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_update_on_a_node_merged_by_hand_commits_and_rolls_back() {
    let bed = AgentNode::start("e2e-merged-byhand", None).await;
    let images = Images::new(bed.work.path()).await;
    let plans = Plans {
        bed: &bed,
        images: &images,
    };
    let v1 = images.healthy("v1.31.2").await;
    bed.node.install_sysext(&v1).await.unwrap();
    bed.node
        .sh_ok(
            "systemd-sysext refresh && systemctl daemon-reload && systemctl start kubelet.service",
        )
        .await
        .unwrap();
    let unit = bed
        .node
        .sh_ok("systemctl is-active systemd-sysext.service || true")
        .await
        .unwrap();
    assert_eq!(unit.trim(), "inactive");
    assert_kubelet_runs(&bed, &images, "v1.31.2", "v1 merged before the agent").await;

    let v2 = images.healthy("v1.32.0").await;
    let p2 = plans.healthy(vec![plans.sysext("v2", &v2).await]);
    let r2 = run(&bed, &p2, Phase::Succeeded, "v2").await;
    assert_kubelet_runs(&bed, &images, "v1.32.0", "v2").await;
    assert_eq!(
        readlink(&bed, "/etc/extensions/kubernetes.raw").await,
        stored_image("v1.32.0")
    );

    let v3 = images.crashing("v1.33.0").await;
    let p3 = plans.failing(vec![plans.sysext("v3", &v3).await]);
    run(&bed, &p3, Phase::RolledBack, "v3").await;
    let (reason, message) = bed.ready().await;
    assert_eq!(reason, "RolledBack", "{message}");
    assert_kubelet_runs(&bed, &images, "v1.32.0", "after the rollback of v3").await;
    assert_status(&bed, "RolledBack RolledBack", &r2).await;

    // A kubelet whose restart starts nothing, in a plan with no health check at all.
    let v4 = images.never_starting().await;
    let p4 = bed.plan(vec![plans.sysext("v4", &v4).await], json!({}));
    // A merge patch over v3's spec: v3's checks are removed with nulls (an empty list is
    // not serialized).
    let mut spec = serde_json::to_value(&p4.spec).unwrap();
    spec["healthChecks"]["units"] = Value::Null;
    spec["healthChecks"]["http"] = Value::Null;
    bed.api
        .patch(
            bed.name(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": spec})),
        )
        .await
        .unwrap();
    bed.wait_final(Phase::RolledBack, &revision(&p4), "v4 never starts")
        .await;
    let (reason, message) = bed.ready().await;
    assert_eq!(reason, "RolledBack", "{message}");
    assert!(
        message.contains("UnitFailed") && message.contains("kubelet.service did not start"),
        "{message}"
    );
    assert_kubelet_runs(&bed, &images, "v1.32.0", "after the rollback of v4").await;
    assert_status(&bed, "RolledBack RolledBack", &r2).await;

    bed.node.poweroff().await.unwrap();
}

/// Binary and Archive artifacts next to the kubelet sysext: installed as links into the
/// content store and rolled back with their revision; a `Staged` archive is activated from
/// its staged members; an image systemd-sysext will not merge and a kubelet version the
/// Node does not report roll back; `SIGKILL` in the health window is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_and_archive_artifacts_install_roll_back_and_resume_on_a_real_node() {
    let bed = AgentNode::start("e2e-files", None).await;
    let images = Images::new(bed.work.path()).await;
    let plans = Plans {
        bed: &bed,
        images: &images,
    };
    let store = |bytes: &[u8]| format!("/var/lib/inplace/store/sha256/{}", sha256_hex(bytes));

    // v1: kubelet, kubectl, crictl.
    let v1 = images.healthy("v1.31.2").await;
    let kubelet_v1 = plans.sysext("v1", &v1).await;
    let p1 = plans.healthy(vec![
        kubelet_v1.clone(),
        plans.kubectl("v1"),
        plans.crictl("v1"),
    ]);
    run(&bed, &p1, Phase::Succeeded, "v1").await;
    let installed = |tag: &str| {
        let bed = &bed;
        let tag = tag.to_owned();
        async move {
            assert_eq!(
                readlink(bed, "/opt/bin/kubectl").await,
                store(&script(&format!("kubectl-{tag}")))
            );
            assert_eq!(
                readlink(bed, "/opt/bin/crictl").await,
                store(&script(&format!("crictl-{tag}")))
            );
            assert_eq!(
                output(bed, &["/opt/bin/kubectl"]).await,
                format!("kubectl-{tag}")
            );
            assert_eq!(
                output(bed, &["/opt/bin/crictl"]).await,
                format!("crictl-{tag}")
            );
        }
    };
    installed("v1").await;
    assert!(
        !bed.node.exists("/opt/bin/LICENSE").await.unwrap(),
        "only the named member is installed"
    );
    assert_kubelet_runs(&bed, &images, "v1.31.2", "v1").await;

    // v2: new kubectl and crictl with a crash-looping kubelet: all rolled back.
    let v2 = images.crashing("v1.32.0").await;
    let p2 = plans.failing(vec![
        plans.sysext("v2", &v2).await,
        plans.kubectl("v2"),
        plans.crictl("v2"),
    ]);
    run(&bed, &p2, Phase::RolledBack, "v2").await;
    installed("v1").await;
    assert_kubelet_runs(&bed, &images, "v1.31.2", "after the rollback of v2").await;
    for gone in [script("kubectl-v2"), script("crictl-v2")] {
        assert!(
            !bed.node.exists(store(&gone)).await.unwrap(),
            "the rolled-back revision's files are removed"
        );
    }

    // v3: a new crictl, Staged, then Active with the tarball gone from the server: the
    // staged member is used.
    let mut p3 = plans.healthy(vec![
        kubelet_v1.clone(),
        plans.kubectl("v1"),
        plans.crictl("v3"),
    ]);
    p3.spec.desired_state = DesiredState::Staged;
    let r3 = run(&bed, &p3, Phase::Staged, "v3 staged").await;
    installed("v1").await;
    assert!(bed.node.exists(store(&script("crictl-v3"))).await.unwrap());
    let tarball_path = "/v3/crictl-v3-linux-amd64.tar.gz";
    let requests = bed.server.requests_for(tarball_path).len();
    bed.server.remove(tarball_path);
    p3.spec.desired_state = DesiredState::Active;
    assert_eq!(run(&bed, &p3, Phase::Succeeded, "v3 active").await, r3);
    assert_eq!(
        bed.server.requests_for(tarball_path).len(),
        requests,
        "not downloaded again"
    );
    assert_eq!(output(&bed, &["/opt/bin/crictl"]).await, "crictl-v3");

    // v4: an image systemd-sysext skips (wrong ID): ExtensionNotMerged, rolled back.
    let v4 = images
        .incompatible("v1.32.1", Incompatibility::WrongId)
        .await;
    let p4 = plans.healthy(vec![
        plans.sysext("v4", &v4).await,
        plans.kubectl("v4"),
        plans.crictl("v3"),
    ]);
    run(&bed, &p4, Phase::RolledBack, "v4").await;
    let (_, message) = bed.ready().await;
    assert!(message.contains("ExtensionNotMerged"), "{message}");
    assert_kubelet_runs(&bed, &images, "v1.31.2", "after the rollback of v4").await;
    assert_eq!(output(&bed, &["/opt/bin/kubectl"]).await, "kubectl-v1");
    let status = bed.api.get(bed.name()).await.unwrap().status.unwrap();
    assert_eq!(status.current_revision.as_deref(), Some(r3.as_str()));

    // v5: the agent is killed (SIGKILL) in the middle of the health window; systemd
    // restarts it, it resumes from its journal and commits only after a full window.
    let v5 = images.healthy("v1.32.2").await;
    let kubelet_v5 = plans.sysext("v5", &v5).await;
    let p5 = plans.plan(
        vec![kubelet_v5.clone(), plans.kubectl("v5"), plans.crictl("v3")],
        "20s",
        "120s",
    );
    let r5 = revision(&p5);
    bed.apply(&p5).await;
    bed.wait_final(Phase::Verifying, &r5, "v5 verifying").await;
    bed.node
        .systemctl(&["kill", "--signal=SIGKILL", "inplace-agent.service"])
        .await
        .unwrap();
    bed.wait_final(Phase::Succeeded, &r5, "v5").await;
    let status = bed.api.get(bed.name()).await.unwrap().status.unwrap();
    assert_eq!(status.current_revision.as_deref(), Some(r5.as_str()));
    assert_eq!(
        status.attempts,
        Some(2),
        "the interrupted activation counts"
    );
    // The sandboxed agent can read a boot ID. (Not compared with the node's: nspawn
    // overlays the container's boot_id, and ProtectKernelTunables' remount of /proc/sys
    // shows the kernel's own, which is what a real host has anyway.)
    assert_eq!(status.boot_id.unwrap_or_default().len(), 36);
    assert_kubelet_runs(&bed, &images, "v1.32.2", "v5").await;

    // The Node object must report the plan's kubelet version. The API says v1.32.2
    // (written by the test in the kubelet's place, with the Ready heartbeat a kubelet posts
    // every few seconds, so that it is newer than kubelet.service's start): a plan expecting
    // v1.33.0 rolls back after its timeout, one expecting v1.32.2 commits.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
        kube::Api::all(bed.test_api.client().await.unwrap());
    let node_object = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": bed.name()}}))
    .unwrap();
    nodes
        .create(&PostParams::default(), &node_object)
        .await
        .unwrap();
    let info = json!({"status": {"nodeInfo": {
        "kubeletVersion": "v1.32.2", "architecture": "amd64", "bootID": "",
        "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
        "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""}}});
    nodes
        .patch_status(bed.name(), &PatchParams::default(), &Patch::Merge(&info))
        .await
        .unwrap();
    let heartbeat = tokio::spawn(post_ready_heartbeats(nodes, bed.name().to_owned()));
    let expecting = |version: &str, timeout: &str| {
        let mut plan = plans.plan(
            vec![kubelet_v5.clone(), plans.kubectl("v5"), plans.crictl("v3")],
            "1s",
            timeout,
        );
        plan.spec.content.kubernetes_version = Some(version.to_owned());
        plan.spec.content.health_checks.node_kubelet_version = true;
        plan
    };
    run(
        &bed,
        &expecting("v1.33.0", "6s"),
        Phase::RolledBack,
        "kubelet version mismatch",
    )
    .await;
    let (_, message) = bed.ready().await;
    assert!(
        message.contains("kubelet v1.32.2, expected v1.33.0"),
        "{message}"
    );
    run(
        &bed,
        &expecting("v1.32.2", "90s"),
        Phase::Succeeded,
        "kubelet version match",
    )
    .await;
    heartbeat.abort();

    bed.node.poweroff().await.unwrap();
}

/// Posts the Node's Ready condition every second, stamped with the time, as the stand-in
/// kubelet (which does not talk to the API server) would if it were a real one.
async fn post_ready_heartbeats(nodes: kube::Api<k8s_openapi::api::core::v1::Node>, name: String) {
    loop {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "reason": "KubeletReady", "lastHeartbeatTime": now}]}});
        nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(ready))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Issue 18: a download survives the agent's death. The agent is killed (SIGKILL) in the
/// middle of a large, throttled download; systemd restarts it, and its second request is
/// a `Range` for exactly the bytes the first process left on disk, with `If-Range` naming
/// the object's ETag. The file ends complete and verified in the store. Then, on the same
/// node, issue 39's registry case (`e2e_bed/registry_mirror.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_resumes_after_the_agent_is_killed_on_a_real_node() {
    use inplace_tests::artifact_server::Fault;

    let bed = AgentNode::start("e2e-resume", None).await;
    let bytes: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    let sha256 = sha256_hex(&bytes);
    let path = "/big/payload";
    bed.server.put_bytes(path, bytes.clone());
    // 64 MiB at 4 MiB/s: about 16 s, time enough to kill the agent in the middle.
    bed.server.fault(path, Fault::Throttle(4 << 20));
    let mut plan = bed.plan(
        vec![
            json!({"name": "payload", "type": "Binary", "url": bed.server.url(path),
                    "sha256": sha256, "size": bytes.len(), "path": "/opt/bin/payload"}),
        ],
        json!({"units": ["kubelet.service"], "window": "2s", "timeout": "90s"}),
    );
    plan.spec.desired_state = DesiredState::Staged;
    let revision = revision(&plan);
    bed.apply(&plan).await;

    let partial = format!("/var/lib/inplace/tmp/.payload.{}.partial", &sha256[..16]);
    bed.wait_file_size(&partial, 16 << 20).await;
    bed.node
        .systemctl(&["kill", "--signal=SIGKILL", "inplace-agent.service"])
        .await
        .unwrap();
    // The unit restarts after RestartSec (10 s); what is on disk now is what the killed
    // process left.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let left = bed.node.file_size(&partial).await.unwrap();
    assert!(
        left >= 16 << 20 && left < bytes.len() as u64,
        "{left} bytes left"
    );

    bed.wait_final(Phase::Staged, &revision, "resumed").await;
    // The server logs a request once its answer is written, which may be a moment after
    // the agent has read it (and, for the killed one, when the write fails).
    let mut requests = bed.server.requests_for(path);
    for _ in 0..50 {
        if requests.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        requests = bed.server.requests_for(path);
    }
    requests.sort_by_key(|r| r.at);
    let ranges: Vec<_> = requests
        .iter()
        .map(|r| (r.range.clone(), r.if_range.clone(), r.status))
        .collect();
    assert_eq!(requests.len(), 2, "{ranges:?}");
    assert_eq!(ranges[0], (None, None, 200), "the first process from zero");
    // The server answers 206 only when the If-Range validator is the object's own.
    assert_eq!(
        (ranges[1].0.as_deref(), ranges[1].2),
        (Some(format!("bytes={left}-").as_str()), 206),
        "the restarted agent asks for the rest: {ranges:?}"
    );
    assert!(ranges[1].1.is_some(), "If-Range sent: {ranges:?}");
    println!(
        "killed with {left} of {} bytes on disk; requests {ranges:?}",
        bytes.len()
    );
    let stored = format!("/var/lib/inplace/store/sha256/{sha256}");
    assert_eq!(
        output(&bed, &["sha256sum", &stored]).await,
        format!("{sha256}  {stored}")
    );
    assert_eq!(
        output(
            &bed,
            &[
                "sh",
                "-c",
                "ls -a /var/lib/inplace/tmp | grep -c partial || true"
            ]
        )
        .await,
        "0",
        "no partial download left"
    );
    let agent_log = bed.agent_messages(None).await;
    assert!(
        agent_log.contains("resuming the partial download of an earlier run"),
        "{agent_log}"
    );

    registry_mirror::a_private_sysext_through_a_mirror_resumes_after_a_restart(&bed).await;
    bed.node.poweroff().await.unwrap();
}
