//! Discovery (`/api`, `/apis`, `/apis/<g>/<v>`), `/version` and OpenAPI v2/v3 documents, built
//! from the served types (so CRDs appear as soon as they are created).

use crate::registry::ResourceType;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1", "minor": "34", "gitVersion": "v1.34.0-inplace-emulator",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// Group name → versions (preferred first).
fn groups(types: &[Arc<ResourceType>]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in types {
        let vs = out.entry(t.group.clone()).or_default();
        for v in std::iter::once(&t.version).chain(t.versions.iter()) {
            if !vs.contains(v) {
                vs.push(v.clone());
            }
        }
    }
    out
}

/// `/api`.
pub fn core_versions(addr: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}]})
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// `/apis`.
pub fn group_list(types: &[Arc<ResourceType>]) -> Value {
    let gs: Vec<Value> = groups(types)
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_json(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

/// `/apis/<group>`.
pub fn group(types: &[Arc<ResourceType>], name: &str) -> Option<Value> {
    let gs = groups(types);
    let vs = gs.get(name)?;
    let mut g = group_json(name, vs);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

/// `/api/v1` or `/apis/<group>/<version>`.
pub fn resource_list(types: &[Arc<ResourceType>], group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for t in types.iter().filter(|t| {
        t.group == group && (t.version == version || t.versions.iter().any(|v| v == version))
    }) {
        let mut r = json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
            "kind": t.kind, "verbs": t.verbs(),
        });
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            r["categories"] = json!(t.categories);
        }
        resources.push(r);
        if t.status_subresource {
            resources.push(json!({"name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced,
                                  "kind": t.kind, "verbs": ["get", "patch", "update"]}));
        }
        if t.group.is_empty() && t.plural == "pods" {
            resources.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy",
                                  "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn reverse_domain(group: &str) -> String {
    if group.is_empty() {
        return "io.k8s.api.core".into();
    }
    let mut parts: Vec<&str> = group.split('.').collect();
    parts.reverse();
    parts.join(".")
}

/// The OpenAPI definition name of a type.
pub fn definition_name(t: &ResourceType, version: &str) -> String {
    format!("{}.{}.{}", reverse_domain(&t.group), version, t.kind)
}

fn object_meta() -> Value {
    json!({"description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "namespace": {"type": "string", "description": "Namespace defines the space within which each name must be unique."},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Map of string keys and values that can be used to organize and categorize objects."},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Annotations is an unstructured key value map."},
        "uid": {"type": "string", "description": "UID is the unique in time and space value for this object."},
        "resourceVersion": {"type": "string", "description": "An opaque value that represents the internal version of this object."},
        "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state."},
        "creationTimestamp": {"type": "string", "format": "date-time", "description": "CreationTimestamp is a timestamp representing the server time when this object was created."},
        "deletionTimestamp": {"type": "string", "format": "date-time", "description": "DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted."},
        "finalizers": {"type": "array", "items": {"type": "string"}, "description": "Must be empty before the object is deleted from the registry."},
        "ownerReferences": {"type": "array", "items": {"type": "object"}, "description": "List of objects depended by this object."}
    }})
}

fn type_schema(t: &ResourceType, version: &str) -> Value {
    let mut s = match &t.schema {
        Some(s) => s.clone(),
        None => {
            json!({"type": "object", "description": format!("{} (built-in kind; the emulator serves a minimal schema)", t.kind),
                       "properties": {"spec": {"type": "object", "description": "Specification.", "x-kubernetes-preserve-unknown-fields": true},
                                      "status": {"type": "object", "description": "Most recently observed status.", "x-kubernetes-preserve-unknown-fields": true}}})
        }
    };
    if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
        props.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
        props.insert("metadata".into(), object_meta());
    }
    s["x-kubernetes-group-version-kind"] =
        json!([{"group": t.group, "kind": t.kind, "version": version}]);
    s
}

/// `/openapi/v3`: the index of group-version documents.
pub fn openapi_v3_index(types: &[Arc<ResourceType>]) -> Value {
    let mut paths = Map::new();
    for (g, vs) in groups(types) {
        for v in vs {
            let key = if g.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{g}/{v}")
            };
            let hash = format!("{:016X}", fxhash(&format!("{key}{}", types.len())));
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
            );
        }
    }
    json!({"paths": paths})
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// `/openapi/v3/apis/<group>/<version>` (or `api/v1`).
pub fn openapi_v3_group(types: &[Arc<ResourceType>], group: &str, version: &str) -> Option<Value> {
    let mut schemas = Map::new();
    let mut paths = Map::new();
    for t in types.iter().filter(|t| {
        t.group == group && (t.version == version || t.versions.iter().any(|v| v == version))
    }) {
        let name = definition_name(t, version);
        schemas.insert(name.clone(), type_schema(t, version));
        let base = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let ns = if t.namespaced {
            "/namespaces/{namespace}"
        } else {
            ""
        };
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
        ]);
        let gvk = json!({"group": t.group, "version": version, "kind": t.kind});
        let op = |verb: &str| {
            json!({"operationId": format!("{verb}{}", t.kind), "parameters": params,
            "x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": verb,
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{name}")}}}}}})
        };
        paths.insert(
            format!("{base}{ns}/{}", t.plural),
            json!({"get": op("list"), "post": op("post")}),
        );
        paths.insert(
            format!("{base}{ns}/{}/{{name}}", t.plural),
            json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        );
        if t.status_subresource {
            paths.insert(
                format!("{base}{ns}/{}/{{name}}/status", t.plural),
                json!({"get": op("get"), "put": op("put"), "patch": op("patch")}),
            );
        }
    }
    if schemas.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0-inplace-emulator"},
        "paths": paths,
        "components": {"schemas": schemas}
    }))
}
