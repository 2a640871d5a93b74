//! Reaching workload clusters: Cluster API keeps an admin kubeconfig for every Cluster in
//! the Secret `<cluster>-kubeconfig` (key `value`) in the Cluster's namespace. Clients are
//! cached per cluster and rebuilt when the Secret's `resourceVersion` changes (Cluster API
//! rotates the credentials).

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::error::Error;

/// The Secret key that holds the kubeconfig.
pub const KUBECONFIG_KEY: &str = "value";

/// Gives a client for a workload cluster.
#[async_trait]
pub trait WorkloadClusters: Send + Sync {
    /// A client for Cluster `name` in `namespace`.
    async fn client(&self, namespace: &str, name: &str) -> Result<kube::Client, Error>;
}

/// Workload clients from `<cluster>-kubeconfig` Secrets in the management cluster.
pub struct SecretKubeconfigs {
    management: kube::Client,
    cache: Mutex<HashMap<(String, String), (String, kube::Client)>>,
}

impl SecretKubeconfigs {
    /// Reads Secrets through `management`.
    pub fn new(management: kube::Client) -> Self {
        SecretKubeconfigs {
            management,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// How many clusters have a cached client (for tests and metrics).
    pub fn cached(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }
}

#[async_trait]
impl WorkloadClusters for SecretKubeconfigs {
    async fn client(&self, namespace: &str, name: &str) -> Result<kube::Client, Error> {
        let secret_name = format!("{name}-kubeconfig");
        let secrets: Api<Secret> = Api::namespaced(self.management.clone(), namespace);
        let secret = secrets
            .get_opt(&secret_name)
            .await
            .map_err(|source| Error::Management {
                action: format!("reading Secret {namespace}/{secret_name}"),
                source,
            })?
            .ok_or_else(|| {
                // A deleted Cluster: forget its client.
                if let Ok(mut cache) = self.cache.lock() {
                    cache.remove(&(namespace.to_owned(), name.to_owned()));
                }
                Error::Kubeconfig(format!(
                    "Secret {namespace}/{secret_name} (the kubeconfig of Cluster {name}) does not exist in the management cluster"
                ))
            })?;
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let key = (namespace.to_owned(), name.to_owned());
        if let Ok(cache) = self.cache.lock()
            && let Some((cached_version, client)) = cache.get(&key)
            && *cached_version == version
        {
            return Ok(client.clone());
        }
        let client = client_from_secret(&secret, namespace, &secret_name).await?;
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(key, (version, client.clone()));
        }
        Ok(client)
    }
}

/// A client from the kubeconfig in `secret`'s `value` key.
pub async fn client_from_secret(
    secret: &Secret,
    namespace: &str,
    secret_name: &str,
) -> Result<kube::Client, Error> {
    let bad = |why: String| Error::Kubeconfig(format!("Secret {namespace}/{secret_name}: {why}"));
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(KUBECONFIG_KEY))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| bad(format!("has no key {KUBECONFIG_KEY:?}")))?;
    let text = String::from_utf8(bytes).map_err(|_| bad("kubeconfig is not UTF-8".into()))?;
    let kubeconfig =
        Kubeconfig::from_yaml(&text).map_err(|e| bad(format!("kubeconfig does not parse: {e}")))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(format!("kubeconfig is not usable: {e}")))?;
    kube::Client::try_from(config).map_err(|e| bad(format!("cannot build a client: {e}")))
}
