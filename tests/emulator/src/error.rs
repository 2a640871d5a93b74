//! API errors rendered as `meta.k8s.io/v1` `Status` objects, the way kube-apiserver does.

use serde_json::{Value, json};

/// One failure cause inside a `Status`' details.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// The machine-readable reason, for example `FieldValueInvalid`.
    pub reason: String,
    /// A human message.
    pub message: String,
    /// The field path, for example `spec.nodeName`.
    pub field: String,
}

/// An error answered to a client as a `Status` object.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// The HTTP status code.
    pub code: u16,
    /// The `StatusReason`, for example `NotFound` or `Conflict`.
    pub reason: String,
    /// A human message.
    pub message: String,
    /// `details.name`, `details.group`, `details.kind` when known.
    pub details: Option<(String, String, String)>,
    /// `details.causes`.
    pub causes: Vec<Cause>,
    /// Seconds for a `Retry-After` header and `details.retryAfterSeconds`.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// A bare error with a code, reason and message.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
            causes: Vec::new(),
            retry_after: None,
        }
    }

    /// Attach `details` (name, group, kind).
    pub fn with_details(mut self, name: &str, group: &str, kind: &str) -> Self {
        self.details = Some((name.to_string(), group.to_string(), kind.to_string()));
        self
    }

    /// `404 NotFound` for `<resource>.<group> "<name>" not found`.
    pub fn not_found(resource: &str, group: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(resource, group)),
        )
        .with_details(name, group, resource)
    }

    /// `409 AlreadyExists`.
    pub fn already_exists(resource: &str, group: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(resource, group)),
        )
        .with_details(name, group, resource)
    }

    /// `409 Conflict` for an update against a stale resourceVersion.
    pub fn conflict(resource: &str, group: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(resource, group)
            ),
        )
        .with_details(name, group, resource)
    }

    /// `410 Gone` for a too-old resourceVersion.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// `400 BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// `405 MethodNotAllowed`.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// `422 Invalid` with one cause per field error.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let list: Vec<String> = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect();
        let summary = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let kind_group = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{kind_group} \"{name}\" is invalid: {summary}"),
        )
        .with_details(name, group, kind);
        e.causes = causes;
        e
    }

    /// `403 Forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// The `Status` object body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some((name, group, kind)) = &self.details {
            details.insert("name".into(), json!(name));
            if !group.is_empty() {
                details.insert("group".into(), json!(group));
            }
            details.insert("kind".into(), json!(kind));
        }
        if !self.causes.is_empty() {
            let causes: Vec<Value> = self
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(secs) = self.retry_after {
            details.insert("retryAfterSeconds".into(), json!(secs));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

/// `nodes` or `nodeupdateplans.inplace.dev`.
pub fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// A field error cause.
pub fn cause(reason: &str, field: &str, message: impl Into<String>) -> Cause {
    Cause {
        reason: reason.to_string(),
        message: message.into(),
        field: field.to_string(),
    }
}
