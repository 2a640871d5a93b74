//! What a node should run: the artifacts, how to activate them and how to tell that they
//! work. A NodeRelease carries it; each NodeUpdatePlan carries a copy, so the agent needs
//! read access to nothing but its own plan.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::architecture::Architecture;
use crate::duration::Duration;

/// The pattern of a sha256 digest as the API accepts it: 64 lowercase hex digits.
pub const SHA256_PATTERN: &str = "^[0-9a-f]{64}$";
/// How many bytes an Archive may expand to (its uncompressed tar stream, headers included)
/// when the plan does not say (`maxExtractedSize`): enough for a few node binaries, far less
/// than a decompression bomb would write.
pub const DEFAULT_MAX_EXTRACTED_SIZE: u64 = 256 << 20;

/// The pattern of an artifact name (also the sysext name, so it must be a plain file name).
pub const ARTIFACT_NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$";

/// A Config file's `mode`: three or four octal digits, permission bits only (no setuid,
/// setgid or sticky bit: a configuration file runs nothing).
pub const CONFIG_MODE_PATTERN: &str = "^0?[0-7]{3}$";

/// A Config file's `owner`: `USER:GROUP`, each a name the node resolves or a numeric id.
pub const CONFIG_OWNER_PATTERN: &str =
    "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$";

/// The artifacts, activation and health checks of one revision. Shared by NodeRelease and
/// NodeUpdatePlan; the revision hash is computed over exactly this.
///
/// Either `artifacts` or `agent`: an agent update replaces the judge of every other
/// activation, so it travels alone (no artifacts, no restarted units, no health checks;
/// docs/design/agent-self-update.md). The rules below are the CRD's; `validate.rs` checks
/// the same for objects that never went through the API server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.agent) || (has(self.artifacts) && size(self.artifacts) > 0)", "message": "at least one artifact is required (or agent)", "fieldPath": ".artifacts", "reason": "FieldValueRequired"},
    {"rule": "!has(self.agent) || !has(self.artifacts) || size(self.artifacts) == 0", "message": "a release with agent carries no other artifact", "fieldPath": ".artifacts", "reason": "FieldValueForbidden"},
    {"rule": "!has(self.agent) || !has(self.activation) || !has(self.activation.restartUnits) || size(self.activation.restartUnits) == 0", "message": "a release with agent restarts no unit: the agent restarts itself", "fieldPath": ".activation.restartUnits", "reason": "FieldValueForbidden"},
    {"rule": "!has(self.agent) || !has(self.activation) || !has(self.activation.mode) || self.activation.mode != 'Reboot'", "message": "a release with agent is not activated by a reboot: the agent restarts itself", "fieldPath": ".activation.mode", "reason": "FieldValueForbidden"},
    {"rule": "!has(self.agent) || !has(self.healthChecks) || ((!has(self.healthChecks.units) || size(self.healthChecks.units) == 0) && (!has(self.healthChecks.http) || size(self.healthChecks.http) == 0) && (!has(self.healthChecks.nodeKubeletVersion) || !self.healthChecks.nodeKubeletVersion) && (!has(self.healthChecks.nodeReady) || !self.healthChecks.nodeReady))", "message": "a release with agent has no health checks: the new agent confirms itself", "fieldPath": ".healthChecks", "reason": "FieldValueForbidden"},
]))]
pub struct UpdateContent {
    /// The Kubernetes version this content brings (for example `v1.31.2`). Lets Cluster API
    /// machines map to a release, and is what the `nodeKubeletVersion` health check expects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub kubernetes_version: Option<String>,

    /// The files to download, verify and install. Names are unique. At least one, unless
    /// the content is an agent update (`agent`), which has none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub artifacts: Vec<Artifact>,

    /// A new build of the node agent itself: its system extension image as `make packages`
    /// builds it. The node switches to it, and the new agent must confirm itself by the
    /// node's `[self_update] confirm_timeout`, or a guard outside the image restores the
    /// previous agent (`RolledBack`). Nodes refuse it unless their policy sets
    /// `[self_update] allow`; it must be signed whatever `require_signatures` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentImage>,

    /// What to do after the files are in place.
    #[serde(default)]
    pub activation: Activation,

    /// How to tell that the new revision works. A failing check rolls the node back.
    #[serde(default)]
    pub health_checks: HealthChecks,
}

/// The agent's own system extension image, the content of an agent update.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentImage {
    /// The version the new agent reports (`inplace-agent --version`), for example `0.4.0`.
    /// The new agent confirms only if it is this version, and the signature's trusted
    /// comment must name it (`version:0.4.0`).
    #[schemars(length(min = 1, max = 64))]
    pub version: String,

    /// Where to download the image from (https, unless the node's policy allows http). The
    /// URL must end in the image's file name.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,

    /// The sha256 of the image: 64 lowercase hex digits.
    #[schemars(regex(pattern = SHA256_PATTERN))]
    pub sha256: String,

    /// The size in bytes. Optional, but enforced while streaming when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i64>", range(min = 1))]
    pub size: Option<u64>,

    /// Where to download the image's detached minisign signature. Nodes require it for the
    /// agent image, whatever their `require_signatures` says: the image runs as root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub signature_url: Option<String>,
}

/// One downloadable file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.type != 'Binary' || has(self.path)", "message": "a Binary artifact needs path", "fieldPath": ".path", "reason": "FieldValueRequired"},
    {"rule": "self.type != 'Config' || has(self.path)", "message": "a Config artifact needs path", "fieldPath": ".path", "reason": "FieldValueRequired"},
    {"rule": "self.type == 'Binary' || self.type == 'Config' || !has(self.path)", "message": "path is only for Binary and Config artifacts", "fieldPath": ".path", "reason": "FieldValueForbidden"},
    {"rule": "self.type == 'Config' || !has(self.directory) || !self.directory", "message": "directory is only for Config artifacts", "fieldPath": ".directory", "reason": "FieldValueForbidden"},
    {"rule": "!has(self.directory) || !self.directory || !has(self.mode)", "message": "a directory's files have their archive's modes: mode is for a single file", "fieldPath": ".mode", "reason": "FieldValueForbidden"},
    {"rule": "self.type == 'Config' || !has(self.mode)", "message": "mode is only for Config artifacts", "fieldPath": ".mode", "reason": "FieldValueForbidden"},
    {"rule": "self.type == 'Config' || !has(self.owner)", "message": "owner is only for Config artifacts", "fieldPath": ".owner", "reason": "FieldValueForbidden"},
    {"rule": "self.type != 'Archive' || (has(self.members) && size(self.members) > 0)", "message": "an Archive artifact needs members", "fieldPath": ".members", "reason": "FieldValueRequired"},
    {"rule": "self.type == 'Archive' || !has(self.members) || size(self.members) == 0", "message": "members are only for Archive artifacts", "fieldPath": ".members", "reason": "FieldValueForbidden"},
    {"rule": "has(self.architecture) || !has(self.otherArchitectures) || size(self.otherArchitectures) == 0", "message": "otherArchitectures needs architecture: the one url is built for", "fieldPath": ".architecture", "reason": "FieldValueRequired"},
    {"rule": "!has(self.architecture) || !has(self.otherArchitectures) || self.otherArchitectures.all(b, b.architecture != self.architecture)", "message": "otherArchitectures repeats the artifact's own architecture", "fieldPath": ".otherArchitectures", "reason": "FieldValueInvalid"},
]))]
pub struct Artifact {
    /// Unique within the release. For a Sysext it is the extension name: the image is
    /// linked as `/etc/extensions/<name>.raw` and must carry
    /// `extension-release.<name>`.
    #[schemars(regex(pattern = ARTIFACT_NAME_PATTERN))]
    pub name: String,

    /// What kind of file this is, which decides how it is installed.
    #[serde(rename = "type")]
    pub kind: ArtifactType,

    /// Where to download it from: an https URL (http where the node's policy allows it), or
    /// a registry reference `oci://REGISTRY/REPOSITORY@sha256:DIGEST` pinning an image
    /// manifest that holds the file as one of its layers (a tag alone is refused).
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,

    /// The sha256 of the file: 64 lowercase hex digits. Nothing is installed unless the
    /// downloaded bytes match.
    #[schemars(regex(pattern = SHA256_PATTERN))]
    pub sha256: String,

    /// Where to download a detached minisign signature (`.minisig`) over the file's bytes.
    /// Its trusted comment must name the file (`file:<last segment of url>`) and, when it
    /// names a version (`version:v1.31.2`), that must be `kubernetesVersion`. Required by
    /// nodes whose policy sets `require_signatures`; verified whenever it is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub signature_url: Option<String>,

    /// The size in bytes. Optional, but enforced while streaming when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i64>", range(min = 1))]
    pub size: Option<u64>,

    /// Binary and Config only: the absolute path where the file is linked (for example
    /// `/opt/bin/kubectl`, or `/etc/kubernetes/kubelet.conf.d/50-pods.conf` for a Config).
    /// A Binary must lie in a directory the node's policy allows (`allowed_target_dirs`), a
    /// Config in one of its configuration roots (`allowed_config_roots`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub path: Option<String>,

    /// Config only: `url` is a tar (or tar.gz) archive of a whole directory tree, and
    /// `path` is that directory. The tree replaces what is at `path` as a whole (a
    /// directory there is kept and comes back on rollback); its files have the archive's
    /// permission bits and `owner`, its directories are 0755 and root's, and an entry that
    /// is not a file or a directory refuses it. `maxExtractedSize` bounds it as an
    /// Archive's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub directory: bool,

    /// Config only: the file's permission bits as octal digits (`"0640"`); default `"0644"`.
    /// Each mode and owner of the same bytes is its own stored copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = CONFIG_MODE_PATTERN))]
    pub mode: Option<String>,

    /// Config only: who owns the file, `USER:GROUP` (`"root:kubelet"`, `"0:990"`): names
    /// the node resolves (a name it does not know fails staging, nothing changed) or
    /// numeric ids; default `"root:root"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = CONFIG_OWNER_PATTERN))]
    pub owner: Option<String>,

    /// Archive only: the members to install, and where. Nothing else in the archive is
    /// written anywhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub members: Vec<ArchiveMember>,

    /// Archive only: the most bytes the archive may expand to (its uncompressed tar stream,
    /// headers included); more refuses the whole archive before its members are written.
    /// Default 256 MiB; at most the node's `max_artifact_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i64>", range(min = 1))]
    pub max_extracted_size: Option<u64>,

    /// `Reboot` when this artifact takes effect only at the next boot (a kernel, an OS
    /// image, a sysext that says it needs one): then the whole release is activated by one
    /// reboot of the node, as if `activation.mode` said `Reboot`. Default `Restart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<ActivationMode>,

    /// The node architecture `url` is built for (`amd64`, `arm64`: a Node's
    /// `kubernetes.io/arch`). Absent: the one file serves every architecture. A node of
    /// another architecture takes its build from `otherArchitectures`, and refuses the plan
    /// (`ArchitectureUnsupported`) when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<Architecture>,

    /// The same artifact built for other architectures: each node downloads and installs
    /// only its own build, under the same name, path and activation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["architecture"]))]
    pub other_architectures: Vec<ArchitectureBuild>,
}

/// An artifact's file built for one more architecture (`Artifact.otherArchitectures`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchitectureBuild {
    /// The node architecture this build is for.
    pub architecture: Architecture,

    /// Where to download it from, as the artifact's `url`.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,

    /// The sha256 of this build: 64 lowercase hex digits.
    #[schemars(regex(pattern = SHA256_PATTERN))]
    pub sha256: String,

    /// The size in bytes, enforced while streaming when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i64>", range(min = 1))]
    pub size: Option<u64>,

    /// A detached minisign signature over this build's bytes, as the artifact's
    /// `signatureUrl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub signature_url: Option<String>,
}

impl Artifact {
    /// An artifact of `kind` named `name`, downloaded from `url` and checked against
    /// `sha256`, every optional field absent: set what its type needs with struct update
    /// syntax (`Artifact { path: Some(..), ..Artifact::new(..) }`).
    pub fn new(
        name: impl Into<String>,
        kind: ArtifactType,
        url: impl Into<String>,
        sha256: impl Into<String>,
    ) -> Self {
        Artifact {
            name: name.into(),
            kind,
            url: url.into(),
            sha256: sha256.into(),
            signature_url: None,
            size: None,
            path: None,
            directory: false,
            mode: None,
            owner: None,
            members: Vec::new(),
            max_extracted_size: None,
            activation: None,
            architecture: None,
            other_architectures: Vec::new(),
        }
    }

    /// For a Config artifact linked as `/var/lib/confexts/<name>.raw`: `<name>`, the
    /// configuration extension image it is (`systemd-confext` merges it into `/etc`).
    pub fn confext_name(&self) -> Option<&str> {
        if self.kind != ArtifactType::Config {
            return None;
        }
        let name = self
            .path
            .as_deref()?
            .strip_prefix(CONFEXT_DIR)?
            .strip_prefix('/')?
            .strip_suffix(".raw")?;
        (!name.is_empty() && !name.contains('/')).then_some(name)
    }

    /// A Config file's permission bits: `mode` read as octal, `0o644` when absent.
    pub fn config_mode(&self) -> Result<u32, String> {
        let Some(mode) = self.mode.as_deref() else {
            return Ok(0o644);
        };
        let digits = mode
            .strip_prefix('0')
            .filter(|d| d.len() == 3)
            .unwrap_or(mode);
        if digits.len() != 3 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Err(format!(
                "{mode:?} is not a file mode: three octal digits of permission bits, optionally \
                 after a 0 (\"0640\"); setuid, setgid and sticky bits are refused"
            ));
        }
        u32::from_str_radix(digits, 8).map_err(|e| format!("{mode:?}: {e}"))
    }

    /// A Config file's owner as written, `(user, group)`; `("root", "root")` when absent.
    pub fn config_owner(&self) -> Result<(&str, &str), String> {
        let Some(owner) = self.owner.as_deref() else {
            return Ok(("root", "root"));
        };
        let name_ok = |n: &str| {
            (1..=32).contains(&n.len())
                && !n.starts_with(['.', '-'])
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        };
        match owner.split_once(':') {
            Some((user, group)) if name_ok(user) && name_ok(group) => Ok((user, group)),
            _ => Err(format!(
                "{owner:?} is not USER:GROUP (names of at most 32 letters, digits, '_', '.' \
                 or '-', or numeric ids, such as \"root:kubelet\")"
            )),
        }
    }

    /// Whether the file is an archive the agent extracts: an Archive, a Config directory.
    pub fn is_extracted(&self) -> bool {
        self.kind == ArtifactType::Archive || (self.kind == ArtifactType::Config && self.directory)
    }

    /// What this archive may expand to: `maxExtractedSize`, or the default.
    pub fn extraction_limit(&self) -> u64 {
        self.max_extracted_size
            .unwrap_or(DEFAULT_MAX_EXTRACTED_SIZE)
    }
}

/// Where a Config artifact's link makes it a configuration extension image
/// (`<dir>/<name>.raw`): the one directory `systemd-confext` reads images from that lasts
/// across reboots and is not `/usr`. (`/run/confexts` is emptied at boot; systemd reads no
/// `/etc/confexts`.)
pub const CONFEXT_DIR: &str = "/var/lib/confexts";

/// Where systemd reads unit files and drop-ins that a Config artifact may change.
const UNIT_CONFIG_DIRS: &[&str] = &["/etc/systemd/system/", "/etc/systemd/user/"];

/// How an artifact is installed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ArtifactType {
    /// A systemd-sysext image (`.raw`, squashfs or erofs), stored as
    /// `/opt/extensions/<name>/<file>` and activated by linking `/etc/extensions/<name>.raw`.
    Sysext,
    /// A single executable file, stored content-addressed and linked at `path`.
    Binary,
    /// A tar or tar.gz archive; only the named `members` are installed.
    Archive,
    /// A configuration file, stored content-addressed and linked at `path` under one of the
    /// node's configuration roots (usually below `/etc`). The file it replaces is kept and
    /// restored byte for byte on rollback; a path that did not exist is removed again. A
    /// unit file or drop-in (below `/etc/systemd/`) implies `daemonReload`. At
    /// `/var/lib/confexts/<name>.raw` it is a configuration extension image (systemd >=
    /// 254): merged into `/etc` by `systemd-confext refresh` and proved merged by its
    /// `/etc/extension-release.d/extension-release.<name>`.
    Config,
}

impl ArtifactType {
    /// The name as written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            ArtifactType::Sysext => "Sysext",
            ArtifactType::Binary => "Binary",
            ArtifactType::Archive => "Archive",
            ArtifactType::Config => "Config",
        }
    }
}

/// One file taken out of an archive.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveMember {
    /// The member's path inside the archive (relative, no `..`).
    #[schemars(length(min = 1, max = 4096))]
    pub from: String,
    /// The absolute path where the member is linked on the node.
    #[schemars(length(min = 1, max = 4096))]
    pub to: String,
}

/// What happens after the files are in place.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Activation {
    /// Units restarted, in this order, after the swap. Each must be a `.service` the
    /// node's policy allows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 255)))]
    pub restart_units: Vec<UnitName>,

    /// Reload systemd's unit files (daemon-reload) before restarting units. Defaults to
    /// true when the release has a Sysext artifact, because an image may bring unit files,
    /// or a Config artifact below `/etc/systemd/system/` or `/etc/systemd/user/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_reload: Option<bool>,

    /// `Restart` (the default): after the swap, extensions are refreshed and `restartUnits`
    /// restarted. `Reboot`: after the swap the node reboots once, through logind, in its
    /// slot (a blocking shutdown inhibitor makes it wait); the health checks run after the
    /// boot, and a failure swaps the links back and reboots again into the previous
    /// revision. One artifact with `activation: Reboot` makes the whole release `Reboot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ActivationMode>,
}

/// How a revision takes effect.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ActivationMode {
    /// Refresh extensions, reload and restart the named units.
    #[default]
    Restart,
    /// Reboot the node once.
    Reboot,
}

/// A systemd unit name such as `kubelet.service`.
pub type UnitName = String;

/// How to tell that a revision works.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "duration(self.window) <= duration(self.timeout)", "message": "window must not be longer than timeout", "fieldPath": ".window"},
    {"rule": "duration(self.timeout) > duration('0s')", "message": "timeout must be positive", "fieldPath": ".timeout"},
]))]
pub struct HealthChecks {
    /// Units that must be active, and not restart, for the whole window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 255)))]
    pub units: Vec<UnitName>,

    /// HTTP endpoints on the node that must answer 2xx for the whole window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub http: Vec<HttpCheck>,

    /// Require the Node object to report `status.nodeInfo.kubeletVersion` equal to
    /// `kubernetesVersion`, in a status posted after `kubelet.service` last started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_kubelet_version: bool,

    /// Require the Node object's `Ready` condition to be `True`, as the API server has it.
    /// Like `nodeKubeletVersion`, it counts only a status posted after `kubelet.service`
    /// last started (the condition's `lastHeartbeatTime`), never the one the kubelet before a
    /// restart or a reboot left. Together they mean the new kubelet reported the Node Ready.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_ready: bool,

    /// How long every check must pass without interruption before the revision is
    /// committed.
    #[serde(default = "default_window")]
    pub window: Duration,

    /// Give up and roll back when the checks have not passed for a whole window by then,
    /// counted from activation.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
}

impl Default for HealthChecks {
    fn default() -> Self {
        HealthChecks {
            units: Vec::new(),
            http: Vec::new(),
            node_kubelet_version: false,
            node_ready: false,
            window: default_window(),
            timeout: default_timeout(),
        }
    }
}

fn default_window() -> Duration {
    Duration::from_secs(30)
}

fn default_timeout() -> Duration {
    Duration::from_secs(300)
}

/// An HTTP health check.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpCheck {
    /// The URL to GET, for example `http://127.0.0.1:10248/healthz`.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
}

impl UpdateContent {
    /// Whether any artifact is a systemd-sysext image.
    pub fn has_sysext(&self) -> bool {
        self.artifacts
            .iter()
            .any(|a| a.kind == ArtifactType::Sysext)
    }

    /// Whether any artifact is a configuration extension image ([`Artifact::confext_name`]).
    pub fn has_confext(&self) -> bool {
        self.artifacts.iter().any(|a| a.confext_name().is_some())
    }

    /// Whether a Config artifact lands where systemd reads units or drop-ins, so that PID 1
    /// must reload its unit files for the change to take effect.
    pub fn has_unit_config(&self) -> bool {
        self.artifacts.iter().any(|a| {
            a.kind == ArtifactType::Config
                && a.path
                    .as_deref()
                    .is_some_and(|p| UNIT_CONFIG_DIRS.iter().any(|d| p.starts_with(d)))
        })
    }

    /// Whether the revision is activated by a reboot: the release says so, or one of its
    /// artifacts does.
    pub fn reboots(&self) -> bool {
        self.activation.mode == Some(ActivationMode::Reboot)
            || self
                .artifacts
                .iter()
                .any(|a| a.activation == Some(ActivationMode::Reboot))
    }

    /// Whether to run daemon-reload on activation (explicit, or implied by a Sysext, a
    /// confext image or a Config unit file or drop-in: each may bring units).
    pub fn daemon_reload(&self) -> bool {
        self.activation
            .daemon_reload
            .unwrap_or_else(|| self.has_sysext() || self.has_confext() || self.has_unit_config())
    }
}
