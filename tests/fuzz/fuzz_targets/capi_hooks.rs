//! Cluster API hook requests: any body is a request or a clean error, and the pure claim and
//! progress decisions never panic on what a request or a plan status holds.
#![no_main]

use inplace_capi::catalog::ReleaseLookup;
use inplace_capi::claim::{ObjectPair, claim};
use inplace_capi::hooks::{CanUpdateMachineRequest, UpdateMachineRequest};
use inplace_proto::NodeUpdatePlan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<CanUpdateMachineRequest>(data) {
        let main = ObjectPair {
            label: "machine",
            current: &request.current.machine,
            desired: &request.desired.machine,
            compared: "/spec",
        };
        let others = [ObjectPair {
            label: "infrastructureMachine",
            current: &request.current.infrastructure_machine,
            desired: &request.desired.infrastructure_machine,
            compared: "/spec",
        }];
        for lookup in [None, Some(ReleaseLookup::NotFound), Some(ReleaseLookup::Ambiguous(vec!["a".into()]))] {
            let _ = claim(main, &others, "/spec/version", lookup.as_ref()).patch_bytes();
        }
    }
    let _ = serde_json::from_slice::<UpdateMachineRequest>(data);
    if let Ok(plan) = serde_json::from_slice::<NodeUpdatePlan>(data) {
        let _ = inplace_capi::progress::answer("node-1", "release", "0123456789ab", &plan);
        let _ = inplace_capi::progress::next_step(Some(&plan), "0123456789ab", true);
    }
});
