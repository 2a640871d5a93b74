//! The timing fields of a NodeRollout end to end, on the real kube-apiserver with simulated
//! agents: the API server's refusals of bad windows, deadlines and alert gates, a rollout held
//! outside its maintenance window (and by an unknown time zone) then let go, a node past
//! its progress deadline failed and its slot reused across a controller restart, and the
//! soak of `minReadySeconds` between two nodes, the per-zone spread of
//! `maxUnavailablePerTopology`. The clock is the real one: each case is
//! built around "now" (a window opening in six hours, one open since an hour ago).
// Helpers outside #[test] functions: a failed setup step should fail the test loudly.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use inplace_proto::{DesiredState, NodeRollout};
use jiff::{Timestamp, ToSpan};
use kube::api::Api;
use serde_json::{Value, json};
use support::sim_agent::SimConfig;
use support::*;

const EVERY_DAY: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A window on every day of the week starting `from_now` hours from now (UTC, HH:MM).
fn daily_window(from_now: i64, duration: &str, zone: &str) -> Value {
    let start = Timestamp::now()
        .checked_add(from_now.hours())
        .unwrap()
        .strftime("%H:%M")
        .to_string();
    json!({"days": EVERY_DAY, "start": start, "duration": duration, "timeZone": zone})
}

/// A bed with the controller, simulated agents (`config`) on `nodes` and release `rel`.
async fn bed_with(nodes: &[&str], config: SimConfig) -> (Bed, support::sim_agent::Fleet) {
    let bed = Bed::start().await;
    let fleet = bed.fleet(config);
    for name in nodes {
        create_node(&bed.client, name, &[]).await;
    }
    create_release(&bed.client, "rel", "v2").await;
    (bed, fleet)
}

/// The reasons of the Events on rollout `ro`.
async fn event_reasons(client: &kube::Client) -> Vec<String> {
    events_for(client, "ro")
        .await
        .into_iter()
        .map(|(reason, _)| reason)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_bad_windows_and_deadlines() {
    let (_api, client) = cluster().await;
    let window = |start: &str, duration: &str, days: Value, zone: &str| {
        json!({"release": "rel", "maintenanceWindows": [
            {"days": days, "start": start, "duration": duration, "timeZone": zone}]})
    };
    let rows: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "ok",
            window("22:00", "6h", json!(["Saturday"]), "Europe/Berlin"),
            None,
        ),
        (
            "hour",
            window("24:00", "1h", json!(["Monday"]), "UTC"),
            Some("spec.maintenanceWindows[0].start"),
        ),
        (
            "shape",
            window("2:00", "1h", json!(["Monday"]), "UTC"),
            Some("spec.maintenanceWindows[0].start"),
        ),
        (
            "short",
            window("02:00", "30s", json!(["Monday"]), "UTC"),
            Some("duration must be from 1m to 168h"),
        ),
        (
            "long",
            window("02:00", "169h", json!(["Monday"]), "UTC"),
            Some("duration must be from 1m to 168h"),
        ),
        (
            "nodays",
            window("02:00", "1h", json!([]), "UTC"),
            Some("spec.maintenanceWindows[0].days"),
        ),
        (
            "twice",
            window("02:00", "1h", json!(["Monday", "Monday"]), "UTC"),
            Some("spec.maintenanceWindows[0].days[1]"),
        ),
        (
            "zone",
            window("02:00", "1h", json!(["Monday"]), "Europe/Berlin; rm"),
            Some("spec.maintenanceWindows[0].timeZone"),
        ),
        (
            "soak",
            json!({"release": "rel", "minReadySeconds": 90000}),
            Some("spec.minReadySeconds"),
        ),
        (
            "deadline",
            json!({"release": "rel", "drainTimeout": "10m", "progressDeadline": "5m"}),
            Some("progressDeadline must be longer than drainTimeout"),
        ),
        (
            "deadline-default-drain",
            json!({"release": "rel", "progressDeadline": "10m"}),
            Some("progressDeadline must be longer than drainTimeout"),
        ),
        (
            "deadline-ok",
            json!({"release": "rel", "drainTimeout": "1m", "progressDeadline": "30m"}),
            None,
        ),
        (
            "spread-ok",
            json!({"release": "rel", "maxUnavailablePerTopology":
                   {"key": "topology.kubernetes.io/zone", "max": 1}}),
            None,
        ),
        (
            "spread-zero",
            json!({"release": "rel", "maxUnavailablePerTopology": {"key": "zone", "max": 0}}),
            Some("spec.maxUnavailablePerTopology.max"),
        ),
        (
            "spread-nokey",
            json!({"release": "rel", "maxUnavailablePerTopology": {"key": "", "max": 1}}),
            Some("spec.maxUnavailablePerTopology.key"),
        ),
        (
            "spread-badkey",
            json!({"release": "rel", "maxUnavailablePerTopology": {"key": "zone/-x", "max": 1}}),
            Some("spec.maxUnavailablePerTopology.key"),
        ),
        (
            "gates-ok",
            json!({"release": "rel", "gates": {"alerts": ["NodeDown", "job:errors:ratio_high"]}}),
            None,
        ),
        (
            "gates-name",
            json!({"release": "rel", "gates": {"alerts": ["Node Down"]}}),
            Some("spec.gates.alerts[0]"),
        ),
        (
            "gates-empty",
            json!({"release": "rel", "gates": {"alerts": [""]}}),
            Some("spec.gates.alerts[0]"),
        ),
        (
            "gates-twice",
            json!({"release": "rel", "gates": {"alerts": ["NodeDown", "NodeDown"]}}),
            Some("spec.gates.alerts[1]"),
        ),
    ];
    for (name, spec, want) in rows {
        let got = refusal(&client, name, spec).await;
        match (want, &got) {
            (None, None) => {}
            (Some(want), Some(message)) => {
                assert!(message.contains(want), "{name}: {message}");
            }
            _ => panic!("{name}: wanted {want:?}, the server said {got:?}"),
        }
    }
    // The defaults keep today's behaviour: none of the new fields is written back.
    let stored = Api::<NodeRollout>::all(client.clone())
        .get("deadline-ok")
        .await
        .unwrap();
    assert!(stored.spec.maintenance_windows.is_empty());
    assert_eq!(stored.spec.min_ready_seconds, 0);
    assert!(stored.spec.gates.alerts.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_waits_for_its_maintenance_window_then_goes_on() {
    let (bed, fleet) = bed_with(&["worker-1", "worker-2"], SimConfig::default()).await;

    // A time zone the controller's database does not know: held, the field named.
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 2,
               "maintenanceWindows": [daily_window(0, "1h", "Mars/Olympus_Mons")]}),
    )
    .await;
    let rollout = rollout_when(&bed.client, "ro", "InvalidMaintenanceWindow", |r| {
        has_condition(r, "Progressing", "False", "InvalidMaintenanceWindow")
    })
    .await;
    let (_, _, message) = condition(&rollout, "Progressing").unwrap();
    assert!(
        message.starts_with("spec.maintenanceWindows[0].timeZone: unknown time zone"),
        "{message}"
    );

    // Every window closed (daily, opening in six hours): staged everywhere, nobody activated.
    patch_rollout(
        &bed.client,
        "ro",
        json!({"maintenanceWindows": [daily_window(6, "1h", "UTC")]}),
    )
    .await;
    let rollout = rollout_when(&bed.client, "ro", "staged outside the window", |r| {
        has_condition(r, "Progressing", "False", "OutsideMaintenanceWindow")
            && r.status.as_ref().is_some_and(|s| s.nodes.staged == 2)
    })
    .await;
    let (_, _, message) = condition(&rollout, "Progressing").unwrap();
    assert!(
        message.starts_with("outside every maintenance window until "),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    for plan in bed.plans().list(&Default::default()).await.unwrap() {
        assert_eq!(plan.spec.desired_state, DesiredState::Staged);
        let annotations = plan.metadata.annotations.unwrap_or_default();
        assert!(!annotations.contains_key("inplace.dev/activation-granted"));
    }
    assert_eq!(fleet.max_activating(), 0);

    // A window open since an hour ago: the rollout goes on.
    patch_rollout(
        &bed.client,
        "ro",
        json!({"maintenanceWindows": [daily_window(-1, "3h", "UTC")]}),
    )
    .await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let reasons = event_reasons(&bed.client).await;
    for wanted in ["InvalidMaintenanceWindow", "OutsideMaintenanceWindow"] {
        assert!(
            reasons.iter().any(|r| r == wanted),
            "{wanted} in {reasons:?}"
        );
    }
}

fn annotations(plan: &inplace_proto::NodeUpdatePlan) -> BTreeMap<String, String> {
    plan.metadata.annotations.clone().unwrap_or_default()
}

fn annotated_time(plan: &inplace_proto::NodeUpdatePlan, key: &str) -> Timestamp {
    annotations(plan)[key].parse().unwrap()
}

/// Once `node` alone holds rollout `ro`'s slot: when it was granted (its plan's annotation).
async fn granted_when_activating(bed: &Bed, node: &str) -> Timestamp {
    rollout_when(&bed.client, "ro", &format!("{node} activating"), |r| {
        r.status.as_ref().is_some_and(|s| s.active_nodes == [node])
    })
    .await;
    annotated_time(
        &bed.plans().get(node).await.unwrap(),
        "inplace.dev/activation-granted",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_past_its_progress_deadline_fails_and_frees_its_slot_across_a_restart() {
    let mut config = SimConfig::default();
    // worker-1's agent never finishes its activation (a node that died mid-swap).
    config
        .slow
        .insert("worker-1".into(), Duration::from_secs(3600));
    let (mut bed, _fleet) = bed_with(&["worker-1"], config).await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1, "maxFailures": 1,
               "disruption": "Cordon", "drainTimeout": "1s", "progressDeadline": "6s"}),
    )
    .await;
    let granted = granted_when_activating(&bed, "worker-1").await;
    // Two more nodes join while worker-1 holds the one slot.
    for name in ["worker-2", "worker-3"] {
        create_node(&bed.client, name, &[]).await;
    }

    // The controller goes away before the deadline and comes back after it: the deadline
    // counts from the grant recorded on the plan, not from the new controller's start.
    bed.stop_controller().await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let config = bed.api.admin_config().await.unwrap();
    let (_metrics, _stop, _controller) = start_controller(config, test_settings());

    let rollout = rollout_when(&bed.client, "ro", "every node final", |r| {
        r.status
            .as_ref()
            .is_some_and(|s| s.nodes.succeeded == 2 && s.nodes.failed == 1)
    })
    .await;
    let status = rollout.status.unwrap();
    assert_eq!(status.failed_nodes[0].node, "worker-1");
    assert_eq!(status.failed_nodes[0].reason, "ProgressDeadlineExceeded");
    assert!(
        status.failed_nodes[0].message.contains(&format!(
            "within progressDeadline 6s of its grant at {granted}"
        )),
        "{}",
        status.failed_nodes[0].message
    );
    assert!(!has_condition(
        &bed.rollouts().get("ro").await.unwrap(),
        "Halted",
        "True",
        "TooManyFailures"
    ));
    // Both later nodes were granted only once worker-1's slot was released, past its deadline.
    for other in ["worker-2", "worker-3"] {
        let at = annotated_time(
            &bed.plans().get(other).await.unwrap(),
            "inplace.dev/activation-granted",
        );
        assert!(
            at >= granted.checked_add(6.seconds()).unwrap(),
            "{other} granted at {at}, worker-1 at {granted}"
        );
    }
    let node = bed.nodes().get("worker-1").await.unwrap();
    assert_eq!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "a node past its deadline stays cordoned"
    );
    let reasons = event_reasons(&bed.client).await;
    assert!(
        reasons.iter().any(|r| r == "ProgressDeadlineExceeded"),
        "{reasons:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_ready_seconds_keeps_the_slot_between_two_nodes() {
    let (bed, fleet) = bed_with(&["worker-1", "worker-2"], SimConfig::default()).await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 1, "minReadySeconds": 3}),
    )
    .await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    assert_eq!(fleet.max_activating(), 1);
    let order = fleet.stats.activation_order.lock().unwrap().clone();
    let (first, second) = (&order[0], &order[1]);
    let ready_since = annotated_time(
        &bed.plans().get(first).await.unwrap(),
        "inplace.dev/ready-since",
    );
    let next_granted = annotated_time(
        &bed.plans().get(second).await.unwrap(),
        "inplace.dev/activation-granted",
    );
    assert!(
        next_granted >= ready_since.checked_add(3.seconds()).unwrap(),
        "{second} granted at {next_granted}, {first} ready since {ready_since}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_rollout_stops_waiting_for_a_node_past_its_progress_deadline() {
    let mut config = SimConfig::default();
    config
        .slow
        .insert("worker-1".into(), Duration::from_secs(3600));
    let (bed, _fleet) = bed_with(&["worker-1"], config).await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "disruption": "Cordon", "drainTimeout": "1s",
               "progressDeadline": "5s"}),
    )
    .await;
    let granted = granted_when_activating(&bed, "worker-1").await;
    bed.rollouts()
        .delete("ro", &Default::default())
        .await
        .unwrap();
    eventually("rollout ro removed", || async {
        let gone = bed.rollouts().get_opt("ro").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    assert!(
        Timestamp::now() >= granted.checked_add(5.seconds()).unwrap(),
        "the rollout went before worker-1's deadline"
    );
    let node = bed.nodes().get("worker-1").await.unwrap();
    assert_eq!(node.spec.and_then(|s| s.unschedulable), Some(true));
    let kept = events_for(&bed.client, "ro")
        .await
        .into_iter()
        .any(|(reason, note)| {
            reason == "KeptCordoned" && note.contains("ProgressDeadlineExceeded")
        });
    assert!(kept, "no KeptCordoned event naming the deadline");
}

/// Four nodes in two zones, `maxUnavailable` 2 and one per zone: never two nodes of one zone
/// activating at once. Name order alone would grant both nodes of zone a first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_unavailable_per_topology_keeps_one_node_per_zone_activating() {
    let bed = Bed::start().await;
    let fleet = bed.fleet(SimConfig::default());
    let zone_of: BTreeMap<&str, &str> = [
        ("zone-a-1", "a"),
        ("zone-a-2", "a"),
        ("zone-b-1", "b"),
        ("zone-b-2", "b"),
    ]
    .into();
    for (name, zone) in &zone_of {
        create_node(&bed.client, name, &[("topology.kubernetes.io/zone", zone)]).await;
    }
    create_release(&bed.client, "rel", "v2").await;
    create_rollout(
        &bed.client,
        "ro",
        json!({"release": "rel", "maxUnavailable": 2,
               "maxUnavailablePerTopology": {"key": "topology.kubernetes.io/zone", "max": 1}}),
    )
    .await;
    rollout_when(&bed.client, "ro", "Complete=True", |r| {
        has_condition(r, "Complete", "True", "AllNodesUpdated")
    })
    .await;
    let together = fleet.stats.activating_together.lock().unwrap().clone();
    assert_eq!(together.len(), 4, "every node activated once: {together:?}");
    for set in &together {
        let zones: BTreeSet<&str> = set.iter().map(|n| zone_of[n.as_str()]).collect();
        assert_eq!(zones.len(), set.len(), "two of one zone at once: {set:?}");
    }
    assert!(fleet.max_activating() <= 2);
}
