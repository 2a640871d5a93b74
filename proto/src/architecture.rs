//! Node architectures, and the one place a release's artifacts are narrowed to a node's:
//! a mixed fleet (x86-64 and arm64 nodes) takes one release, each node the build of each
//! artifact for its own architecture ([`UpdateContent::for_architecture`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::content::{Artifact, UpdateContent};
use crate::reason::Reason;
use crate::validate::FieldError;

/// The label the kubelet sets on its Node to the node's architecture (`amd64`, `arm64`).
pub const ARCHITECTURE_LABEL: &str = "kubernetes.io/arch";

/// A node architecture, named as Kubernetes names it in a Node's `kubernetes.io/arch` label
/// and `status.nodeInfo.architecture` (Go's `GOARCH`): `amd64` for x86-64, `arm64` for
/// aarch64.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// x86-64.
    Amd64,
    /// 64-bit ARM (aarch64).
    Arm64,
    /// 64-bit RISC-V.
    Riscv64,
    /// 64-bit little-endian POWER.
    Ppc64le,
    /// IBM Z.
    S390x,
}

impl Architecture {
    /// Every architecture, in documentation order.
    pub const ALL: [Architecture; 5] = [
        Architecture::Amd64,
        Architecture::Arm64,
        Architecture::Riscv64,
        Architecture::Ppc64le,
        Architecture::S390x,
    ];

    /// The name as written in the API and in `kubernetes.io/arch`.
    pub fn as_str(self) -> &'static str {
        match self {
            Architecture::Amd64 => "amd64",
            Architecture::Arm64 => "arm64",
            Architecture::Riscv64 => "riscv64",
            Architecture::Ppc64le => "ppc64le",
            Architecture::S390x => "s390x",
        }
    }

    /// Parses a name written by [`Architecture::as_str`].
    pub fn parse(name: &str) -> Option<Architecture> {
        Self::ALL.into_iter().find(|a| a.as_str() == name)
    }

    /// The architecture this program was built for: the agent's is its node's.
    pub fn of_this_build() -> Option<Architecture> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Architecture::Amd64),
            "aarch64" => Some(Architecture::Arm64),
            "riscv64" => Some(Architecture::Riscv64),
            "powerpc64" if cfg!(target_endian = "little") => Some(Architecture::Ppc64le),
            "s390x" => Some(Architecture::S390x),
            _ => None,
        }
    }
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Artifact {
    /// The architectures this artifact has a build for; empty when its one file serves
    /// every architecture (a script, a configuration file, an architecture-free image).
    pub fn architectures(&self) -> Vec<Architecture> {
        self.architecture
            .into_iter()
            .chain(self.other_architectures.iter().map(|b| b.architecture))
            .collect()
    }

    /// This artifact as a node of `architecture` takes it: its build for that
    /// architecture in `url`, `sha256`, `size` and `signatureUrl`, and no other build.
    /// `None` when it has builds, none of them for `architecture`.
    pub fn for_architecture(&self, architecture: Architecture) -> Option<Artifact> {
        let mut narrowed = Artifact {
            other_architectures: Vec::new(),
            ..self.clone()
        };
        if self.architecture.is_none() || self.architecture == Some(architecture) {
            return Some(narrowed);
        }
        let build = self
            .other_architectures
            .iter()
            .find(|b| b.architecture == architecture)?;
        narrowed.architecture = Some(architecture);
        narrowed.url.clone_from(&build.url);
        narrowed.sha256.clone_from(&build.sha256);
        narrowed.size = build.size;
        narrowed.signature_url.clone_from(&build.signature_url);
        Some(narrowed)
    }
}

impl UpdateContent {
    /// The architectures a node may take this content on: those every artifact built for
    /// an architecture has a build for, in documentation order. `None` when every artifact
    /// serves every architecture. A node of an architecture outside the list (or of one
    /// Kubernetes has no name for) gets `ArchitectureUnsupported` from
    /// [`UpdateContent::for_architecture`]; a rollout passes such nodes over.
    pub fn architectures(&self) -> Option<Vec<Architecture>> {
        let mut built = self
            .artifacts
            .iter()
            .filter(|a| a.architecture.is_some())
            .map(Artifact::architectures)
            .peekable();
        built.peek()?;
        let mut supported = Architecture::ALL.to_vec();
        for builds in built {
            supported.retain(|a| builds.contains(a));
        }
        Some(supported)
    }

    /// The content a node of `architecture` installs: every artifact narrowed to its build
    /// for that architecture ([`Artifact::for_architecture`]). An artifact without one is
    /// a problem at `{at}.artifacts[i]` with reason `ArchitectureUnsupported`: the node
    /// must not run the release without it. `None` (a build for an architecture Kubernetes
    /// has no name for) takes only the artifacts that serve every architecture.
    pub fn for_architecture(
        &self,
        architecture: Option<Architecture>,
        at: &str,
    ) -> Result<UpdateContent, Vec<FieldError>> {
        let mut problems = Vec::new();
        let mut artifacts = Vec::with_capacity(self.artifacts.len());
        for (i, artifact) in self.artifacts.iter().enumerate() {
            match architecture.and_then(|a| artifact.for_architecture(a)) {
                Some(narrowed) => artifacts.push(narrowed),
                None if artifact.architecture.is_none() => artifacts.push(artifact.clone()),
                None => problems.push(FieldError {
                    path: format!("{at}.artifacts[{i}]"),
                    reason: Reason::ArchitectureUnsupported,
                    message: format!(
                        "artifact {} has no build for this node's architecture {} (it has {})",
                        artifact.name,
                        architecture.map_or(std::env::consts::ARCH, Architecture::as_str),
                        artifact
                            .architectures()
                            .iter()
                            .map(|a| a.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(UpdateContent {
            artifacts,
            ..self.clone()
        })
    }
}
