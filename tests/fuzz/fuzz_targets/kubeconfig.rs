//! A `<cluster>-kubeconfig` Secret's text, as the Cluster API extension reads it: parsed or
//! refused, never a panic; and whatever is accepted carries inline credentials only (no
//! `tokenFile`, file path, `exec` or `auth-provider` that would make the extension read its
//! own pod's files or run something).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(kubeconfig) = inplace_capi::kubeconfig::parse_inline(text) else {
        return;
    };
    for named in &kubeconfig.auth_infos {
        if let Some(user) = &named.auth_info {
            assert!(
                user.token_file.is_none() && user.exec.is_none() && user.auth_provider.is_none()
            );
            assert!(user.client_certificate.is_none() && user.client_key.is_none());
        }
    }
    for named in &kubeconfig.clusters {
        if let Some(cluster) = &named.cluster {
            assert!(cluster.certificate_authority.is_none());
        }
    }
});
