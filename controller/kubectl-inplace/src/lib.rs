//! `kubectl inplace`: what the fleet's rollouts and plans say, drawn for people.
//!
//! [`render`] draws (pure, unit-tested); [`steer`] holds the verbs that change a rollout;
//! [`preview`] shows what the controller would do with a rollout read from a file;
//! this module fetches objects and watches them.

pub mod preview;
pub mod render;
pub mod steer;

use anyhow::Context as _;
use futures::StreamExt as _;
use inplace_proto::{NodeRollout, NodeUpdatePlan};
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, Client};

use render::Style;

/// A client from `--kubeconfig`, else `$KUBECONFIG` / `~/.kube/config` / in-cluster, as
/// kubectl finds one.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("using {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding the Kubernetes API ($KUBECONFIG, ~/.kube/config or in-cluster)")?,
    };
    Client::try_from(config).context("building the Kubernetes client")
}

/// Lines for `status`: one rollout (`Some(name)`) or every rollout, from lists in hand.
pub fn status_lines(
    rollouts: &[NodeRollout],
    plans: &[NodeUpdatePlan],
    only: Option<&str>,
    style: &Style,
) -> anyhow::Result<Vec<String>> {
    let mut selected: Vec<&NodeRollout> = rollouts
        .iter()
        .filter(|r| only.is_none_or(|n| r.metadata.name.as_deref() == Some(n)))
        .collect();
    selected.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    if let Some(name) = only
        && selected.is_empty()
    {
        anyhow::bail!("NodeRollout {name} not found");
    }
    let mut lines = Vec::new();
    if selected.is_empty() {
        lines.push("No NodeRollouts.".to_owned());
    }
    for (i, r) in selected.iter().enumerate() {
        if i > 0 {
            lines.push(String::new());
        }
        lines.extend(render::rollout_lines(r, plans, style));
    }
    let owned_by_any = |p: &&NodeUpdatePlan| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(render::ROLLOUT_LABEL))
            .is_some()
    };
    if only.is_none() {
        let mut loose: Vec<&NodeUpdatePlan> = plans.iter().filter(|p| !owned_by_any(p)).collect();
        loose.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        if !loose.is_empty() {
            lines.push(String::new());
            lines.push("Plans without a rollout:".to_owned());
            let width = loose
                .iter()
                .filter_map(|p| p.metadata.name.as_ref().map(String::len))
                .max()
                .unwrap_or(4);
            lines.extend(
                loose
                    .into_iter()
                    .map(|p| render::plan_line(p, width, style)),
            );
        }
    }
    Ok(lines)
}

/// `kubectl inplace status [rollout]`, once.
pub async fn status(
    client: &Client,
    only: Option<&str>,
    style: &Style,
) -> anyhow::Result<Vec<String>> {
    let rollouts = Api::<NodeRollout>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing NodeRollouts")?
        .items;
    let plans = Api::<NodeUpdatePlan>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing NodeUpdatePlans")?
        .items;
    status_lines(&rollouts, &plans, only, style)
}

/// `kubectl inplace plan <node>`, once.
pub async fn plan(client: &Client, node: &str, style: &Style) -> anyhow::Result<Vec<String>> {
    let plan = Api::<NodeUpdatePlan>::all(client.clone())
        .get_opt(node)
        .await
        .with_context(|| format!("reading NodeUpdatePlan {node}"))?
        .with_context(|| format!("node {node} has no NodeUpdatePlan"))?;
    Ok(render::plan_explain(
        &plan,
        k8s_openapi::jiff::Timestamp::now(),
        style,
    ))
}

/// What `--watch` re-renders.
#[derive(Debug, Clone)]
pub enum Watched {
    /// `status [rollout]`.
    Status(Option<String>),
    /// `plan <node>`.
    Plan(String),
}

/// Re-renders on every watch event (no polling) and hands each frame to `draw` until it
/// returns false or the watches end.
pub async fn watch(
    client: &Client,
    what: Watched,
    style: Style,
    mut draw: impl FnMut(Vec<String>) -> bool,
) -> anyhow::Result<()> {
    let (rollouts, rollout_writer) = reflector::store::<NodeRollout>();
    let (plans, plan_writer) = reflector::store::<NodeUpdatePlan>();
    let rollout_events = reflector(
        rollout_writer,
        watcher(
            Api::<NodeRollout>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .map(|e| e.map(|_| ()));
    let plan_config = match &what {
        Watched::Plan(node) => watcher::Config::default().fields(&format!("metadata.name={node}")),
        Watched::Status(_) => watcher::Config::default(),
    };
    let plan_events = reflector(
        plan_writer,
        watcher(Api::<NodeUpdatePlan>::all(client.clone()), plan_config),
    )
    .default_backoff()
    .map(|e| e.map(|_| ()));
    let mut events = std::pin::pin!(futures::stream::select(rollout_events, plan_events));
    let mut last: Option<Vec<String>> = None;
    while let Some(event) = events.next().await {
        if let Err(e) = event {
            tracing::debug!("watch: {e}");
            continue;
        }
        let all_rollouts: Vec<NodeRollout> =
            rollouts.state().iter().map(|r| (**r).clone()).collect();
        let all_plans: Vec<NodeUpdatePlan> = plans.state().iter().map(|p| (**p).clone()).collect();
        let frame = match &what {
            Watched::Status(only) => {
                match status_lines(&all_rollouts, &all_plans, only.as_deref(), &style) {
                    Ok(lines) => lines,
                    Err(e) => vec![format!("{e}")],
                }
            }
            Watched::Plan(node) => match all_plans
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(node))
            {
                Some(p) => render::plan_explain(p, k8s_openapi::jiff::Timestamp::now(), &style),
                None => vec![format!("node {node} has no NodeUpdatePlan (yet)")],
            },
        };
        if last.as_ref() == Some(&frame) {
            continue;
        }
        last = Some(frame.clone());
        if !draw(frame) {
            return Ok(());
        }
    }
    Ok(())
}
