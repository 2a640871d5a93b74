//! The controller's one error type. Each variant has a stable label for metrics.

/// Everything a reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the Kubernetes API failed.
    #[error("Kubernetes API call failed while {action}: {source}")]
    Kube {
        /// What the controller was doing.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// An object came without a field the API always sets (a name, a uid).
    #[error("{kind} without {field}")]
    MissingField {
        /// The object's kind.
        kind: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// The rollout's node selector cannot be turned into a selector.
    #[error("node selector: {0}")]
    Selector(String),
    /// A drain pass, a cordon or an uncordon failed.
    #[error(transparent)]
    Drain(#[from] inplace_drain::DrainError),
    /// A deleted rollout's teardown waits for these nodes' activations to finish; its
    /// finalizer stays until they do. Not a failure: `error_policy` retries it quietly.
    #[error("the teardown waits for the activations of nodes {nodes:?}")]
    TeardownWaiting {
        /// The nodes still activating.
        nodes: Vec<String>,
    },
    /// A value could not be turned into JSON (cannot happen with the API types).
    #[error("serializing {what}: {source}")]
    Serialize {
        /// What.
        what: &'static str,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// A short, stable label for the `error` label of the error metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => kube_label(source),
            Error::Drain(error) => kube_label(error.kube_error()),
            Error::MissingField { .. } => "missing_field",
            Error::Selector(_) => "selector",
            Error::TeardownWaiting { .. } => "teardown_waiting",
            Error::Serialize { .. } => "serialize",
        }
    }

    /// Wraps a client error with what the controller was doing.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }
}

fn kube_label(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(status) if status.is_conflict() => "conflict",
        kube::Error::Api(status) if status.is_not_found() => "not_found",
        kube::Error::Api(_) => "api",
        _ => "transport",
    }
}

/// The controller's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
