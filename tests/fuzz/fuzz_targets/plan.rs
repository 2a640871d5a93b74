//! A plan from the API: strict parsing, validation, the revision hash and the node-local
//! policy must never panic, whatever the bytes.
#![no_main]

use inplace_agent::settings::Policy;
use inplace_proto::NodeUpdatePlan;
use inplace_strict_yaml::object_from_yaml;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(plan) = object_from_yaml::<NodeUpdatePlan>(text) else { return };
    let _ = plan.validate();
    let _ = inplace_proto::revision_of(&plan.spec.content);
    let policy = Policy {
        allowed_url_prefixes: vec!["https://artifacts.example/".parse().unwrap()],
        allow_http: false,
        allowed_target_dirs: vec!["/opt/bin".into()],
        allowed_config_roots: vec!["/etc/kubernetes".into()],
        allowed_units: vec!["kubelet.service".into()],
        max_artifact_size: 1 << 30,
        reserved_disk_space: 1 << 30,
        allow_remote_health_checks: false,
        require_signatures: true,
        trusted_keys_dir: "/etc/inplace/keys".into(),
    };
    let _ = inplace_agent::policy::check(&plan.spec.content, &policy);
});
