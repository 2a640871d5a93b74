use super::*;

fn view_of(name: usize, control_plane: bool) -> (NodeView, String) {
    let view = NodeView {
        control_plane,
        ..NodeView::ready_worker(&format!("n{name:02}"))
    };
    (view, format!("uid-{name}"))
}

proptest::proptest! {
    /// The view kept between rounds (nodes coming, going, changing their control-plane
    /// label, one round's changes at a time) is the view built from scratch: the same
    /// nodes, in activation order, each found by its name in the index.
    #[test]
    fn the_kept_order_is_the_order_built_from_scratch(
        rounds in proptest::collection::vec(
            proptest::collection::vec((0usize..24, proptest::option::of(proptest::bool::ANY)), 1..8),
            1..12,
        ),
    ) {
        let mut kept = RolloutView::default();
        let mut fleet: BTreeMap<usize, bool> = BTreeMap::new();
        for changes in rounds {
            let mut reordered = false;
            for (name, node) in changes {
                match node {
                    Some(cp) => fleet.insert(name, cp),
                    None => fleet.remove(&name),
                };
                let built = node.map(|cp| view_of(name, cp));
                reordered |= kept.replace(&format!("n{name:02}"), built) == Change::Order;
            }
            if reordered {
                kept.sort();
            }
            let mut scratch = RolloutView::default();
            for (&name, &cp) in &fleet {
                let (view, uid) = view_of(name, cp);
                scratch.insert(view, uid);
            }
            scratch.sort();
            let unnumbered = |view: &RolloutView| -> Vec<NodeView> {
                view.nodes.iter().map(|n| NodeView { version: 0, ..n.clone() }).collect()
            };
            proptest::prop_assert_eq!(unnumbered(&kept), unnumbered(&scratch));
            let mut versions: Vec<u64> = kept.nodes.iter().map(|n| n.version).collect();
            versions.sort_unstable();
            versions.dedup();
            proptest::prop_assert_eq!(versions.len(), kept.nodes.len(), "a version given twice");
            proptest::prop_assert_eq!(&kept.index, &scratch.index);
            proptest::prop_assert_eq!(&kept.uids, &scratch.uids);
        }
    }
}
