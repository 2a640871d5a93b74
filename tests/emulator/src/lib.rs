//! An in-process Kubernetes API server emulator for inplace's tests, demo and benchmarks.
//!
//! It speaks the real wire protocol over plain HTTP on loopback, so the real `kube` client and
//! the real `kubectl` talk to it. Start it with [`Emulator::start`], get clients with
//! [`Handle::client`] / [`Handle::client_as`], write a kubeconfig with
//! [`Handle::write_kubeconfig`], and break it on purpose with [`Handle::faults`]. Every known
//! difference from kube-apiserver is listed in `docs/development/api-emulator.md`.

// ApiError carries a full Status (details, causes); errors are the rare path, boxing buys nothing.
#![allow(clippy::result_large_err)]

pub mod api;
pub mod auth;
pub mod cel_rules;
pub mod discovery;
pub mod error;
pub mod faults;
pub mod managed;
pub mod registry;
pub mod schema;
pub mod selectors;
pub mod server;
pub mod store;
pub mod table;

pub use auth::{AuthzMode, User};
pub use faults::{Faults, OutageKind};
pub use store::Store;

use anyhow::Context as _;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How to start an emulator.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    /// Where to listen (default `127.0.0.1:0`, an ephemeral port).
    pub listen: SocketAddr,
    /// Events kept per resource for watches from an older resourceVersion (older: 410 Gone).
    pub history_window: usize,
    /// Authorization mode (default: every authenticated user may do everything).
    pub authz: AuthzMode,
    /// Users besides the admin (tokens).
    pub users: Vec<User>,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Who a request without an Authorization header is. kubectl sends no credentials to an
    /// `http://` server, so this defaults to the admin; None answers such requests with 401.
    pub anonymous: Option<User>,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        EmulatorConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            history_window: 10_000,
            authz: AuthzMode::AlwaysAllow,
            users: Vec::new(),
            bookmark_interval: Duration::from_secs(30),
            anonymous: Some(User::admin()),
        }
    }
}

/// Starts emulators.
pub struct Emulator;

impl Emulator {
    /// Bind and serve in the background of the current tokio runtime.
    pub async fn start(config: EmulatorConfig) -> anyhow::Result<Handle> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let addr = listener.local_addr()?;
        let mut users = HashMap::new();
        for u in std::iter::once(User::admin()).chain(config.users) {
            users.insert(u.token.clone(), u);
        }
        let state = Arc::new(api::State {
            store: Store::new(config.history_window),
            faults: Arc::new(Faults::default()),
            users: std::sync::RwLock::new(users),
            authz: config.authz,
            bookmark_interval: config.bookmark_interval,
            anonymous: config.anonymous,
        });
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(server::serve(Some(listener), addr, state.clone(), rx));
        Ok(Handle {
            state,
            addr,
            shutdown: tx,
            task: Some(task),
        })
    }
}

/// A running emulator. Dropping it stops the server.
pub struct Handle {
    state: Arc<api::State>,
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Handle {
    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Direct access to storage, for inspection.
    pub fn store(&self) -> &Store {
        &self.state.store
    }

    /// Fault switches.
    pub fn faults(&self) -> &Faults {
        &self.state.faults
    }

    /// Make a user known (by its token).
    pub fn add_user(&self, user: User) {
        self.state
            .users
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(user.token.clone(), user);
    }

    /// A kubeconfig YAML for `user` (registered if new), with namespace `default`.
    pub fn kubeconfig_yaml(&self, user: &User) -> String {
        self.add_user(user.clone());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {url}\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: {name:?}\n    namespace: default\ncurrent-context: emulator\nusers:\n- name: {name:?}\n  user:\n    token: {token:?}\n",
            url = self.url(),
            name = user.name,
            token = user.token
        )
    }

    /// Write a kubeconfig for `user` to `path`.
    pub fn write_kubeconfig(&self, path: &Path, user: &User) -> anyhow::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml(user))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// A kube client acting as `user` (registered if new).
    pub async fn client_as(&self, user: &User) -> anyhow::Result<kube::Client> {
        Ok(kube::Client::try_from(self.config_as(user).await?)?)
    }

    /// A kube client configuration acting as `user` (registered if new). kube's default client
    /// retries 429/503/504 answers (up to 15 times, honouring Retry-After); set
    /// `default_retry = false` to see them.
    pub async fn config_as(&self, user: &User) -> anyhow::Result<kube::Config> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml(user))?;
        Ok(
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?,
        )
    }

    /// A kube client acting as the admin that does not retry 429/503/504 (to observe faults).
    pub async fn client_without_retries(&self) -> anyhow::Result<kube::Client> {
        let mut config = self.config_as(&User::admin()).await?;
        config.default_retry = false;
        Ok(kube::Client::try_from(config)?)
    }

    /// A kube client acting as the cluster admin.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        self.client_as(&User::admin()).await
    }

    /// A kube client acting as the kubelet of `node` (`system:node:<node>`, group `system:nodes`).
    pub async fn client_as_node(&self, node: &str) -> anyhow::Result<kube::Client> {
        self.client_as(&User::node(node)).await
    }

    /// Create (or replace) CustomResourceDefinitions from YAML documents, through the API path
    /// a real client would use, as the admin.
    pub async fn apply_crd_yaml(&self, yaml: &str) -> anyhow::Result<()> {
        apply_crds(&self.client().await?, yaml, FIELD_MANAGER).await?;
        Ok(())
    }

    /// Apply every `*.yaml`/`*.yml` CRD file in a directory.
    pub async fn apply_crd_dir(&self, dir: &Path) -> anyhow::Result<()> {
        apply_crd_files(&self.client().await?, dir, FIELD_MANAGER).await?;
        Ok(())
    }

    /// Stop serving (also done on drop).
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// The field manager of what the emulator's own helpers apply.
const FIELD_MANAGER: &str = "inplace-api-emulator";

/// Server-side applies (forced) the CustomResourceDefinitions in the YAML documents `yaml` as
/// `field_manager`, through `client` (the emulator's or a real server's); returns their names.
pub async fn apply_crds(
    client: &kube::Client,
    yaml: &str,
    field_manager: &str,
) -> anyhow::Result<Vec<String>> {
    let api: kube::Api<kube::core::DynamicObject> = kube::Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::erase::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>(&()),
    );
    let mut names = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(doc)?;
        if v.is_null() {
            continue;
        }
        let name = v
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .context("CRD without a name")?
            .to_string();
        let params = kube::api::PatchParams::apply(field_manager).force();
        api.patch(&name, &params, &kube::api::Patch::Apply(&v))
            .await
            .with_context(|| format!("applying CRD {name}"))?;
        names.push(name);
    }
    Ok(names)
}

/// [`apply_crds`] of the YAML file `path`, or of every `*.yaml`/`*.yml` file in the directory
/// `path`, in name order (as `kubectl apply -f PATH` takes either).
pub async fn apply_crd_files(
    client: &kube::Client,
    path: &Path,
    field_manager: &str,
) -> anyhow::Result<Vec<String>> {
    let files = if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut names = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        names.extend(apply_crds(client, &text, field_manager).await?);
    }
    Ok(names)
}
