//! The extension's wire types against the golden files (what Cluster API's own client sent
//! and accepted, recorded by `hookcheck`): every request parses into the Rust request type,
//! and every request and response serializes back to exactly the JSON Cluster API
//! exchanged. No server, no Go: the fast suite speaks Cluster API's exact JSON.

use crate::common;

use common::{golden, golden_dir};
use inplace_capi::hooks::{
    CanUpdateMachineRequest, CanUpdateMachineResponse, CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse, DiscoveryResponse, UpdateMachineRequest, UpdateMachineResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// `json` read into `T` and written back, unchanged.
fn round_trip<T: DeserializeOwned + Serialize>(name: &str, json: &Value) {
    let typed: T = serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("{name} does not parse into the extension's type: {e}"));
    assert_eq!(
        &serde_json::to_value(&typed).unwrap(),
        json,
        "{name}: the extension's type does not write back what Cluster API exchanged"
    );
}

fn exchanges() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(".json").map(str::to_owned))
        .collect();
    names.sort();
    assert!(names.len() >= 20, "golden files missing: {names:?}");
    names
}

#[test]
fn every_golden_exchange_round_trips_through_the_extension_s_types() {
    for name in exchanges() {
        let json = golden(&name);
        match json["kind"].as_str().unwrap() {
            // The extension reads nothing from a discovery request.
            "DiscoveryRequest" => {}
            "DiscoveryResponse" => round_trip::<DiscoveryResponse>(&name, &json),
            "CanUpdateMachineRequest" => round_trip::<CanUpdateMachineRequest>(&name, &json),
            "CanUpdateMachineResponse" => round_trip::<CanUpdateMachineResponse>(&name, &json),
            "CanUpdateMachineSetRequest" => round_trip::<CanUpdateMachineSetRequest>(&name, &json),
            "CanUpdateMachineSetResponse" => {
                round_trip::<CanUpdateMachineSetResponse>(&name, &json)
            }
            "UpdateMachineRequest" => round_trip::<UpdateMachineRequest>(&name, &json),
            "UpdateMachineResponse" => round_trip::<UpdateMachineResponse>(&name, &json),
            other => panic!("{name}: unexpected kind {other}"),
        }
    }
}

#[test]
fn cluster_api_s_update_machine_request_carries_no_status() {
    // Why the extension reads the node from the stored Machine, never from the request.
    let request = golden("update-machine.request");
    let machine = &request["desired"]["machine"];
    assert!(machine.get("status").is_none(), "{machine}");
    assert!(machine["spec"]["version"].is_string());
}
