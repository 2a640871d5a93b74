//! Where an `oci://` artifact is fetched from on this node: the registry's distribution API
//! for the repository, `https://REGISTRY/v2/REPOSITORY/`, held to the node policy like any
//! artifact URL. Plain http is used only when the policy allows http and admits
//! `http://REGISTRY/v2/REPOSITORY/` but not the https endpoint: a registry inside the
//! cluster's own network, reached the way its owner wrote it down. Pure.

use inplace_proto::oci::Reference;

use crate::policy::url_problem;
use crate::settings::Policy;

/// The API endpoint of `reference`'s repository (ending in `/`), or why this node may not
/// reach it.
pub fn endpoint(reference: &Reference, policy: &Policy) -> Result<url::Url, String> {
    let at = |scheme: &str| {
        format!(
            "{scheme}://{}/v2/{}/",
            reference.registry, reference.repository
        )
    };
    let https = at("https");
    let refusal = match url_problem(&https, policy) {
        None => return parse(&https),
        Some(refusal) => refusal,
    };
    let http = at("http");
    if policy.allow_http && url_problem(&http, policy).is_none() {
        return parse(&http);
    }
    Err(format!("registry {}: {refusal}", reference.display_name()))
}

/// Why the artifact URL `url` (an http(s) URL or an `oci://` reference) is not allowed
/// here, if it is not.
pub fn artifact_url_problem(url: &str, policy: &Policy) -> Option<String> {
    if !inplace_proto::oci::is_oci(url) {
        return url_problem(url, policy);
    }
    match Reference::parse(url) {
        Ok(reference) => endpoint(&reference, policy).err(),
        Err(message) => Some(message),
    }
}

fn parse(text: &str) -> Result<url::Url, String> {
    url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn policy(prefixes: &[&str], allow_http: bool) -> Policy {
        let mut policy = crate::settings::from_toml("", || Some("n".into()))
            .unwrap()
            .policy;
        policy.allowed_url_prefixes = prefixes.iter().map(|p| p.parse().unwrap()).collect();
        policy.allow_http = allow_http;
        policy
    }

    fn reference(registry: &str) -> Reference {
        Reference::parse(&format!("oci://{registry}/sysext/kubelet@sha256:{D}")).unwrap()
    }

    #[test]
    fn https_is_the_endpoint_when_the_policy_admits_it() {
        let p = policy(&["https://registry.example/v2/sysext/"], false);
        let url = endpoint(&reference("registry.example"), &p).unwrap();
        assert_eq!(url.as_str(), "https://registry.example/v2/sysext/kubelet/");
    }

    #[test]
    fn http_only_where_the_policy_allows_http_and_names_that_registry() {
        let p = policy(&["http://10.0.0.5:5000/"], true);
        let url = endpoint(&reference("10.0.0.5:5000"), &p).unwrap();
        assert_eq!(url.as_str(), "http://10.0.0.5:5000/v2/sysext/kubelet/");
        let no_http = policy(&["http://10.0.0.5:5000/"], false);
        let e = endpoint(&reference("10.0.0.5:5000"), &no_http).unwrap_err();
        assert!(
            e.contains("registry 10.0.0.5:5000/sysext/kubelet@sha256:"),
            "{e}"
        );
        assert!(e.contains("not under an allowed URL prefix"), "{e}");
    }

    #[test]
    fn a_repository_outside_the_prefixes_is_refused() {
        let p = policy(&["https://registry.example/v2/sysext/"], false);
        let other =
            Reference::parse(&format!("oci://registry.example/private/x@sha256:{D}")).unwrap();
        assert!(endpoint(&other, &p).is_err());
        assert!(
            artifact_url_problem("oci://registry.example/a:v1", &p)
                .unwrap()
                .contains("alone does not pin")
        );
        assert!(
            artifact_url_problem(&format!("oci://registry.example/sysext/k@sha256:{D}"), &p)
                .is_none()
        );
    }
}
