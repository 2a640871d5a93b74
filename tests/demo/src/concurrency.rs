//! The rollout's limit, watched from outside the controller: how many of the fleet's nodes
//! are activating, and how many cordoned, at the same moment. Every plan and Node event is
//! looked at (not the 250 ms redraw), and the demo fails when either count ever exceeds the
//! rollout's `maxUnavailable`.
//!
//! A node is *activating* from its plan's `desiredState: Active` until the agent reports a
//! final phase (`Succeeded`, `RolledBack`, `Failed`) for the plan's revision.

use std::collections::BTreeSet;

use futures::StreamExt as _;
use inplace_proto::{DesiredState, NodeUpdatePlan};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use kubectl_inplace::render;

/// The most nodes seen at once, and which they were the first time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peak {
    /// How many.
    pub count: usize,
    /// The nodes, when the count was first reached.
    pub nodes: Vec<String>,
}

impl Peak {
    fn observe(&mut self, now: &BTreeSet<String>) {
        if now.len() > self.count {
            self.count = now.len();
            self.nodes = now.iter().cloned().collect();
        }
    }
}

/// What the watches saw so far. Pure: fed plans and nodes, in event order.
#[derive(Debug, Default)]
pub struct Tracker {
    activating: BTreeSet<String>,
    cordoned: BTreeSet<String>,
    /// The most nodes activating at once.
    pub activating_peak: Peak,
    /// The most nodes cordoned at once.
    pub cordoned_peak: Peak,
    plans_listed: bool,
    nodes_listed: bool,
}

/// Whether the plan's node is activating (see the module documentation).
pub fn is_activating(plan: &NodeUpdatePlan) -> bool {
    plan.spec.desired_state == DesiredState::Active && !render::effective_phase(plan).is_final()
}

impl Tracker {
    /// A plan was created or changed.
    pub fn plan_changed(&mut self, plan: &NodeUpdatePlan) {
        let name = plan.name_any();
        if is_activating(plan) {
            self.activating.insert(name);
        } else {
            self.activating.remove(&name);
        }
        self.activating_peak.observe(&self.activating);
    }

    /// A plan (or Node) is gone.
    pub fn deleted(&mut self, name: &str) {
        self.activating.remove(name);
        self.cordoned.remove(name);
    }

    /// A Node was created or changed.
    pub fn node_changed(&mut self, node: &Node) {
        let name = node.name_any();
        if node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
        {
            self.cordoned.insert(name);
        } else {
            self.cordoned.remove(&name);
        }
        self.cordoned_peak.observe(&self.cordoned);
    }

    /// Fails, naming the nodes, when more nodes were activating or cordoned at once than
    /// `max_unavailable` allows.
    pub fn check(&self, max_unavailable: usize) -> Result<(), String> {
        for (what, peak) in [
            ("activating", &self.activating_peak),
            ("cordoned", &self.cordoned_peak),
        ] {
            if peak.count > max_unavailable {
                return Err(format!(
                    "maxUnavailable {max_unavailable} exceeded: {} nodes {what} at once ({})",
                    peak.count,
                    peak.nodes.join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// Watches the plans and the Nodes selected by `label` into a [`Tracker`] until dropped.
pub struct Concurrency {
    tracker: tokio::sync::watch::Sender<Tracker>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Concurrency {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Concurrency {
    /// Starts the watches. The first list counts as events too: nodes that are activating
    /// already are counted.
    pub fn start(client: &kube::Client, label: &str) -> Concurrency {
        let (tracker, _) = tokio::sync::watch::channel(Tracker::default());
        let plans = watcher(
            Api::<NodeUpdatePlan>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff();
        let nodes = watcher(
            Api::<Node>::all(client.clone()),
            watcher::Config::default().labels(label),
        )
        .default_backoff();
        let on_plans = {
            let tracker = tracker.clone();
            plans.for_each(move |event| {
                tracker.send_modify(|t| match event {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        t.plan_changed(&p);
                    }
                    Ok(watcher::Event::Delete(p)) => t.deleted(&p.name_any()),
                    Ok(watcher::Event::InitDone) => t.plans_listed = true,
                    _ => {}
                });
                async {}
            })
        };
        let on_nodes = {
            let tracker = tracker.clone();
            nodes.for_each(move |event| {
                tracker.send_modify(|t| match event {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        t.node_changed(&n);
                    }
                    Ok(watcher::Event::Delete(n)) => t.deleted(&n.name_any()),
                    Ok(watcher::Event::InitDone) => t.nodes_listed = true,
                    _ => {}
                });
                async {}
            })
        };
        Concurrency {
            tracker,
            tasks: vec![tokio::spawn(on_plans), tokio::spawn(on_nodes)],
        }
    }

    /// Waits until both watches have listed what exists, so nothing after this is missed.
    pub async fn listed(&self) -> anyhow::Result<()> {
        let mut updates = self.tracker.subscribe();
        let listed = updates.wait_for(|t| t.plans_listed && t.nodes_listed);
        tokio::time::timeout(std::time::Duration::from_secs(60), listed)
            .await
            .map_err(|_| anyhow::anyhow!("the plan and node watches did not list within a minute"))?
            .map_err(|_| anyhow::anyhow!("the plan and node watches stopped"))?;
        Ok(())
    }

    /// The peaks so far: (activating, cordoned).
    pub fn peaks(&self) -> (Peak, Peak) {
        let t = self.tracker.borrow();
        (t.activating_peak.clone(), t.cordoned_peak.clone())
    }

    /// [`Tracker::check`] on what was seen so far.
    pub fn check(&self, max_unavailable: usize) -> Result<(), String> {
        self.tracker.borrow().check(max_unavailable)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn plan(name: &str, desired: &str, phase: &str, target: &str) -> NodeUpdatePlan {
        serde_json::from_value(json!({
            "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeUpdatePlan",
            "metadata": {"name": name},
            "spec": {"nodeName": name, "revision": "r2", "desiredState": desired,
                     "artifacts": []},
            "status": {"phase": phase, "targetRevision": target, "currentRevision": "r1"},
        }))
        .unwrap()
    }

    fn node(name: &str, unschedulable: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name}, "spec": {"unschedulable": unschedulable},
        }))
        .unwrap()
    }

    #[test]
    fn a_plan_activates_from_active_until_a_final_phase_for_its_revision() {
        // Granted, the agent still reports the old revision.
        assert!(is_activating(&plan("n", "Active", "Succeeded", "r1")));
        assert!(is_activating(&plan("n", "Active", "Verifying", "r2")));
        assert!(!is_activating(&plan("n", "Active", "Succeeded", "r2")));
        assert!(!is_activating(&plan("n", "Active", "RolledBack", "r2")));
        assert!(!is_activating(&plan("n", "Staged", "Staged", "r2")));
    }

    #[test]
    fn peaks_count_nodes_at_the_same_moment() {
        let mut t = Tracker::default();
        t.plan_changed(&plan("a", "Active", "Activating", "r2"));
        t.plan_changed(&plan("a", "Active", "Succeeded", "r2"));
        t.plan_changed(&plan("b", "Active", "Activating", "r2"));
        t.node_changed(&node("b", true));
        t.node_changed(&node("b", false));
        t.node_changed(&node("c", true));
        assert_eq!(t.activating_peak.count, 1);
        assert_eq!(t.cordoned_peak.count, 1);
        assert!(t.check(1).is_ok());

        t.plan_changed(&plan("c", "Active", "Staged", "r2"));
        assert_eq!(t.activating_peak.nodes, ["b", "c"]);
        let error = t.check(1).unwrap_err();
        assert!(
            error.contains("maxUnavailable 1 exceeded: 2 nodes activating at once (b, c)"),
            "{error}"
        );
        t.deleted("b");
        t.plan_changed(&plan("d", "Active", "Staged", "r2"));
        assert_eq!(t.activating_peak.count, 2, "the peak stays");
    }
}
