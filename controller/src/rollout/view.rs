//! The rollout controller's per-node view of each rollout ([`NodeView`]s), kept between
//! rounds and rebuilt only for the nodes a watch event or the controller's own write
//! touched since the last round ([`ChangeFeed`]). A round in which nothing the decision
//! reads has changed (no node, no plan, no rollout spec or selector, no release, and no
//! wake-up due) does not decide at all: it costs a few map lookups, not a pass over the
//! fleet (`docs/design/controller.md` § Incremental rounds).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use inplace_proto::architecture::ARCHITECTURE_LABEL;
use inplace_proto::{NodeRollout, NodeRolloutSpec, NodeUpdatePlan, Steering};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::decision::kured::KuredView;
use crate::decision::{
    CONTROL_PLANE_LABEL, DecisionMemo, NodeView, PlanView, ReleaseState, ScaleDownMark,
    activation_order, resolve_ownership,
};
use crate::decision::{fleetlock, fluo};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::rollout::plans::{RecentWrites, plan_owner};

mod revisions;
use revisions::Revisions;

/// Which nodes each rollout's view must rebuild: fed by the Node and NodeUpdatePlan watch
/// streams (a plan has its node's name) and by the controller's own writes.
#[derive(Debug, Default)]
pub struct ChangeFeed {
    pending: Mutex<HashMap<String, Pending>>,
}

/// What a view is built from: the watch caches, the controller's writes not yet in them,
/// and the feed of what changed (the reconcile's `Context` lends them; the view does not
/// know the rest of it).
pub struct Sources<'a> {
    /// Every Node.
    pub nodes: &'a Store<Node>,
    /// Every NodeUpdatePlan.
    pub plans: &'a Store<NodeUpdatePlan>,
    /// Every NodeRollout (a node belongs to the oldest that selects it).
    pub rollouts: &'a Store<NodeRollout>,
    /// Plans written but maybe not in the cache yet.
    pub writes: &'a RecentWrites,
    /// What changed since each rollout's last round.
    pub feed: &'a ChangeFeed,
    /// Counts the views built.
    pub metrics: &'a Metrics,
}

/// What changed for one rollout since its last round.
#[derive(Debug, Default)]
pub struct Pending {
    /// Nodes whose Node or plan changed.
    nodes: HashSet<String>,
    /// A watch relisted (deletions during the gap are not reported one by one), or the
    /// rollout has no view yet: rebuild every node.
    everything: bool,
}

impl ChangeFeed {
    /// A watch event of a Node or a NodeUpdatePlan, after the reflector stored it.
    pub fn saw<K: Resource>(&self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(object) | watcher::Event::Delete(object) => {
                if let Some(name) = &object.meta().name {
                    self.node_changed(name);
                }
            }
            watcher::Event::InitDone => self.relisted(),
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    /// The node's Node or plan changed (or the controller just wrote it).
    pub fn node_changed(&self, node: &str) {
        for pending in self.lock().values_mut() {
            if !pending.everything {
                pending.nodes.insert(node.to_owned());
            }
        }
    }

    /// A watch listed everything again: every view is rebuilt.
    pub fn relisted(&self) {
        for pending in self.lock().values_mut() {
            pending.everything = true;
            pending.nodes.clear();
        }
    }

    /// Takes what changed for `rollout` since the last call; the first call (and the
    /// first after [`ChangeFeed::forget`]) says everything. From here on, changes are
    /// recorded for it, so none falls between this call and the stores being read.
    fn take(&self, rollout: &str) -> Pending {
        let mut all = self.lock();
        match all.get_mut(rollout) {
            Some(pending) => std::mem::take(pending),
            None => {
                all.insert(rollout.to_owned(), Pending::default());
                Pending {
                    everything: true,
                    ..Pending::default()
                }
            }
        }
    }

    fn forget(&self, rollout: &str) {
        self.lock().remove(rollout);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Every rollout's view between rounds, and the feed that says what to rebuild.
#[derive(Debug, Default)]
pub struct RolloutViews {
    /// What changed since each rollout's last round.
    pub feed: ChangeFeed,
    views: Mutex<HashMap<String, RolloutView>>,
}

impl RolloutViews {
    /// The view `rollout` left after its last round (empty for a new one). A round that
    /// fails never puts its view back, so the next one rebuilds from the caches.
    pub fn take(&self, rollout: &str) -> RolloutView {
        self.lock().remove(rollout).unwrap_or_default()
    }

    /// Keeps a round's view for the next round.
    pub fn put(&self, rollout: &str, view: RolloutView) {
        self.lock().insert(rollout.to_owned(), view);
    }

    /// Forgets a deleted rollout.
    pub fn forget(&self, rollout: &str) {
        self.lock().remove(rollout);
        self.feed.forget(rollout);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, RolloutView>> {
        self.views
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What every node's view depends on besides the node and its plan: the rollout's spec
/// (selector, topology key) and every rollout's selector and age (ownership).
#[derive(Debug, Clone, PartialEq)]
struct ViewKey {
    uid: Option<String>,
    generation: Option<i64>,
    rollouts: Vec<(String, Selector)>,
}

/// What the last round decided that tells whether the next must decide again.
#[derive(Debug, Clone)]
pub struct LastRound {
    /// The release as that round saw it.
    pub release: ReleaseState,
    /// When the decision asked to be looked at again (a drain, a window, a soak, a
    /// deadline, the next staging batch, or the resync period).
    pub wake_at: Instant,
    /// When the rollout may decide again ([`crate::rollout::round_pacing`]).
    pub next_round_at: Instant,
    /// kured's lock as that round read it (`None`: not shared with kured).
    pub kured: Option<KuredView>,
}

/// One rollout's selected nodes as the decision sees them, kept between rounds.
#[derive(Debug, Default)]
pub struct RolloutView {
    key: Option<ViewKey>,
    /// The selected nodes, in no order; moved into the decision's input and back.
    pub nodes: Vec<NodeView>,
    index: HashMap<String, usize>,
    /// Each selected node's uid (the plan's owner reference).
    pub uids: HashMap<String, String>,
    /// The last round that decided.
    pub last: Option<LastRound>,
    /// The one copy of each revision the views name.
    revisions: Revisions,
    /// The last version number given to a node's view ([`NodeView::version`]).
    last_version: u64,
    /// What the last round's decision found per node, for the next (`decision/memo.rs`).
    pub memo: DecisionMemo,
}

/// How many node views a refresh built, and whether any of them differs from before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Refreshed {
    /// Views built from the caches.
    pub built: usize,
    /// Whether the selection or any node's view changed.
    pub changed: bool,
}

impl RolloutView {
    /// Brings the view up to date with the caches: every node when the rollouts, this
    /// rollout's spec or a relist call for it, else only the nodes the feed names.
    pub fn refresh(&mut self, rollout: &NodeRollout, ctx: &Sources) -> Result<Refreshed> {
        let name = rollout.name_any();
        let pending = ctx.feed.take(&name);
        let key = ViewKey {
            uid: rollout.metadata.uid.clone(),
            generation: rollout.metadata.generation,
            rollouts: rollouts_by_age(ctx.rollouts.state().iter().map(AsRef::as_ref)),
        };
        let builder = ViewBuilder::new(rollout, &key.rollouts)?;
        if pending.everything || self.key.as_ref() != Some(&key) {
            self.nodes.clear();
            self.index.clear();
            self.uids.clear();
            self.revisions.clear();
            self.last = None;
            self.memo = DecisionMemo::default();
            for node in ctx.nodes.state() {
                if let Some((view, uid)) = builder.build(&node, ctx)? {
                    self.insert(view, uid);
                }
            }
            self.key = Some(key);
            self.sort();
            return Ok(Refreshed {
                built: self.nodes.len(),
                changed: true,
            });
        }
        let mut refreshed = Refreshed::default();
        let mut reordered = false;
        for node_name in pending.nodes {
            let built = match ctx.nodes.get(&ObjectRef::new(&node_name)) {
                Some(node) => builder.build(&node, ctx)?,
                None => None,
            };
            refreshed.built += usize::from(built.is_some());
            let change = self.replace(&node_name, built);
            refreshed.changed |= change != Change::None;
            reordered |= change == Change::Order;
        }
        if reordered {
            self.sort();
        }
        Ok(refreshed)
    }

    /// Whether nothing the decision reads has changed since the last round decided (the
    /// views are refreshed already): same release, and no wake-up due yet.
    pub fn unchanged_since_last_round(
        &self,
        release: &ReleaseState,
        kured: Option<&KuredView>,
        now: Instant,
    ) -> bool {
        self.last.as_ref().is_some_and(|last| {
            last.release == *release && last.kured.as_ref() == kured && now < last.wake_at
        })
    }

    /// The release as the decision should see it: its revision the copy the views share.
    pub fn share_release(&mut self, release: ReleaseState) -> ReleaseState {
        self.revisions.share_release(release)
    }

    fn insert(&mut self, mut view: NodeView, uid: String) {
        self.revisions.share_node(&mut view);
        view.version = self.new_version();
        self.index.insert(view.name.clone(), self.nodes.len());
        self.uids.insert(view.name.clone(), uid);
        self.nodes.push(view);
    }

    /// Puts `built` in place of the node's view (removing it when `None`); what that
    /// changed.
    fn replace(&mut self, node: &str, built: Option<(NodeView, String)>) -> Change {
        match (self.index.get(node).copied(), built) {
            (Some(i), Some((mut view, uid))) => {
                self.revisions.share_node(&mut view);
                self.uids.insert(view.name.clone(), uid);
                view.version = self.nodes[i].version;
                let change = if self.nodes[i].control_plane != view.control_plane {
                    Change::Order
                } else if self.nodes[i] != view {
                    Change::View
                } else {
                    Change::None
                };
                if change != Change::None {
                    view.version = self.new_version();
                }
                self.nodes[i] = view;
                change
            }
            (None, Some((view, uid))) => {
                self.insert(view, uid);
                Change::Order
            }
            (Some(i), None) => {
                self.index.remove(node);
                self.uids.remove(node);
                self.nodes.swap_remove(i);
                if let Some(moved) = self.nodes.get(i) {
                    self.index.insert(moved.name.clone(), i);
                }
                Change::Order
            }
            (None, None) => Change::None,
        }
    }

    /// A version number no view of this rollout had before.
    fn new_version(&mut self) -> u64 {
        self.last_version += 1;
        self.last_version
    }

    /// Puts the nodes in activation order, the order the decision walks them in: kept so
    /// between rounds, the decision's sort of an already sorted fleet is one pass, not
    /// N log N comparisons of names every round.
    fn sort(&mut self) {
        self.nodes.sort_by(activation_order);
        self.index = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
    }
}

/// What replacing one node's view changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    None,
    /// The view differs; the nodes' order holds.
    View,
    /// A node came, went or changed its place in activation order.
    Order,
}

/// Builds one node's view for one rollout: the round's (from the watch caches) and the
/// preview's (from listed objects, `rollout/preview.rs`).
pub(crate) struct ViewBuilder<'a> {
    name: String,
    spec: &'a NodeRolloutSpec,
    selector: Selector,
    rollouts: &'a [(String, Selector)],
    existing: BTreeSet<String>,
}

impl<'a> ViewBuilder<'a> {
    /// A builder for `rollout`, given every rollout's selector, oldest first.
    pub(crate) fn new(
        rollout: &'a NodeRollout,
        rollouts: &'a [(String, Selector)],
    ) -> Result<Self> {
        let selector = Selector::try_from(rollout.spec.node_selector.clone())
            .map_err(|e| Error::Selector(e.to_string()))?;
        Ok(ViewBuilder {
            name: rollout.name_any(),
            spec: &rollout.spec,
            selector,
            rollouts,
            existing: rollouts.iter().map(|(n, _)| n.clone()).collect(),
        })
    }

    /// The node as the decision sees it, and its uid; `None` when the rollout does not
    /// select it.
    fn build(&self, node: &Node, ctx: &Sources) -> Result<Option<(NodeView, String)>> {
        if !self.selects(node) {
            return Ok(None);
        }
        ctx.metrics.built_node_view();
        let node_name = node.name_any();
        let cached = ctx.plans.get(&ObjectRef::new(&node_name));
        let plan = ctx.writes.current(&node_name, cached.as_deref());
        let label = match &cached {
            Some(p) => plan_owner(p).map(str::to_owned),
            None if plan.is_some() => Some(self.name.clone()),
            None => None,
        };
        self.view(node, plan, label).map(Some)
    }

    /// Whether the rollout's selector picks `node`.
    pub(crate) fn selects(&self, node: &Node) -> bool {
        self.selector.matches(node.labels())
    }

    /// The view of a node the rollout selects, given its plan's view and the plan's owner
    /// label, and the node's uid.
    pub(crate) fn view(
        &self,
        node: &Node,
        plan: Option<PlanView>,
        label: Option<String>,
    ) -> Result<(NodeView, String)> {
        let labels = node.labels();
        let claimants: Vec<&str> = self
            .rollouts
            .iter()
            .filter(|(_, s)| s.matches(labels))
            .map(|(n, _)| n.as_str())
            .collect();
        let ownership = resolve_ownership(
            &self.name,
            plan.is_some(),
            label.as_deref(),
            &self.existing,
            &claimants,
        );
        let uid = node.metadata.uid.clone().ok_or(Error::MissingField {
            kind: "Node",
            field: "metadata.uid",
        })?;
        let view = NodeView {
            control_plane: labels.contains_key(CONTROL_PLANE_LABEL),
            topology: topology_group(self.spec, labels),
            unschedulable: unschedulable(node),
            readiness: crate::rollout::node_readiness::readiness(node),
            name: node.name_any(),
            ownership,
            plan,
            drain: None,
            steering: Steering::of(node.metadata.annotations.as_ref()),
            scale_down: ScaleDownMark::of(node.metadata.annotations.as_ref()),
            architecture: labels.get(ARCHITECTURE_LABEL).cloned(),
            kubelet_version: crate::rollout::node_readiness::kubelet_version(node),
            rebooted_by: fluo::rebooting(labels, node.metadata.annotations.as_ref())
                .then_some(fluo::FLUO)
                .or(fleetlock::holder(node.metadata.annotations.as_ref())
                    .map(|_| fleetlock::FLEETLOCK)),
            version: 0,
        };
        Ok((view, uid))
    }
}

/// Every rollout with its selector, oldest first (ties by name): the order in which
/// rollouts claim nodes nobody owns yet.
pub(crate) fn rollouts_by_age<'a>(
    rollouts: impl IntoIterator<Item = &'a NodeRollout>,
) -> Vec<(String, Selector)> {
    let mut all: Vec<(Option<Timestamp>, String, Selector)> = rollouts
        .into_iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .filter_map(|r| {
            let selector = Selector::try_from(r.spec.node_selector.clone()).ok()?;
            Some((
                r.metadata.creation_timestamp.as_ref().map(|t| t.0),
                r.name_any(),
                selector,
            ))
        })
        .collect();
    all.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    all.into_iter().map(|(_, name, s)| (name, s)).collect()
}

/// A node's group under `maxUnavailablePerTopology`: its value of the key's label; a node
/// without the label belongs to the empty value's group.
fn topology_group(spec: &NodeRolloutSpec, labels: &BTreeMap<String, String>) -> String {
    spec.max_unavailable_per_topology
        .as_ref()
        .and_then(|spread| labels.get(&spread.key))
        .cloned()
        .unwrap_or_default()
}

/// Whether the node is cordoned (`spec.unschedulable`).
pub fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests;
