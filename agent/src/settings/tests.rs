use super::*;

fn host() -> Option<String> {
    Some("worker-7".into())
}

#[test]
fn defaults_are_safe() {
    let s = from_toml("", host).unwrap();
    assert_eq!(s.node_name, "worker-7");
    assert_eq!(s.state_dir, PathBuf::from("/var/lib/inplace"));
    assert_eq!(
        s.kube,
        KubeAuth::Kubeconfig("/etc/kubernetes/kubelet.conf".into())
    );
    assert!(s.policy.allowed_url_prefixes.is_empty());
    assert!(!s.policy.allow_http);
    assert!(!s.policy.allow_remote_health_checks);
    assert!(!s.policy.require_signatures);
    assert_eq!(
        s.policy.trusted_keys_dir,
        PathBuf::from("/etc/inplace/keys")
    );
    assert_eq!(s.paths.extensions_dir, PathBuf::from("/etc/extensions"));
    assert!(
        !s.self_update.allow,
        "a plan may not replace the agent by default"
    );
    assert_eq!(s.self_update.confirm_timeout, StdDuration::from_secs(120));
    assert_eq!(
        s.self_update.trusted_keys_dir, s.policy.trusted_keys_dir,
        "agent images are trusted by the policy's keys by default"
    );
}

#[test]
fn agent_switches_need_the_directories_the_guard_units_watch() {
    let allowed = "[self_update]\nallow = true\n";
    from_toml(allowed, host).expect("the default directories are the guard's");
    for (config, key) in [
        (
            "state_dir = \"/srv/inplace\"\n",
            "state_dir is /srv/inplace",
        ),
        (
            "[paths]\nextensions_dir = \"/var/lib/extensions\"\n",
            "paths.extensions_dir is /var/lib/extensions",
        ),
    ] {
        let err = from_toml(&format!("{config}{allowed}"), host).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("self_update.allow") && text.contains(key) && text.contains("guard"),
            "{text}"
        );
        // Without switches, the directories are the node's business.
        from_toml(config, host).expect("no switch, no guard needed");
    }
}

#[test]
fn the_agent_images_keys_follow_the_policy_s_unless_set() {
    let s = from_toml("[policy]\ntrusted_keys_dir = \"/etc/k8s-keys\"\n", host).unwrap();
    assert_eq!(
        s.self_update.trusted_keys_dir,
        PathBuf::from("/etc/k8s-keys")
    );
    let s = from_toml(
        "[policy]\ntrusted_keys_dir = \"/etc/k8s-keys\"\n[self_update]\ntrusted_keys_dir = \"/etc/agent-keys\"\n",
        host,
    )
    .unwrap();
    assert_eq!(
        s.self_update.trusted_keys_dir,
        PathBuf::from("/etc/agent-keys")
    );
    let err = from_toml("[self_update]\ntrusted_keys_dir = \"keys\"\n", host).unwrap_err();
    assert!(
        err.to_string().contains("self_update.trusted_keys_dir"),
        "{err}"
    );
}

#[test]
fn unknown_keys_name_file_and_key() {
    let err = from_toml("[policy]\nallow_htp = true\n", host).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("<inline>"), "{text}");
    assert!(text.contains("allow_htp"), "{text}");
    let err = from_toml("colour = 1\n", host).unwrap_err();
    assert!(err.to_string().contains("colour"), "{err}");
}

#[test]
fn wrong_types_are_errors() {
    let err = from_toml("[policy]\nmax_artifact_size = \"big\"\n", host).unwrap_err();
    assert!(err.to_string().contains("max_artifact_size"), "{err}");
    let err = from_toml("[download]\nstall_timeout = \"soon\"\n", host).unwrap_err();
    assert!(err.to_string().contains("soon"), "{err}");
}

#[test]
fn layers_merge_key_by_key_and_dropins_sort() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("agent.toml");
    std::fs::write(
        &main,
        "node_name = \"a\"\n[policy]\nallowed_url_prefixes = [\"https://x.example/\"]\nallow_http = false\n",
    )
    .unwrap();
    let d = dir.path().join("agent.d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("20-b.toml"), "node_name = \"c\"\n").unwrap();
    std::fs::write(
        d.join("10-a.toml"),
        "node_name = \"b\"\n[policy]\nallow_http = true\n",
    )
    .unwrap();
    std::fs::write(d.join("ignored.conf"), "garbage").unwrap();
    let s = load(&main, || None).unwrap();
    assert_eq!(s.node_name, "c");
    assert!(s.policy.allow_http);
    assert_eq!(
        s.policy.allowed_url_prefixes[0].to_string(),
        "https://x.example/"
    );
}

#[test]
fn error_in_dropin_names_that_file() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("agent.toml");
    let d = dir.path().join("agent.d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("50-bad.toml"), "[paths]\nnope = 1\n").unwrap();
    let err = load(&main, host).unwrap_err().to_string();
    assert!(err.contains("50-bad.toml") && err.contains("nope"), "{err}");
}

#[test]
fn semantic_errors_name_the_key() {
    let cases = [
        (
            "[self_update]\nconfirm_timeout = \"0s\"",
            "self_update.confirm_timeout",
        ),
        ("node_name = \"Not_A_Node\"", "node_name"),
        ("state_dir = \"relative\"", "state_dir"),
        (
            "[policy]\nallowed_url_prefixes = [\"http://x/\"]",
            "policy.allowed_url_prefixes",
        ),
        (
            "[policy]\nallowed_url_prefixes = [\"file:///x\"]",
            "policy.allowed_url_prefixes",
        ),
        (
            "[policy]\nallowed_url_prefixes = [\"https://dl.example/kube-\"]",
            "policy.allowed_url_prefixes",
        ),
        (
            "[policy]\nallowed_target_dirs = [\"/\"]",
            "policy.allowed_target_dirs",
        ),
        (
            "[policy]\nallowed_units = [\"sshd.socket\"]",
            "policy.allowed_units",
        ),
        (
            "[policy]\nallowed_units = [\"kubelet.service\", \"inplace-agent.service\"]",
            "policy.allowed_units",
        ),
        (
            "[policy]\nmax_artifact_size = 0",
            "policy.max_artifact_size",
        ),
        ("[kubernetes]\ntoken_file = \"/t\"", "kubernetes.server"),
        (
            "[kubernetes]\ntoken_file = \"/t\"\nkubeconfig = \"/k\"\nserver = \"https://a\"",
            "kubernetes.token_file",
        ),
        ("[activation]\nmax_attempts = 0", "activation.max_attempts"),
        (
            "[policy]\ntrusted_keys_dir = \"keys\"",
            "policy.trusted_keys_dir",
        ),
        ("[download]\nattempts = 0", "download.attempts"),
        (
            "[download]\nartifact_deadline = \"0s\"",
            "download.artifact_deadline",
        ),
        ("[metrics]\nsocket = \"metrics.sock\"", "metrics.socket"),
        ("[metrics]\nlisten = \"0.0.0.0:9477\"", "metrics.listen"),
        ("[metrics]\nlisten = \"[::]:9477\"", "metrics.listen"),
        ("[metrics]\nlisten = \"10.0.0.7:9477\"", "metrics.listen"),
        ("[metrics]\nlisten = \"localhost\"", "metrics.listen"),
        (
            "[[mirrors]]\nregistry = \"r.example\"\nhosts = [\"https://m.example\", \"ftp://x\"]",
            "mirrors[0].hosts[1]",
        ),
        (
            "[[mirrors]]\nurl_prefix = \"https://dl.example/\"\nhosts = [\"https://m.example/\"]\n\
             [[mirrors]]\nurl_prefix = \"https://dl.example/\"\nhosts = [\"https://n.example/\"]",
            "mirrors[1]",
        ),
    ];
    for (text, key) in cases {
        match from_toml(text, host) {
            Err(SettingsError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn metrics_default_to_the_socket_and_accept_loopback_only() {
    let s = from_toml("", host).unwrap();
    assert!(s.metrics.enabled);
    assert_eq!(s.metrics.socket, PathBuf::from("/run/inplace/metrics.sock"));
    assert_eq!(s.metrics.listen, None);
    let s = from_toml("[metrics]\nlisten = \"[::1]:9477\"\n", host).unwrap();
    assert_eq!(s.metrics.listen, Some("[::1]:9477".parse().unwrap()));
    let err = from_toml("[metrics]\nlisten = \"192.0.2.1:9477\"\n", host).unwrap_err();
    assert!(err.to_string().contains("not a loopback address"), "{err}");
}

#[test]
fn token_file_auth() {
    let s = from_toml(
        "[kubernetes]\ntoken_file = \"/etc/inplace/token\"\nserver = \"https://api:6443\"\n",
        host,
    )
    .unwrap();
    assert!(matches!(s.kube, KubeAuth::TokenFile { .. }));
}

#[test]
fn shipped_defaults_parse_and_document_only_known_keys() {
    let shipped = include_str!("../../../packaging/agent/agent.toml");
    assert_eq!(
        from_toml(shipped, host).unwrap(),
        from_toml("", host).unwrap()
    );
    // Every commented example is a real key with a valid value, and every commented array
    // of tables a real one (the token-file alternative excluded: it conflicts with
    // kubeconfig by design).
    let uncommented: String = shipped
        .lines()
        .map(|line| match line.strip_prefix('#') {
            Some(rest) if rest.starts_with("[[") => rest,
            Some(rest)
                if rest.contains(" = ")
                    && !rest.starts_with(' ')
                    && !["token_file", "server", "ca_file"]
                        .iter()
                        .any(|k| rest.starts_with(k)) =>
            {
                rest
            }
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let s = from_toml(&uncommented, host).unwrap();
    assert_eq!(s.node_name, "worker-7");
    assert_eq!(s.policy.allowed_url_prefixes.len(), 2);
    assert_ne!(
        s.mirrors,
        crate::mirrors::Mirrors::default(),
        "the mirrors example is read"
    );
}

#[test]
fn hostname_default_is_lowercased_like_the_kubelet_does() {
    let s = from_toml("", || Some("Worker-7.Example".into())).unwrap();
    assert_eq!(s.node_name, "worker-7.example");
}

#[test]
fn missing_hostname_without_node_name_is_an_error() {
    assert!(from_toml("", || None).is_err());
}

#[test]
fn mirrors_are_read_in_order() {
    let text = "[[mirrors]]\nregistry = \"r.example:5000\"\n\
                hosts = [\"https://m1.example\", \"http://10.0.0.7:5000\"]\n";
    let s = from_toml(text, host).unwrap();
    let d = "0".repeat(64);
    let urls: Vec<String> = s
        .mirrors
        .candidates(&format!("oci://r.example:5000/sysext/k@sha256:{d}"))
        .iter()
        .map(|c| c.label())
        .collect();
    assert_eq!(
        urls,
        [
            "mirror https://m1.example/v2/sysext/k/",
            "mirror http://10.0.0.7:5000/v2/sysext/k/",
            "the origin"
        ]
    );
}
