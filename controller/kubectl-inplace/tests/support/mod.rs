//! What the plugin's test files share: running the built binary as kubectl runs a plugin.

use std::path::Path;

use inplace_tests::test_api::TestApi;

/// Runs `kubectl-inplace ARGS` with an admin kubeconfig written into `dir`: whether it
/// succeeded, its standard output and its standard error.
pub fn plugin(api: &TestApi, dir: &Path, args: &[&str]) -> (bool, String, String) {
    let kubeconfig = dir.join("kubeconfig");
    api.write_admin_kubeconfig(&kubeconfig).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-inplace"))
        .env("KUBECONFIG", &kubeconfig)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
