//! Counts every request the controller's API clients send, by Kubernetes verb
//! (`inplace_controller_api_requests_total`): what the scale benchmark reports per node, on
//! the emulator and on the real API server alike.

use std::sync::Arc;

use anyhow::Context as _;

use crate::metrics::Metrics;

/// A client for `config` whose every request is counted in `metrics`.
pub fn counted_client(config: kube::Config, metrics: Arc<Metrics>) -> anyhow::Result<kube::Client> {
    let count =
        tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
            metrics.requested(verb_of(request.method(), request.uri()));
            request
        });
    Ok(kube::client::ClientBuilder::try_from(config)
        .context("building the API client")?
        .with_layer(&count)
        .build())
}

/// The Kubernetes verb of a request, as the API server's audit log names it: a GET is a
/// `watch` with `watch=true`, a `list` on a collection and a `get` on one object.
pub fn verb_of(method: &http::Method, uri: &http::Uri) -> &'static str {
    match *method {
        http::Method::GET => {
            let watch = uri
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
            if watch {
                "watch"
            } else if names_a_collection(uri.path()) {
                "list"
            } else {
                "get"
            }
        }
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// Whether a path names a collection (`/api/v1/nodes`, `/apis/G/V/namespaces/NS/pods`)
/// rather than one object or its subresource.
fn names_a_collection(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    };
    let Some(mut rest) = rest else {
        return false;
    };
    if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        rest = &rest[2..];
    }
    rest.len() == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_by_their_kubernetes_verb() {
        let verb = |method: http::Method, uri: &str| verb_of(&method, &uri.parse().unwrap());
        use http::Method as M;
        assert_eq!(
            verb(M::GET, "/api/v1/nodes?watch=true&resourceVersion=5"),
            "watch"
        );
        assert_eq!(verb(M::GET, "/api/v1/nodes?limit=500"), "list");
        assert_eq!(verb(M::GET, "/api/v1/nodes/node-1"), "get");
        assert_eq!(verb(M::GET, "/api/v1/namespaces/default/pods"), "list");
        assert_eq!(verb(M::GET, "/api/v1/namespaces/default/pods/p"), "get");
        assert_eq!(verb(M::GET, "/api/v1/namespaces/default"), "get");
        assert_eq!(
            verb(M::GET, "/apis/inplace.dev/v1alpha1/nodeupdateplans"),
            "list"
        );
        assert_eq!(
            verb(M::GET, "/apis/inplace.dev/v1alpha1/noderollouts/r/status"),
            "get"
        );
        assert_eq!(
            verb(M::PATCH, "/apis/inplace.dev/v1alpha1/nodeupdateplans/n"),
            "patch"
        );
        assert_eq!(
            verb(M::POST, "/api/v1/namespaces/d/pods/p/eviction"),
            "create"
        );
        assert_eq!(
            verb(M::PUT, "/apis/coordination.k8s.io/v1/namespaces/d/leases/l"),
            "update"
        );
        assert_eq!(verb(M::DELETE, "/api/v1/nodes/n"), "delete");
    }
}
