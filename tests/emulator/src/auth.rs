//! Authentication (bearer tokens), RBAC authorization over the stored Role/ClusterRole/
//! (Cluster)RoleBinding objects, and the admission checks that restrict node identities.

use crate::cel_rules::{Outcome, eval};
use crate::error::ApiError;
use crate::store::Inner;
use serde_json::{Value, json};

/// A user the emulator knows, by bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The bearer token.
    pub token: String,
    /// The user name, for example `system:node:worker-1`.
    pub name: String,
    /// Groups, for example `system:nodes`.
    pub groups: Vec<String>,
}

impl User {
    /// The cluster admin (group `system:masters`), token `admin-token`.
    pub fn admin() -> Self {
        User {
            token: "admin-token".into(),
            name: "kubernetes-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }

    /// A kubelet identity `system:node:<name>` in group `system:nodes`, token `node-<name>`.
    pub fn node(name: &str) -> Self {
        User {
            token: format!("node-{name}"),
            name: format!("system:node:{name}"),
            groups: vec!["system:nodes".into(), "system:authenticated".into()],
        }
    }

    /// Any user with a token.
    pub fn new(token: &str, name: &str, groups: &[&str]) -> Self {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        User {
            token: token.into(),
            name: name.into(),
            groups,
        }
    }

    /// Whether this is a cluster admin.
    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }

    /// The node name, for `system:node:<name>` users in `system:nodes`.
    pub fn node_name(&self) -> Option<&str> {
        if self.groups.iter().any(|g| g == "system:nodes") {
            self.name.strip_prefix("system:node:")
        } else {
            None
        }
    }

    /// `request.userInfo` for admission.
    pub fn user_info(&self) -> Value {
        json!({"username": self.name, "groups": self.groups})
    }
}

/// How requests are authorized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthzMode {
    /// Every authenticated user may do everything (NodeRestriction and admission policies still apply).
    #[default]
    AlwaysAllow,
    /// RBAC over the stored roles and bindings; `system:masters` may do everything.
    Rbac,
}

/// What a request wants to do.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: &'a str,
    /// API group.
    pub group: &'a str,
    /// Plural resource.
    pub resource: &'a str,
    /// Subresource or empty.
    pub subresource: &'a str,
    /// Namespace or empty.
    pub namespace: &'a str,
    /// Name or empty.
    pub name: &'a str,
}

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn rule_allows(rule: &Value, a: &Attributes<'_>) -> bool {
    let verbs = strs(rule.get("verbs"));
    let groups = strs(rule.get("apiGroups"));
    let resources = strs(rule.get("resources"));
    let names = strs(rule.get("resourceNames"));
    let full = if a.subresource.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let sub_wild = format!("*/{}", a.subresource);
    let verb_ok = verbs.iter().any(|v| *v == "*" || *v == a.verb);
    let group_ok = groups.iter().any(|g| *g == "*" || *g == a.group);
    let res_ok = resources
        .iter()
        .any(|r| *r == "*" || *r == full || (!a.subresource.is_empty() && *r == sub_wild));
    let name_ok = names.is_empty() || (!a.name.is_empty() && names.contains(&a.name));
    verb_ok && group_ok && res_ok && name_ok
}

fn subject_matches(s: &Value, user: &User, binding_ns: &str) -> bool {
    let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
    match s.get("kind").and_then(Value::as_str) {
        Some("User") => name == user.name,
        Some("Group") => user.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = s
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or(binding_ns);
            user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn role_rules(inner: &Inner, role_ref: &Value, ns: &str) -> Vec<Value> {
    let name = role_ref
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (plural, ns) = match role_ref.get("kind").and_then(Value::as_str) {
        Some("Role") => ("roles", ns),
        _ => ("clusterroles", ""),
    };
    inner
        .tables
        .get(&("rbac.authorization.k8s.io".to_string(), plural.to_string()))
        .and_then(|t| t.objects.get(&(ns.to_string(), name.to_string())))
        .and_then(|r| r.get("rules").and_then(Value::as_array).cloned())
        .unwrap_or_default()
}

/// Decide a request under `mode`; the error is the 403 a real server sends.
pub fn authorize(
    inner: &Inner,
    mode: AuthzMode,
    user: &User,
    a: &Attributes<'_>,
) -> Result<(), ApiError> {
    if mode == AuthzMode::AlwaysAllow || user.is_admin() {
        return Ok(());
    }
    let rbac = "rbac.authorization.k8s.io".to_string();
    let mut allowed = false;
    if let Some(t) = inner
        .tables
        .get(&(rbac.clone(), "clusterrolebindings".into()))
    {
        for b in t.objects.values() {
            let subjects = b
                .get("subjects")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if subjects.iter().any(|s| subject_matches(s, user, ""))
                && role_rules(inner, b.get("roleRef").unwrap_or(&Value::Null), "")
                    .iter()
                    .any(|r| rule_allows(r, a))
            {
                allowed = true;
                break;
            }
        }
    }
    if !allowed
        && !a.namespace.is_empty()
        && let Some(t) = inner.tables.get(&(rbac, "rolebindings".into()))
    {
        for ((ns, _), b) in &t.objects {
            if ns != a.namespace {
                continue;
            }
            let subjects = b
                .get("subjects")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if subjects.iter().any(|s| subject_matches(s, user, ns))
                && role_rules(inner, b.get("roleRef").unwrap_or(&Value::Null), ns)
                    .iter()
                    .any(|r| rule_allows(r, a))
            {
                allowed = true;
                break;
            }
        }
    }
    if allowed {
        return Ok(());
    }
    let res = if a.subresource.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let qual = crate::error::qualified(a.resource, a.group);
    let what = if a.name.is_empty() {
        qual
    } else {
        format!("{qual} \"{}\"", a.name)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    Err(ApiError::forbidden(format!(
        "{what} is forbidden: User \"{}\" cannot {} resource \"{res}\" in API group \"{}\" {scope}",
        user.name, a.verb, a.group
    ))
    .with_details(a.name, a.group, a.resource))
}

/// The NodeRestriction admission plugin, for the kinds the product touches: a node may only
/// create/modify its own Node object and pods bound to it, and its own Lease in kube-node-lease.
pub fn node_restriction(
    user: &User,
    a: &Attributes<'_>,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let Some(node) = user.node_name() else {
        return Ok(());
    };
    if !matches!(a.verb, "create" | "update" | "patch" | "delete") {
        return Ok(());
    }
    let deny =
        |msg: String| Err(ApiError::forbidden(msg).with_details(a.name, a.group, a.resource));
    match (a.group, a.resource) {
        ("", "nodes") => {
            let target = if a.name.is_empty() {
                object
                    .and_then(|o| o.pointer("/metadata/name"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            } else {
                a.name
            };
            if target != node {
                return deny(format!(
                    "nodes \"{target}\" is forbidden: node \"{node}\" is not allowed to modify node \"{target}\""
                ));
            }
            if a.verb == "delete" {
                return deny(format!(
                    "nodes \"{target}\" is forbidden: node \"{node}\" is not allowed to delete nodes"
                ));
            }
        }
        ("", "pods") => {
            let bound = object
                .or(old)
                .and_then(|o| o.pointer("/spec/nodeName"))
                .and_then(Value::as_str);
            if a.subresource != "eviction" && bound != Some(node) {
                return deny(format!(
                    "pods \"{}\" is forbidden: node \"{node}\" can only modify pods with spec.nodeName set to itself",
                    a.name
                ));
            }
        }
        ("coordination.k8s.io", "leases")
            if a.namespace != "kube-node-lease" || (a.name != node && !a.name.is_empty()) =>
        {
            return deny(format!(
                "leases.coordination.k8s.io \"{}\" is forbidden: can only access node lease with the same name as the requesting node",
                a.name
            ));
        }
        _ => {}
    }
    Ok(())
}

/// Evaluate stored ValidatingAdmissionPolicies (with their bindings) for a write.
pub fn validating_policies(
    inner: &Inner,
    user: &User,
    a: &Attributes<'_>,
    operation: &str,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let group = "admissionregistration.k8s.io".to_string();
    let Some(bindings) = inner
        .tables
        .get(&(group.clone(), "validatingadmissionpolicybindings".into()))
    else {
        return Ok(());
    };
    let Some(policies) = inner
        .tables
        .get(&(group, "validatingadmissionpolicies".into()))
    else {
        return Ok(());
    };
    let request = json!({
        "operation": operation, "userInfo": user.user_info(), "name": a.name, "namespace": a.namespace,
        "resource": {"group": a.group, "resource": a.resource}, "subResource": a.subresource,
    });
    let null = Value::Null;
    for b in bindings.objects.values() {
        let pname = b
            .pointer("/spec/policyName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Some(policy) = policies.objects.get(&(String::new(), pname.to_string())) else {
            continue;
        };
        let rules = policy
            .pointer("/spec/matchConstraints/resourceRules")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let full = if a.subresource.is_empty() {
            a.resource.to_string()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let matched = rules.iter().any(|r| {
            let ops = strs(r.get("operations"));
            let groups = strs(r.get("apiGroups"));
            let resources = strs(r.get("resources"));
            ops.iter().any(|o| *o == "*" || *o == operation)
                && groups.iter().any(|g| *g == "*" || *g == a.group)
                && resources.iter().any(|x| *x == "*" || *x == full)
        });
        if !matched {
            continue;
        }
        let vars: Vec<(&str, &Value)> = vec![
            ("object", object.unwrap_or(&null)),
            ("oldObject", old.unwrap_or(&null)),
            ("request", &request),
        ];
        let conditions = policy
            .pointer("/spec/matchConditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let applies = conditions.iter().all(|c| {
            let expr = c
                .get("expression")
                .and_then(Value::as_str)
                .unwrap_or("true");
            !matches!(eval(expr, &vars), Outcome::Value(cel::Value::Bool(false)))
        });
        if !applies {
            continue;
        }
        for v in policy
            .pointer("/spec/validations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let expr = v
                .get("expression")
                .and_then(Value::as_str)
                .unwrap_or("true");
            let failed = match eval(expr, &vars) {
                Outcome::Value(cel::Value::Bool(true)) | Outcome::Unsupported => None,
                Outcome::Value(_) => Some(
                    v.get("message")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("failed expression: {expr}")),
                ),
                Outcome::Error(e) => Some(format!("expression '{expr}' resulted in error: {e}")),
            };
            if let Some(msg) = failed {
                let bname = b
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let qual = crate::error::qualified(a.resource, a.group);
                let code = match v.get("reason").and_then(Value::as_str) {
                    Some("Invalid") => 422,
                    _ => 403,
                };
                let reason = if code == 422 { "Invalid" } else { "Forbidden" };
                return Err(ApiError::new(
                    code,
                    reason,
                    format!(
                        "{qual} \"{}\" is forbidden: ValidatingAdmissionPolicy '{pname}' with binding '{bname}' denied request: {msg}",
                        a.name
                    ),
                )
                .with_details(a.name, a.group, a.resource));
            }
        }
    }
    Ok(())
}
