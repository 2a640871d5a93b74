//! The write's first stage: the request's body, and how the write is made (field manager,
//! field validation, dry run).

use super::*;

pub(in crate::api) fn parse_body(req: &Request) -> Result<Value, ApiError> {
    let ct = req
        .content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    if ct.contains("protobuf") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct})"
            ),
        ));
    }
    let v: Value = if ct.ends_with("yaml") {
        serde_yaml::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
        })?
    };
    Ok(v)
}

/// How one write is made.
pub(in crate::api) struct WriteCtx<'a> {
    pub(in crate::api) t: &'a Target,
    pub(in crate::api) user: &'a User,
    pub(in crate::api) verb: &'a str,
    pub(in crate::api) manager: String,
    pub(in crate::api) field_validation: String,
    pub(in crate::api) dry_run: bool,
    pub(in crate::api) applied: bool,
}

pub(in crate::api) fn default_manager(req: &Request, verb: &str) -> String {
    if let Some(m) = req.query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    let ua = req
        .user_agent
        .split('/')
        .next()
        .unwrap_or("unknown")
        .to_string();
    if ua.is_empty() {
        format!("unknown-{verb}")
    } else {
        ua
    }
}

pub(in crate::api) fn ctx<'a>(t: &'a Target, req: &'a Request, verb: &'a str) -> WriteCtx<'a> {
    WriteCtx {
        t,
        user: &req.user,
        verb,
        manager: default_manager(req, verb),
        field_validation: req
            .query
            .get("fieldValidation")
            .cloned()
            .unwrap_or_else(|| "Warn".into()),
        dry_run: req.query.get("dryRun").is_some_and(|d| d == "All"),
        applied: false,
    }
}
