//! The API client, from the kubelet's kubeconfig (the agent is then `system:node:<name>`)
//! or from a token file.

use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::settings::KubeAuth;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// The client could not be built.
    #[error("kube client: {0}")]
    Client(#[from] kube::Error),
}

/// Builds the client once.
pub async fn client(auth: &KubeAuth) -> Result<kube::Client, ClientError> {
    crate::fetch::install_crypto_provider();
    let kubeconfig = match auth {
        KubeAuth::Kubeconfig(path) => Kubeconfig::read_from(path)
            .map_err(|e| ClientError::Kubeconfig(format!("{}: {e}", path.display())))?,
        KubeAuth::TokenFile {
            server,
            token_file,
            ca_file,
        } => {
            let mut cluster = serde_json::json!({ "server": server });
            if let Some(ca) = ca_file {
                cluster["certificate-authority"] = ca.display().to_string().into();
            }
            let value = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "api", "cluster": cluster}],
                "users": [{"name": "agent", "user": {"tokenFile": token_file.display().to_string()}}],
                "contexts": [{"name": "agent", "context": {"cluster": "api", "user": "agent"}}],
                "current-context": "agent",
            });
            serde_json::from_value(value).map_err(|e| ClientError::Kubeconfig(e.to_string()))?
        }
    };
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| ClientError::Kubeconfig(e.to_string()))?;
    // A plain-http server (tests) needs no trust roots; without this, kube would ask the
    // platform verifier for the system's CA store, which a minimal host may not have.
    if config.cluster_url.scheme() == Some(&http::uri::Scheme::HTTP) && config.root_cert.is_none() {
        config.root_cert = Some(Vec::new());
    }
    Ok(kube::Client::try_from(config)?)
}
