//! The Kubernetes API a suite runs against: the real kube-apiserver ([`ApiServer`], the
//! default) or the API emulator, for the cases only it can produce (injected 429/500/409
//! answers, cut watches on demand, the 30,000-node simulation). Suites are written once
//! against [`TestApi`]; `INPLACE_TEST_API=emulator` runs a default suite on the emulator.

use std::path::{Path, PathBuf};

use anyhow::Context;
use inplace_api_emulator::{Emulator, EmulatorConfig, Handle, User};

use crate::apiserver::ApiServer;

/// A running API server of either kind.
pub enum TestApi {
    /// kube-apiserver + etcd + kube-controller-manager of the pinned release.
    Real(ApiServer),
    /// The project's emulator (`tests/emulator`).
    Emulator(Handle),
}

impl TestApi {
    /// The default backend: the real server, unless `INPLACE_TEST_API=emulator`.
    pub async fn start() -> anyhow::Result<TestApi> {
        if std::env::var("INPLACE_TEST_API").is_ok_and(|v| v == "emulator") {
            return Self::start_emulator(EmulatorConfig {
                authz: inplace_api_emulator::AuthzMode::Rbac,
                ..EmulatorConfig::default()
            })
            .await;
        }
        Ok(TestApi::Real(ApiServer::start().await?))
    }

    /// The default backend, on the real side this test's turn on the server its nextest run
    /// shares ([`ApiServer::start_shared`], which says for which tests).
    pub async fn start_shared() -> anyhow::Result<TestApi> {
        if std::env::var("INPLACE_TEST_API").is_ok_and(|v| v == "emulator") {
            return Self::start().await;
        }
        Ok(TestApi::Real(ApiServer::start_shared().await?))
    }

    /// The emulator with `config`, for a case only it can produce.
    pub async fn start_emulator(config: EmulatorConfig) -> anyhow::Result<TestApi> {
        Ok(TestApi::Emulator(Emulator::start(config).await?))
    }

    /// The emulator, when this is one (its fault injection, its store).
    pub fn emulator(&self) -> Option<&Handle> {
        match self {
            TestApi::Emulator(handle) => Some(handle),
            TestApi::Real(_) => None,
        }
    }

    /// The real server, when this is one.
    pub fn real(&self) -> Option<&ApiServer> {
        match self {
            TestApi::Real(server) => Some(server),
            TestApi::Emulator(_) => None,
        }
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        match self {
            TestApi::Real(server) => server.url().to_owned(),
            TestApi::Emulator(handle) => handle.url(),
        }
    }

    /// The admin's client configuration.
    pub async fn admin_config(&self) -> anyhow::Result<kube::Config> {
        match self {
            TestApi::Real(server) => server.config_from(&server.admin_kubeconfig()).await,
            TestApi::Emulator(handle) => handle.config_as(&User::admin()).await,
        }
    }

    /// A client acting as the admin.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.admin_config().await?)?)
    }

    /// A client acting as the admin that does not retry 429/503/504 answers (kube's default
    /// client retries them for minutes), to observe them.
    pub async fn client_without_retries(&self) -> anyhow::Result<kube::Client> {
        let mut config = self.admin_config().await?;
        config.default_retry = false;
        Ok(kube::Client::try_from(config)?)
    }

    /// A client acting as `node`'s kubelet identity (`system:node:NODE` in `system:nodes`).
    pub async fn client_as_node(&self, node: &str) -> anyhow::Result<kube::Client> {
        match self {
            TestApi::Real(server) => server.client_as_node(node).await,
            TestApi::Emulator(handle) => handle.client_as_node(node).await,
        }
    }

    /// A kubeconfig (YAML) of `node`'s kubelet identity, as a node's
    /// `/etc/kubernetes/kubelet.conf` holds it.
    pub fn node_kubeconfig_yaml(&self, node: &str) -> anyhow::Result<String> {
        match self {
            TestApi::Real(server) => {
                let path = server.node_kubeconfig(node)?;
                std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))
            }
            TestApi::Emulator(handle) => Ok(handle.kubeconfig_yaml(&User::node(node))),
        }
    }

    /// Writes the admin's kubeconfig to `path` (for kubectl and the controller binary).
    pub fn write_admin_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        match self {
            TestApi::Real(server) => {
                std::fs::copy(server.admin_kubeconfig(), path)
                    .with_context(|| format!("writing {}", path.display()))?;
                Ok(())
            }
            TestApi::Emulator(handle) => handle.write_kubeconfig(path, &User::admin()),
        }
    }

    /// Applies the CRDs in `dir` (and waits until the real server serves them).
    pub async fn apply_crd_dir(&self, dir: &Path) -> anyhow::Result<()> {
        match self {
            TestApi::Real(server) => server.apply_crd_dir(dir).await,
            TestApi::Emulator(handle) => handle.apply_crd_dir(dir).await,
        }
    }

    /// Applies the one CRD in `file` (and waits until the real server serves it).
    pub async fn apply_crd_file(&self, file: &Path) -> anyhow::Result<()> {
        match self {
            TestApi::Real(server) => server.apply_crd_dir(file).await,
            TestApi::Emulator(handle) => {
                let yaml = std::fs::read_to_string(file)
                    .with_context(|| format!("reading {}", file.display()))?;
                handle.apply_crd_yaml(&yaml).await
            }
        }
    }

    /// Creates the objects of the manifests at `path` (a file or a directory of YAML files)
    /// as the admin: with kubectl of the pinned release on the real server; through the API
    /// (kinds resolved by discovery) on the emulator, where kubectl's client-side validation
    /// waits 32 s for `/openapi/v2` for some kinds (ValidatingAdmissionPolicy, RBAC) and then
    /// fails.
    pub async fn apply_manifests(&self, path: &Path) -> anyhow::Result<()> {
        let TestApi::Emulator(_) = self else {
            return self.kubectl_apply(path);
        };
        let client = self.client().await?;
        let discovery = kube::Discovery::new(client.clone()).run().await?;
        let mut files = vec![];
        if path.is_dir() {
            for entry in std::fs::read_dir(path)? {
                let file = entry?.path();
                if file.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                    files.push(file);
                }
            }
            files.sort();
        } else {
            files.push(path.to_path_buf());
        }
        for file in files {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let value: serde_json::Value = serde::Deserialize::deserialize(doc)?;
                if value.is_null() {
                    continue;
                }
                let object: kube::core::DynamicObject = serde_json::from_value(value)?;
                let types = object.types.clone().context("an object without a kind")?;
                let gvk = kube::core::GroupVersionKind::try_from(&types)?;
                let (resource, capabilities) = discovery
                    .resolve_gvk(&gvk)
                    .with_context(|| format!("{gvk:?} is not served"))?;
                // A namespaced object is created in its namespace (as kubectl does; the
                // cluster-wide path is refused for it, by the real server too).
                let api: kube::Api<kube::core::DynamicObject> = match capabilities.scope {
                    kube::discovery::Scope::Namespaced => kube::Api::namespaced_with(
                        client.clone(),
                        object.metadata.namespace.as_deref().unwrap_or("default"),
                        &resource,
                    ),
                    kube::discovery::Scope::Cluster => {
                        kube::Api::all_with(client.clone(), &resource)
                    }
                };
                api.create(&Default::default(), &object)
                    .await
                    .with_context(|| format!("creating {gvk:?} from {}", file.display()))?;
            }
        }
        Ok(())
    }

    /// Applies the manifests at `path` (a file or a directory) as the admin with kubectl of
    /// the pinned release.
    pub fn kubectl_apply(&self, path: &Path) -> anyhow::Result<()> {
        let path = path.to_str().context("path is not UTF-8")?;
        let kubeconfig = tempfile::NamedTempFile::new()?;
        self.write_admin_kubeconfig(kubeconfig.path())?;
        crate::apiserver::run_kubectl(kubeconfig.path(), &["apply", "-f", path])?;
        Ok(())
    }

    /// What every agent needs from the cluster: the CRDs and the agent's shipped RBAC and
    /// admission policy (`packaging/kubernetes/agent`), so agents run with those only.
    pub async fn install_agent_objects(&self) -> anyhow::Result<()> {
        self.apply_crd_dir(&packaging("crds")).await?;
        self.apply_manifests(&packaging("agent")).await
    }
}

/// The committed manifests: `packaging/kubernetes/<relative>`.
pub fn packaging(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(relative)
}
