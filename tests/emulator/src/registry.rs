//! The kinds the emulator serves: a fixed set of built-ins plus every established CRD.

use serde_json::{Value, json};

/// One served resource (one group/version/plural).
#[derive(Debug, Clone)]
pub struct ResourceType {
    /// API group, empty for the core group.
    pub group: String,
    /// The served version.
    pub version: String,
    /// Every served version (CRDs may serve several; objects are stored once).
    pub versions: Vec<String>,
    /// Kind, for example `Node`.
    pub kind: String,
    /// Plural resource name, for example `nodes`.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// Categories for kubectl (`kubectl get inplace`).
    pub categories: Vec<String>,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Whether `/status` is a subresource (spec writes ignore status and the reverse).
    pub status_subresource: bool,
    /// Whether this is a custom resource (schema, pruning, CEL).
    pub custom: bool,
    /// The structural schema (`openAPIV3Schema`), for custom resources.
    pub schema: Option<Value>,
    /// `additionalPrinterColumns`.
    pub printer_columns: Vec<Value>,
    /// Whether metadata.generation is maintained.
    pub has_generation: bool,
}

impl ResourceType {
    /// `group/version` or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn builtin(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
        status: bool,
    ) -> Self {
        ResourceType {
            group: group.into(),
            version: version.into(),
            versions: vec![version.into()],
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            short_names: Vec::new(),
            categories: Vec::new(),
            namespaced,
            status_subresource: status,
            custom: false,
            schema: None,
            printer_columns: Vec::new(),
            has_generation: false,
        }
    }

    fn short(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    fn generation(mut self) -> Self {
        self.has_generation = true;
        self
    }

    /// The resource type a CustomResourceDefinition object defines, for its storage version.
    pub fn from_crd(crd: &Value) -> Option<Self> {
        let spec = crd.get("spec")?;
        let group = spec.get("group")?.as_str()?.to_string();
        let names = spec.get("names")?;
        let kind = names.get("kind")?.as_str()?.to_string();
        let plural = names.get("plural")?.as_str()?.to_string();
        let singular = names
            .get("singular")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_lowercase());
        let strings = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let versions = spec.get("versions")?.as_array()?;
        let served: Vec<&Value> = versions
            .iter()
            .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(true))
            .collect();
        let storage = versions
            .iter()
            .find(|v| v.get("storage").and_then(Value::as_bool).unwrap_or(false))
            .or_else(|| served.first().copied())?;
        Some(ResourceType {
            group,
            version: storage.get("name")?.as_str()?.to_string(),
            versions: served
                .iter()
                .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
                .collect(),
            kind,
            plural,
            singular,
            short_names: strings(names.get("shortNames")),
            categories: strings(names.get("categories")),
            namespaced: spec.get("scope").and_then(Value::as_str) == Some("Namespaced"),
            status_subresource: storage.pointer("/subresources/status").is_some(),
            custom: true,
            schema: storage.pointer("/schema/openAPIV3Schema").cloned(),
            printer_columns: storage
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            has_generation: true,
        })
    }

    /// The verbs discovery advertises.
    pub fn verbs(&self) -> Value {
        json!([
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ])
    }
}

/// The built-in kinds the product touches.
pub fn builtins() -> Vec<ResourceType> {
    vec![
        ResourceType::builtin("", "v1", "Namespace", "namespaces", false, true).short(&["ns"]),
        ResourceType::builtin("", "v1", "Node", "nodes", false, true).short(&["no"]),
        ResourceType::builtin("", "v1", "Pod", "pods", true, true).short(&["po"]),
        ResourceType::builtin("", "v1", "Secret", "secrets", true, false),
        ResourceType::builtin("", "v1", "ConfigMap", "configmaps", true, false).short(&["cm"]),
        ResourceType::builtin("", "v1", "ServiceAccount", "serviceaccounts", true, false)
            .short(&["sa"]),
        ResourceType::builtin("", "v1", "Event", "events", true, false).short(&["ev"]),
        ResourceType::builtin("events.k8s.io", "v1", "Event", "events", true, false).short(&["ev"]),
        ResourceType::builtin("coordination.k8s.io", "v1", "Lease", "leases", true, false),
        ResourceType::builtin(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
            true,
        )
        .short(&["pdb"])
        .generation(),
        ResourceType::builtin("apps", "v1", "Deployment", "deployments", true, true)
            .short(&["deploy"])
            .generation(),
        ResourceType::builtin(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
            true,
        )
        .short(&["crd", "crds"])
        .generation(),
        ResourceType::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
            false,
        ),
        ResourceType::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            false,
        ),
        ResourceType::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "roles",
            true,
            false,
        ),
        ResourceType::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
            false,
        ),
        ResourceType::builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            false,
            true,
        )
        .generation(),
        ResourceType::builtin(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            false,
            false,
        )
        .generation(),
    ]
}
