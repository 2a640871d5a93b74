//! Label and field selectors, parsed once per request and matched against JSON objects.

use crate::error::ApiError;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (`a=b,c!=d,e in (x,y),f notin (z),g,!h`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

impl LabelSelector {
    /// Parse the query-string form.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top_level(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let bad = || ApiError::bad_request(format!("unable to parse requirement: {part:?}"));
            if let Some(key) = part.strip_prefix('!') {
                reqs.push(LabelReq::NotExists(key.trim().to_string()));
            } else if let Some((k, v)) = part.split_once("!=") {
                reqs.push(LabelReq::NotEq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = part.split_once("==") {
                reqs.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = part.split_once('=') {
                reqs.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                reqs.push(LabelReq::NotIn(
                    k.trim().into(),
                    parse_set(rest).ok_or_else(bad)?,
                ));
            } else if let Some((k, rest)) = part.split_once(" in ") {
                reqs.push(LabelReq::In(
                    k.trim().into(),
                    parse_set(rest).ok_or_else(bad)?,
                ));
            } else if part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                reqs.push(LabelReq::Exists(part.to_string()));
            } else {
                return Err(bad());
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Build from a `metav1.LabelSelector` object (matchLabels + matchExpressions).
    pub fn from_object(sel: &Value) -> Self {
        let mut reqs = Vec::new();
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(LabelReq::Eq(
                    k.clone(),
                    v.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
        for e in sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let values: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            match e.get("operator").and_then(Value::as_str) {
                Some("In") => reqs.push(LabelReq::In(key, values)),
                Some("NotIn") => reqs.push(LabelReq::NotIn(key, values)),
                Some("Exists") => reqs.push(LabelReq::Exists(key)),
                Some("DoesNotExist") => reqs.push(LabelReq::NotExists(key)),
                _ => {}
            }
        }
        LabelSelector(reqs)
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the object's labels match.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

fn parse_set(s: &str) -> Option<Vec<String>> {
    let s = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        s.split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

fn split_top_level(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out
}

/// A parsed field selector (`metadata.name=x,spec.nodeName!=y`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The fields a real server lets you select on, per resource (plus metadata.name/namespace).
fn allowed_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
            "spec.hostNetwork",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "secrets") => &["type"],
        ("", "namespaces") => &["status.phase"],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parse and check the fields against what the resource supports (400 otherwise, like a
    /// real server). `selectable` adds a CRD's `selectableFields`.
    pub fn parse(
        s: &str,
        group: &str,
        plural: &str,
        selectable: &[String],
    ) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (field, neg, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !allowed_fields(group, plural).contains(&field)
                && !selectable
                    .iter()
                    .any(|f| f.trim_start_matches('.') == field)
            {
                let kind = if group.is_empty() {
                    plural.to_string()
                } else {
                    format!("{plural}.{group}")
                };
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field} (resource {kind})"
                )));
            }
            reqs.push((field.to_string(), neg, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// The name this selector pins (`metadata.name=x`), if any: used to index watchers.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, neg, _)| f == "metadata.name" && !neg)
            .map(|(_, _, v)| v.as_str())
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the object matches.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, neg, want)| {
            let mut cur = Some(obj);
            for seg in field.split('.') {
                cur = cur.and_then(|c| c.get(seg));
            }
            let have = match cur {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::Object(o)) if field == "source" => o
                    .get("component")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                _ if field == "spec.unschedulable" => "false".to_string(),
                _ => String::new(),
            };
            (have == *want) != *neg
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        for (s, want) in [
            ("a=1", true),
            ("a==1,b=2", true),
            ("a!=1", false),
            ("a in (1,3)", true),
            ("a notin (1,3)", false),
            ("c", false),
            ("!c", true),
            ("b,a in (3)", false),
        ] {
            assert_eq!(LabelSelector::parse(s).unwrap().matches(&o), want, "{s}");
        }
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "n1"}, "spec": {"nodeName": "w1"}});
        assert!(
            FieldSelector::parse("spec.nodeName=w1", "", "pods", &[])
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("metadata.name!=n1", "", "pods", &[])
                .unwrap()
                .matches(&o)
        );
        assert!(FieldSelector::parse("spec.foo=1", "", "pods", &[]).is_err());
        let s = FieldSelector::parse("metadata.name=n1", "inplace.dev", "x", &[]).unwrap();
        assert_eq!(s.pinned_name(), Some("n1"));
    }
}
