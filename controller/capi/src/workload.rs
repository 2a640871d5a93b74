//! Reaching workload clusters: Cluster API keeps an admin kubeconfig for every Cluster in
//! the Secret `<cluster>-kubeconfig` (key `value`) in the Cluster's namespace. Clients are
//! cached per cluster and rebuilt when the Secret's `resourceVersion` changes (Cluster API
//! rotates the credentials).

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::KubeConfigOptions;

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

/// A client from the kubeconfig in `secret`'s `value` key, when its credentials are inline
/// (see [`crate::kubeconfig`]).
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
    let kubeconfig = crate::kubeconfig::parse_inline(&text).map_err(bad)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(format!("kubeconfig is not usable: {e}")))?;
    kube::Client::try_from(config).map_err(|e| bad(format!("cannot build a client: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    fn secret_with(kubeconfig: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c1-kubeconfig", "namespace": "tenant-a"},
            "stringData": {KUBECONFIG_KEY: kubeconfig},
        }))
        .unwrap()
    }

    /// A kubeconfig whose user reads its token from a file the extension's pod holds (its
    /// own ServiceAccount token) and whose server is someone else's: the file is never
    /// read and the server never reached; the refusal names the field.
    #[tokio::test]
    async fn a_kubeconfig_that_names_a_token_file_sends_nothing_anywhere() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "the-extension-s-own-token").unwrap();
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: x\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: x\n  context:\n    cluster: x\n    user: x\ncurrent-context: x\nusers:\n- name: x\n  user:\n    tokenFile: {}\n",
            token_file.display()
        );
        let built =
            client_from_secret(&secret_with(&kubeconfig), "tenant-a", "c1-kubeconfig").await;
        if let Ok(client) = &built {
            // What the hooks do next with a workload client.
            let plans = Api::<inplace_proto::NodeUpdatePlan>::all(client.clone());
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                plans.list_metadata(&Default::default()),
            )
            .await;
        }
        if let Ok(Ok((mut stream, _))) =
            tokio::time::timeout(Duration::from_millis(200), listener.accept()).await
        {
            let mut request = vec![0; 4096];
            let n = stream.read(&mut request).await.unwrap_or(0);
            panic!(
                "the extension connected to the kubeconfig's server and sent:\n{}",
                String::from_utf8_lossy(&request[..n])
            );
        }
        let error = built.err().expect("the kubeconfig is refused");
        assert_eq!(error.kind(), "Kubeconfig");
        let text = error.to_string();
        assert!(
            text.contains("Secret tenant-a/c1-kubeconfig")
                && text.contains("users[0].user.tokenFile"),
            "{text}"
        );
    }
}
