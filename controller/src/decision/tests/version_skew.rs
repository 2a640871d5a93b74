//! The skew guard: a kubelet newer than the API server, a skipped minor version and a
//! downgrade are refused before any node is touched, unless the rollout allows them.

use super::*;

fn on(kubelet: &str, mut n: NodeView) -> NodeView {
    n.kubelet_version = Some(kubelet.into());
    n
}

fn judged<'a>(
    spec: &'a NodeRolloutSpec,
    release: &str,
    server: &str,
    nodes: Vec<NodeView>,
) -> RolloutInput<'a> {
    RolloutInput {
        versions: KubernetesVersions {
            release: Some(release.into()),
            api_server: Some(server.into()),
        },
        ..input(spec, nodes)
    }
}

fn progressing(d: &Decision) -> (String, String, String) {
    let p = condition(d, "Progressing");
    (p.status.clone(), p.reason.clone(), p.message.clone())
}

/// Refused: no write, every node pending, Progressing and Complete False with `reason`, a
/// Warning Event; the message names every word in `words`.
fn assert_refused(d: &Decision, reason: &str, words: &[&str]) {
    assert!(d.actions.is_empty(), "no node is touched: {:?}", d.actions);
    let (status, found, message) = progressing(d);
    assert_eq!((status.as_str(), found.as_str()), ("False", reason));
    for word in words.iter().chain(&["no node is touched"]) {
        assert!(message.contains(word), "{word:?} in {message:?}");
    }
    assert_eq!(condition(d, "Complete").reason, reason);
    assert_eq!(d.status.nodes.pending, d.status.nodes.total);
    assert!(
        d.events
            .iter()
            .any(|e| e.kind == EventKind::Warning && e.reason == reason),
        "{:?}",
        d.events
    );
}

#[test]
fn a_kubelet_newer_than_the_api_server_is_refused_and_looked_at_again() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = vec![on("v1.36.3", node("a"))];
    let d = decide(&judged(&s, "v1.37.0", "v1.36.3", nodes.clone()));
    assert_refused(
        &d,
        "VersionSkewDenied",
        &[
            "\"rel\"",
            "v1.37.0",
            "API server's v1.36.3",
            "allowVersionSkew",
        ],
    );
    assert_eq!(d.requeue_after, Some(SERVER_VERSION_RECHECK));

    let patch_ahead = decide(&judged(&s, "v1.36.4", "v1.36.3", nodes.clone()));
    assert_eq!(
        progressing(&patch_ahead).1,
        "RollingOut",
        "a patch ahead is allowed"
    );

    let mut allowed = s.clone();
    allowed.allow_version_skew = true;
    let d = decide(&judged(&allowed, "v1.37.0", "v1.36.3", nodes));
    assert_eq!(progressing(&d).1, "RollingOut");
    assert!(!d.actions.is_empty());
}

#[test]
fn a_skipped_minor_version_is_refused_naming_the_nodes_behind() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = vec![
        on("v1.34.2", node("a")),
        on("v1.35.4", node("b")),
        node("no-kubelet"),
    ];
    let d = decide(&judged(&s, "v1.36.3", "v1.36.3", nodes.clone()));
    assert_refused(
        &d,
        "VersionSkewDenied",
        &[
            "v1.36.3",
            "the kubelet of 1 node: a (v1.34.2)",
            "allowVersionSkew",
        ],
    );
    assert!(
        !progressing(&d).2.contains("b (v1.35.4)"),
        "one minor up is fine"
    );
    assert_eq!(
        d.requeue_after, None,
        "a Node watch sees the kubelets change"
    );

    let mut allowed = s.clone();
    allowed.allow_version_skew = true;
    let d = decide(&judged(&allowed, "v1.36.3", "v1.36.3", nodes));
    assert_eq!(progressing(&d).1, "RollingOut");
}

#[test]
fn a_downgrade_is_refused_unless_allowed() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = vec![
        on("v1.36.3", node("a")),
        on("v1.36.3", node("b")),
        on("v1.35.4", node("c")),
    ];
    let d = decide(&judged(&s, "v1.35.4", "v1.36.3", nodes.clone()));
    assert_refused(
        &d,
        "DowngradeDenied",
        &[
            "v1.35.4",
            "lower than the kubelet of 2 nodes: a (v1.36.3), b (v1.36.3)",
            "allowDowngrade",
        ],
    );

    let mut allowed = s.clone();
    allowed.allow_downgrade = true;
    let d = decide(&judged(&allowed, "v1.35.4", "v1.36.3", nodes));
    assert_eq!(progressing(&d).1, "RollingOut");
    assert_eq!(d.status.revision.as_deref(), Some(REV));
}

#[test]
fn releases_and_kubelets_without_a_kubernetes_version_are_not_judged() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = vec![on("v1.30.0", node("a")), on("not-a-version", node("b"))];
    let agent_only = decide(&RolloutInput {
        versions: KubernetesVersions {
            release: None,
            api_server: Some("v1.36.3".into()),
        },
        ..input(&s, nodes.clone())
    });
    assert_eq!(progressing(&agent_only).1, "RollingOut");
    let os_release = decide(&judged(&s, "flatcar-4230.2.0", "v1.36.3", nodes));
    assert_eq!(progressing(&os_release).1, "RollingOut");
}

#[test]
fn many_nodes_are_counted_past_the_first_ten() {
    let s = spec(IntOrString::Int(1), 0);
    let nodes = (0..13)
        .map(|i| on("v1.33.0", node(&format!("n{i:02}"))))
        .collect();
    let d = decide(&judged(&s, "v1.36.3", "v1.36.3", nodes));
    let message = progressing(&d).2;
    assert!(
        message.contains("the kubelet of 13 nodes: n00 (v1.33.0)"),
        "{message}"
    );
    assert!(message.contains("n09 (v1.33.0) and 3 more"), "{message}");
    assert!(!message.contains("n10"), "{message}");
}
