//! The extension's errors. Each has a stable [`Error::kind`] (logs, metrics) and a message
//! that Cluster API shows on the Machine.

use std::path::PathBuf;

/// Why a hook could not be answered with what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration is out of range (the message names the setting).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The request lacks something the hook needs (a label, the nodeRef, the version).
    #[error("{0}")]
    BadRequest(String),
    /// The request names a Machine that Cluster API is not updating in place, or asks for
    /// something else than the stored Machine wants (the message says which).
    #[error("{0}")]
    NotUpdatingInPlace(String),
    /// No usable NodeRelease for the requested version.
    #[error("{0}")]
    NoRelease(String),
    /// The `<cluster>-kubeconfig` Secret is missing or unusable.
    #[error("{0}")]
    Kubeconfig(String),
    /// A call to the management cluster failed.
    #[error("{action} in the management cluster: {source}")]
    Management {
        /// What was being done.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A call to the workload cluster failed.
    #[error("{action} in workload cluster {cluster}: {source}")]
    Workload {
        /// `namespace/name` of the Cluster.
        cluster: String,
        /// What was being done.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The node named by the Machine's nodeRef does not exist in the workload cluster.
    #[error(
        "node {node} (the Machine's status.nodeRef) does not exist in workload cluster {cluster}"
    )]
    NodeNotFound {
        /// `namespace/name` of the Cluster.
        cluster: String,
        /// The node name.
        node: String,
    },
    /// Draining the node failed.
    #[error("draining node {node}: {message}")]
    Drain {
        /// The node.
        node: String,
        /// What went wrong.
        message: String,
    },
    /// The TLS certificate or key could not be loaded.
    #[error("loading TLS {what} from {path}: {message}")]
    Tls {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The server could not listen.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A stable machine-readable name for the error.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Config(_) => "Config",
            Error::BadRequest(_) => "BadRequest",
            Error::NoRelease(_) => "NoRelease",
            Error::NotUpdatingInPlace(_) => "NotUpdatingInPlace",
            Error::Kubeconfig(_) => "Kubeconfig",
            Error::Management { .. } => "ManagementApi",
            Error::Workload { .. } => "WorkloadApi",
            Error::NodeNotFound { .. } => "NodeNotFound",
            Error::Drain { .. } => "DrainFailed",
            Error::Tls { .. } => "Tls",
            Error::Listen { .. } => "Listen",
        }
    }

    /// Whether asking again later may succeed without touching the Machine: API outages,
    /// timeouts, conflicts, throttling, server errors and refused credentials are
    /// transient; a missing Secret, label, node or release is not.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Management { source, .. } | Error::Workload { source, .. } => {
                transient_kube_error(source)
            }
            _ => false,
        }
    }
}

fn transient_kube_error(error: &kube::Error) -> bool {
    match error {
        // 401/403: credentials being rotated or RBAC being fixed; asking again may work,
        // and failing the Machine would not help.
        kube::Error::Api(status) => {
            matches!(status.code, 401 | 403 | 409 | 429) || status.code >= 500
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}
