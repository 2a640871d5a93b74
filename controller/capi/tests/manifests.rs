//! The shipped manifests in packaging/kubernetes/capi parse, and agree with each other and
//! with the server (names, labels, ports, the certificate Secret, the hook API version).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

fn manifests() -> BTreeMap<(String, String), Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/kubernetes/capi");
    let kustomization: Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap())
            .unwrap();
    let mut out = BTreeMap::new();
    let listed: Vec<&str> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    on_disk.sort();
    let mut listed_sorted: Vec<String> = listed.iter().map(|s| s.to_string()).collect();
    listed_sorted.sort();
    assert_eq!(
        listed_sorted, on_disk,
        "every manifest is listed in kustomization.yaml"
    );
    for file in listed {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value: Value =
                serde::Deserialize::deserialize(document).unwrap_or_else(|e| panic!("{file}: {e}"));
            if value.is_null() {
                continue;
            }
            let kind = value["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{file}: no kind"))
                .to_owned();
            let name = value["metadata"]["name"].as_str().unwrap().to_owned();
            assert!(
                value["apiVersion"].is_string(),
                "{file}: {kind} {name} has no apiVersion"
            );
            out.insert((kind, name), value);
        }
    }
    out
}

fn get<'a>(all: &'a BTreeMap<(String, String), Value>, kind: &str, name: &str) -> &'a Value {
    all.get(&(kind.to_owned(), name.to_owned()))
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn the_manifests_parse_and_fit_together() {
    let all = manifests();
    let deployment = get(&all, "Deployment", "inplace-capi");
    let service = get(&all, "Service", "inplace-capi");
    let certificate = get(&all, "Certificate", "inplace-capi-serving");
    let extension = get(&all, "ExtensionConfig", "inplace");
    get(&all, "Issuer", "inplace-capi-selfsigned");
    get(&all, "Namespace", "inplace-system");

    // The Service selects the Deployment's pods and targets the named port.
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&pod_labels[key], value, "selector {key}");
    }
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"],
        container["ports"][0]["name"]
    );

    // The container runs the capi subcommand on the mounted certificate.
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "capi");
    assert!(
        args.contains(&"--cert=/tls/tls.crt") && args.contains(&"--key=/tls/tls.key"),
        "{args:?}"
    );
    let secret = certificate["spec"]["secretName"].as_str().unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        secret
    );
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/tls");

    // The certificate names the Service; the ExtensionConfig calls it and trusts the CA.
    let dns: Vec<&str> = certificate["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(dns.contains(&"inplace-capi.inplace-system.svc"), "{dns:?}");
    assert_eq!(extension["apiVersion"], "runtime.cluster.x-k8s.io/v1beta2");
    assert_eq!(
        extension["metadata"]["annotations"]["runtime.cluster.x-k8s.io/inject-ca-from-secret"],
        format!("inplace-system/{secret}")
    );
    let target = &extension["spec"]["clientConfig"]["service"];
    assert_eq!(target["name"], service["metadata"]["name"]);
    assert_eq!(target["namespace"], service["metadata"]["namespace"]);
    assert_eq!(target["port"], service["spec"]["ports"][0]["port"]);

    // RBAC: read-only, and what the extension reads.
    let role = get(&all, "ClusterRole", "inplace-capi");
    let mut readable = Vec::new();
    for rule in role["rules"].as_array().unwrap() {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(
            verbs.iter().all(|v| ["get", "list", "watch"].contains(v)),
            "{rule}"
        );
        for resource in rule["resources"].as_array().unwrap() {
            readable.push(resource.as_str().unwrap().to_owned());
        }
    }
    let secrets = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|rule| rule["resources"] == json!(["secrets"]))
        .unwrap();
    assert_eq!(
        secrets["verbs"],
        json!(["get"]),
        "Secrets are read one by one, never listed or watched"
    );
    for needed in ["nodereleases", "machines", "machinesets", "secrets"] {
        assert!(
            readable.iter().any(|r| r == needed),
            "{needed} not readable: {readable:?}"
        );
    }
    let binding = get(&all, "ClusterRoleBinding", "inplace-capi");
    assert_eq!(
        binding["subjects"][0]["name"],
        deployment["spec"]["template"]["spec"]["serviceAccountName"]
    );
    get(&all, "ServiceAccount", "inplace-capi");

    // Only Cluster API's controllers reach the hooks port.
    let policy = get(&all, "NetworkPolicy", "inplace-capi");
    assert_eq!(
        policy["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
    for (key, value) in policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&pod_labels[key], value, "podSelector {key}");
    }
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let ingress = policy["spec"]["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1);
    let sources: Vec<&str> = ingress[0]["from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(
        sources,
        ["capi-system", "capi-kubeadm-control-plane-system"]
    );
    assert_eq!(
        ingress[0]["ports"][0]["port"],
        container["ports"][0]["name"]
    );
}
