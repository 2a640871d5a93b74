//! `kubectl inplace preview -f rollout.yaml`: what the controller would do with a
//! NodeRollout, read from a file, against the cluster as it is — nothing written, nothing
//! downloaded. The decision is the controller's own (`inplace_controller::rollout::preview`); this
//! module reads the file, lists what the decision reads and draws the answer.

use std::path::Path;

use anyhow::Context as _;
use inplace_controller::decision::asks_api_server;
use inplace_controller::rollout::preview::{Cluster, Preview, preview};
use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt as _};

use crate::render::human_bytes;

/// Reads the NodeRollout in `path` (YAML or JSON, one object).
pub fn read_rollout(path: &Path) -> anyhow::Result<NodeRollout> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {shown}"))?;
    let value: serde_json::Value =
        serde_yaml::from_str(&text).with_context(|| format!("{shown}: not YAML"))?;
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    anyhow::ensure!(
        kind == "NodeRollout",
        "{shown}: kind is {kind:?}, not NodeRollout (preview takes one NodeRollout)"
    );
    let rollout: NodeRollout =
        serde_json::from_value(value).with_context(|| format!("{shown}: not a NodeRollout"))?;
    anyhow::ensure!(
        rollout.metadata.name.is_some(),
        "{shown}: metadata.name is missing"
    );
    Ok(rollout)
}

/// Lists what the decision reads (only reads: Nodes, plans, rollouts, the release, and the
/// API server's `/version` when the skew guard needs it) and previews `rollout`; the
/// release it names, when it exists.
pub async fn preview_rollout(
    client: &Client,
    rollout: &NodeRollout,
) -> anyhow::Result<(Preview, Option<NodeRelease>)> {
    let list = ListParams::default();
    let nodes = Api::<Node>::all(client.clone())
        .list(&list)
        .await
        .context("listing Nodes")?
        .items;
    let plans = Api::<NodeUpdatePlan>::all(client.clone())
        .list(&list)
        .await
        .context("listing NodeUpdatePlans")?
        .items;
    let rollouts = Api::<NodeRollout>::all(client.clone())
        .list(&list)
        .await
        .context("listing NodeRollouts")?
        .items;
    let release = Api::<NodeRelease>::all(client.clone())
        .get_opt(&rollout.spec.release)
        .await
        .with_context(|| format!("reading NodeRelease {}", rollout.spec.release))?;
    let kubernetes = release
        .as_ref()
        .and_then(|r| r.spec.content.kubernetes_version.as_deref());
    let api_server_version = match asks_api_server(&rollout.spec, kubernetes) {
        true => Some(
            client
                .apiserver_version()
                .await
                .context("reading the API server's /version")?
                .git_version,
        ),
        false => None,
    };
    let cluster = Cluster {
        nodes: &nodes,
        plans: &plans,
        rollouts: &rollouts,
        release: release.as_ref(),
        api_server_version,
        now: Timestamp::now(),
    };
    let preview = preview(rollout, &cluster).map_err(|e| anyhow::anyhow!("previewing: {e}"))?;
    Ok((preview, release))
}

/// The preview drawn for a person.
pub fn preview_lines(
    rollout: &NodeRollout,
    release: Option<&NodeRelease>,
    preview: &Preview,
) -> Vec<String> {
    let status = &preview.first.status;
    let mut lines = vec![format!(
        "Preview of NodeRollout {} (release {}{}): nothing written, nothing downloaded",
        rollout.name_any(),
        rollout.spec.release,
        status
            .revision
            .as_deref()
            .map(|r| format!(", revision {r}"))
            .unwrap_or_default(),
    )];
    lines.push(skew_line(rollout, release, preview));
    let spread = rollout
        .spec
        .max_unavailable_per_topology
        .as_ref()
        .map(|s| format!("; at most {} per {} group", s.max, s.key))
        .unwrap_or_default();
    lines.push(format!(
        "Slots: {} of {} nodes at once (maxUnavailable {}){spread}",
        preview.slots,
        preview.nodes.len(),
        int_or_string(&rollout.spec.max_unavailable),
    ));
    lines.push(match &status.next_window_opens_at {
        Some(at) => format!("Window: closed now; the next opens at {}", at.0),
        None => "Window: open now".to_owned(),
    });
    if !rollout.spec.gates.alerts.is_empty() {
        lines.push(
            "Alerts: not checked (the controller asks Prometheus, the preview does not)".to_owned(),
        );
    }
    for condition in &status.conditions {
        lines.push(format!(
            "Condition {}={} {}: {}",
            condition.type_, condition.status, condition.reason, condition.message
        ));
    }
    named(
        &mut lines,
        "Held (staged, no slot until released)",
        &status.held_nodes,
    );
    named(
        &mut lines,
        "Skipped (keep the revision they run)",
        &status.skipped_nodes,
    );
    let others: Vec<String> = status
        .foreign_disruptions
        .iter()
        .map(|f| format!("{} {}", f.node, f.why))
        .collect();
    named(&mut lines, "Down by others (each takes a slot)", &others);
    let refused: Vec<String> = preview
        .refused
        .iter()
        .map(|(node, owner)| format!("{node} (owned by {owner})"))
        .collect();
    named(&mut lines, "Not this rollout's", &refused);
    lines.push(String::new());
    lines.extend(node_table(preview));
    lines
}

fn skew_line(rollout: &NodeRollout, release: Option<&NodeRelease>, preview: &Preview) -> String {
    if let Some((reason, message)) = &preview.skew_refusal {
        return format!("Skew check: refused ({reason}): {message}");
    }
    match release.and_then(|r| r.spec.content.kubernetes_version.as_deref()) {
        None => "Skew check: not judged (the release brings no Kubernetes version)".to_owned(),
        Some(version) if rollout.spec.allow_version_skew => {
            format!("Skew check: kubelet {version}, API server not compared (allowVersionSkew)")
        }
        Some(version) => format!("Skew check: passed (kubelet {version})"),
    }
}

fn node_table(preview: &Preview) -> Vec<String> {
    let mut rows = vec![[
        "NODE".to_owned(),
        "ROLE".to_owned(),
        "GROUP".to_owned(),
        "WAVE".to_owned(),
        "EARLIEST START".to_owned(),
        "DOWNLOAD".to_owned(),
    ]];
    for node in &preview.nodes {
        let wave = node
            .wave
            .and_then(|w| preview.waves.get(w - 1).map(|at| (w, at)));
        rows.push([
            node.name.clone(),
            if node.control_plane {
                "control-plane"
            } else {
                "worker"
            }
            .to_owned(),
            if node.topology.is_empty() {
                "-".to_owned()
            } else {
                node.topology.clone()
            },
            wave.map_or_else(|| "-".to_owned(), |(w, _)| w.to_string()),
            wave.map_or_else(
                || "-".to_owned(),
                |(_, at)| at.at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            ),
            match node.download {
                Some(bytes) => human_bytes(bytes),
                None => "unknown (an artifact gives no size)".to_owned(),
            },
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect()
}

fn named(lines: &mut Vec<String>, what: &str, nodes: &[String]) {
    if !nodes.is_empty() {
        lines.push(format!("{what}: {}", nodes.join(", ")));
    }
}

fn int_or_string(value: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString) -> String {
    match value {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => n.to_string(),
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
    }
}
