//! Typed builders for the objects the suites create. [`ReleaseFixture`] is every suite's
//! NodeRelease: a kubelet update by default (the kubelet restarted, its unit checked), with
//! the artifacts, versions and checks a case needs.

use inplace_proto::NodeRelease;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// A NodeRelease under construction. [`ReleaseFixture::kubelet`] restarts and checks the
/// kubelet; [`ReleaseFixture::bare`] has nothing but a version and its artifacts.
#[derive(Debug, Clone)]
pub struct ReleaseFixture {
    value: Value,
}

impl ReleaseFixture {
    /// Release `name` at `version`, with no artifact, activation or check yet.
    pub fn bare(name: &str, version: &str) -> Self {
        ReleaseFixture {
            value: json!({
                "apiVersion": "inplace.dev/v1alpha1", "kind": "NodeRelease",
                "metadata": {"name": name},
                "spec": {"version": version, "artifacts": []},
            }),
        }
    }

    /// Release `name` at `version` for Kubernetes `kubernetes`: the kubelet restarted, and
    /// healthy when its unit stays up for 1 s within a minute.
    pub fn kubelet(name: &str, version: &str, kubernetes: &str) -> Self {
        let mut release = Self::bare(name, version).kubernetes_version(kubernetes);
        release.value["spec"]["activation"] = json!({"restartUnits": ["kubelet.service"]});
        release.value["spec"]["healthChecks"] =
            json!({"units": ["kubelet.service"], "window": "1s", "timeout": "1m"});
        release
    }

    /// Sets `spec.kubernetesVersion`.
    pub fn kubernetes_version(mut self, version: &str) -> Self {
        self.value["spec"]["kubernetesVersion"] = json!(version);
        self
    }

    /// Adds an artifact as the API writes it.
    pub fn artifact(mut self, artifact: Value) -> Self {
        self.spec_list("artifacts").push(artifact);
        self
    }

    /// Adds the `kubernetes` system extension at `url`, with its size when known.
    pub fn kubernetes_sysext(self, url: &str, sha256: &str, size: Option<u64>) -> Self {
        let mut artifact =
            json!({"name": "kubernetes", "type": "Sysext", "url": url, "sha256": sha256});
        if let Some(size) = size {
            artifact["size"] = json!(size);
        }
        self.artifact(artifact)
    }

    /// The health window and timeout, as durations the API reads (`30s`, `5m`).
    pub fn checked_for(mut self, window: &str, timeout: &str) -> Self {
        self.value["spec"]["healthChecks"]["window"] = json!(window);
        self.value["spec"]["healthChecks"]["timeout"] = json!(timeout);
        self
    }

    /// The Node must report the release's kubelet version (`nodeKubeletVersion`).
    pub fn node_kubelet_version(mut self) -> Self {
        self.value["spec"]["healthChecks"]["nodeKubeletVersion"] = json!(true);
        self
    }

    /// The Node must be `Ready` (`nodeReady`).
    pub fn node_ready(mut self) -> Self {
        self.value["spec"]["healthChecks"]["nodeReady"] = json!(true);
        self
    }

    /// Says the release also updates kubeadm control-plane nodes (`updatesControlPlane`).
    pub fn updates_control_plane(mut self) -> Self {
        self.value["spec"]["updatesControlPlane"] = json!(true);
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.value["metadata"]["labels"][key] = json!(value);
        self
    }

    /// The object as JSON.
    pub fn json(&self) -> Value {
        self.value.clone()
    }

    /// The object as the API's type; an error names what the API's type refuses.
    pub fn object(&self) -> serde_json::Result<NodeRelease> {
        serde_json::from_value(self.json())
    }

    /// Creates it through `client`.
    pub async fn create(&self, client: &kube::Client) -> kube::Result<NodeRelease> {
        let release = self.object().map_err(kube::Error::SerdeError)?;
        Api::<NodeRelease>::all(client.clone())
            .create(&PostParams::default(), &release)
            .await
    }

    fn spec_list(&mut self, field: &str) -> &mut Vec<Value> {
        let list = &mut self.value["spec"][field];
        if !list.is_array() {
            *list = json!([]);
        }
        list.as_array_mut().expect("made an array above")
    }
}
