//! `spec.staging.maxConcurrent`: staging in waves.

use super::*;

fn limited(max_concurrent: IntOrString) -> NodeRolloutSpec {
    let mut s = spec(IntOrString::Int(1), 0);
    s.staging = Some(inplace_proto::StagingSpec { max_concurrent });
    s
}

/// Plan written for the revision, agent downloading.
fn downloading(mut n: NodeView) -> NodeView {
    n.plan = Some(plan(
        DesiredState::Staged,
        report(Phase::Downloading, REV, Some(OLD)),
    ));
    n
}

fn fleet(n: usize) -> Vec<NodeView> {
    (0..n).map(|i| node(&format!("n-{i:02}"))).collect()
}

#[test]
fn no_more_nodes_start_staging_than_max_concurrent() {
    let s = limited(IntOrString::Int(3));
    let d = decide(&input(&s, fleet(10)));
    let started: Vec<&str> = applies(&d).into_iter().map(|(n, _)| n).collect();
    assert_eq!(started, ["n-00", "n-01", "n-02"], "in activation order");
    assert_eq!(
        d.requeue_after, None,
        "the plan watch, not a requeue, brings the next wave"
    );
    assert_eq!(d.status.nodes.pending, count(10));
}

#[test]
fn a_node_staged_or_failed_frees_its_place_and_one_still_downloading_does_not() {
    let s = limited(IntOrString::Int(3));
    let mut nodes = fleet(10);
    nodes[0] = staged(nodes[0].clone());
    nodes[1] = downloading(nodes[1].clone());
    nodes[2] = failed(nodes[2].clone(), Phase::Failed, "DownloadFailed");
    let d = decide(&input(&s, nodes));
    let started: Vec<&str> = applies(&d)
        .into_iter()
        .filter(|(_, intent)| intent.granted_at.is_none())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(started, ["n-03", "n-04"], "3 allowed, 1 still downloading");

    let mut nodes = fleet(4);
    for n in &mut nodes[..3] {
        *n = downloading(n.clone());
    }
    let d = decide(&input(&s, nodes));
    assert!(
        applies(&d).is_empty(),
        "all 3 places taken: {:?}",
        applies(&d)
    );
}

#[test]
fn a_percentage_counts_the_selected_nodes_rounded_down_at_least_one() {
    let d = decide(&input(
        &limited(IntOrString::String("25%".into())),
        fleet(10),
    ));
    assert_eq!(applies(&d).len(), 2, "25% of 10");
    let d = decide(&input(
        &limited(IntOrString::String("1%".into())),
        fleet(10),
    ));
    assert_eq!(applies(&d).len(), 1, "never zero");
}

#[test]
fn without_a_limit_every_node_starts_staging() {
    let d = decide(&input(&spec(IntOrString::Int(1), 0), fleet(10)));
    assert_eq!(applies(&d).len(), 10);
}
