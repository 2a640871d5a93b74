//! Which kubeconfigs the extension uses: inline credentials only. A `<cluster>-kubeconfig`
//! Secret is written by Cluster API, but also by whoever may write Secrets in the Cluster's
//! namespace (a tenant, often). A kubeconfig that names a file (`tokenFile`,
//! `client-certificate`, `client-key`, `certificate-authority`) would make the extension
//! read its own pod's files — its ServiceAccount token, which reads every Secret of the
//! management cluster — and send them to the kubeconfig's server; `exec` and
//! `auth-provider` would run or configure code in the extension's pod. Cluster API's own
//! kubeconfigs carry `client-certificate-data`, `client-key-data` (or a `token`) and
//! `certificate-authority-data`, so nothing it writes is refused.

use kube::config::{AuthInfo, Cluster, Kubeconfig};

/// Parses a `<cluster>-kubeconfig` Secret's text and refuses what is not inline (see
/// [`check_inline_credentials`]); the message says which.
pub fn parse_inline(text: &str) -> Result<Kubeconfig, String> {
    let kubeconfig =
        Kubeconfig::from_yaml(text).map_err(|e| format!("kubeconfig does not parse: {e}"))?;
    check_inline_credentials(&kubeconfig)?;
    Ok(kubeconfig)
}

/// The first field of `kubeconfig` that would make the extension read a local file or run
/// something, named as in the kubeconfig (`users[0].user.tokenFile`), with why; `Ok` when
/// every credential is inline.
pub fn check_inline_credentials(kubeconfig: &Kubeconfig) -> Result<(), String> {
    for (index, named) in kubeconfig.clusters.iter().enumerate() {
        if let Some(cluster) = &named.cluster
            && let Some(field) = cluster_field_outside(cluster)
        {
            return Err(refusal(&format!("clusters[{index}].cluster.{field}")));
        }
    }
    for (index, named) in kubeconfig.auth_infos.iter().enumerate() {
        if let Some(user) = &named.auth_info
            && let Some(field) = user_field_outside(user)
        {
            return Err(refusal(&format!("users[{index}].user.{field}")));
        }
    }
    Ok(())
}

fn refusal(field: &str) -> String {
    format!(
        "kubeconfig field {field} is refused: the extension uses inline credentials only (client-certificate-data, client-key-data, token, certificate-authority-data), never files, exec plugins or auth providers of its own pod"
    )
}

/// The cluster field that names a local file. Every field is listed (no `..`), so a field
/// a new `kube` release adds must be judged here before this compiles.
fn cluster_field_outside(cluster: &Cluster) -> Option<&'static str> {
    let Cluster {
        server: _,
        insecure_skip_tls_verify: _,
        certificate_authority,
        certificate_authority_data: _,
        proxy_url: _,
        disable_compression: _,
        tls_server_name: _,
        extensions: _,
        other: _,
    } = cluster;
    certificate_authority
        .is_some()
        .then_some("certificate-authority")
}

/// The user field that reads a local file or runs something. Every field is listed, as
/// above.
fn user_field_outside(user: &AuthInfo) -> Option<&'static str> {
    let AuthInfo {
        username: _,
        password: _,
        token: _,
        token_file,
        client_certificate,
        client_certificate_data: _,
        client_key,
        client_key_data: _,
        impersonate: _,
        impersonate_uid: _,
        impersonate_groups: _,
        impersonate_user_extra: _,
        extensions: _,
        auth_provider,
        exec,
        other: _,
    } = user;
    [
        ("tokenFile", token_file.is_some()),
        ("client-certificate", client_certificate.is_some()),
        ("client-key", client_key.is_some()),
        ("exec", exec.is_some()),
        ("auth-provider", auth_provider.is_some()),
    ]
    .into_iter()
    .find_map(|(field, set)| set.then_some(field))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn kubeconfig(cluster: &str, user: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n{cluster}contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user:\n{user}"
        ))
        .unwrap()
    }

    #[test]
    fn cluster_api_s_inline_kubeconfig_is_accepted() {
        let inline = kubeconfig(
            "    certificate-authority-data: Q0E=\n",
            "    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ\n",
        );
        check_inline_credentials(&inline).unwrap();
        check_inline_credentials(&kubeconfig("", "    token: abc\n")).unwrap();
    }

    #[test]
    fn every_field_that_reaches_outside_the_kubeconfig_is_refused_by_name() {
        let cases = [
            (
                "",
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                "users[0].user.tokenFile",
            ),
            (
                "",
                "    client-certificate: /etc/tls.crt\n",
                "users[0].user.client-certificate",
            ),
            (
                "",
                "    token: t\n    client-key: /etc/tls.key\n",
                "users[0].user.client-key",
            ),
            (
                "",
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n",
                "users[0].user.exec",
            ),
            (
                "",
                "    auth-provider:\n      name: oidc\n",
                "users[0].user.auth-provider",
            ),
            (
                "    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt\n",
                "    token: t\n",
                "clusters[0].cluster.certificate-authority",
            ),
        ];
        for (cluster, user, field) in cases {
            let error = check_inline_credentials(&kubeconfig(cluster, user)).unwrap_err();
            assert!(
                error.starts_with(&format!("kubeconfig field {field} is refused")),
                "{field}: {error}"
            );
        }
    }
}
