//! The Kubernetes cluster the demo runs against: one it starts (kube-testbed: etcd,
//! kube-apiserver, kube-controller-manager of the pinned release), or an existing one given by
//! its admin kubeconfig (`--kubeconfig`). Either way the demo installs the CRDs and the shipped
//! RBAC and admission policy, each node's agent runs as that node (`system:node:NAME`) and the
//! controller as its shipped ServiceAccount.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use inplace_tests::apiserver::ApiServer;

/// Where the demo's own identities live in an existing cluster (the controller's namespace).
const NAMESPACE: &str = "inplace-system";
/// Marks what the demo creates in an existing cluster, so that cleanup removes only that.
pub const DEMO_LABEL: &str = "inplace.dev/demo";

/// A cluster and how to act in it.
pub enum Cluster {
    /// Started by the demo; stopped (with its state) when dropped.
    Started(ApiServer),
    /// An existing cluster: its admin kubeconfig, and the demo's work directory.
    Existing { kubeconfig: PathBuf, work: PathBuf },
}

impl Cluster {
    /// The admin's kubeconfig.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        match self {
            Cluster::Started(server) => server.admin_kubeconfig(),
            Cluster::Existing { kubeconfig, .. } => kubeconfig.clone(),
        }
    }

    /// A client acting as the admin.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(self.admin_kubeconfig())?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The API server's URL.
    pub fn url(&self) -> anyhow::Result<String> {
        match self {
            Cluster::Started(server) => Ok(server.url().to_owned()),
            Cluster::Existing { .. } => self.kubectl(&[
                "config",
                "view",
                "--minify",
                "-o",
                "jsonpath={.clusters[0].cluster.server}",
            ]),
        }
    }

    /// Runs kubectl of the pinned release as the admin; its standard output.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        inplace_tests::apiserver::run_kubectl(&self.admin_kubeconfig(), args)
    }

    /// Installs the CRDs (waiting until they are served), the agent's RBAC and admission
    /// policy, and the controller's namespace and RBAC, from `packaging/kubernetes`.
    pub fn install(&self) -> anyhow::Result<()> {
        Ok(inplace_tests::install::install_manifests(
            &self.admin_kubeconfig(),
        )?)
    }

    /// A kubeconfig (YAML) for `node`'s agent, acting as `system:node:NODE` in
    /// `system:nodes`: on a started cluster that identity's client certificate; on an
    /// existing one (whose CA key the demo does not have) the token of a ServiceAccount that
    /// may impersonate exactly that node and nothing else.
    pub fn node_kubeconfig(&self, node: &str) -> anyhow::Result<String> {
        let (work, path) = match self {
            Cluster::Started(server) => {
                let path = server.node_kubeconfig(node)?;
                return std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()));
            }
            Cluster::Existing { work, .. } => (work, work.join(format!("{node}.rbac.yaml"))),
        };
        let account = format!("inplace-demo-{node}");
        let rbac = format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {account}\n  namespace: {NAMESPACE}\n  labels: {{{DEMO_LABEL}: \"true\"}}\n\
             ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {account}\n  labels: {{{DEMO_LABEL}: \"true\"}}\n\
             rules:\n- apiGroups: [\"\"]\n  resources: [users]\n  verbs: [impersonate]\n  resourceNames: [\"system:node:{node}\"]\n\
             - apiGroups: [\"\"]\n  resources: [groups]\n  verbs: [impersonate]\n  resourceNames: [\"system:nodes\"]\n\
             ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {account}\n  labels: {{{DEMO_LABEL}: \"true\"}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {account}}}\n\
             subjects:\n- {{kind: ServiceAccount, name: {account}, namespace: {NAMESPACE}}}\n"
        );
        std::fs::create_dir_all(work)?;
        std::fs::write(&path, rbac).with_context(|| format!("writing {}", path.display()))?;
        self.kubectl(&["apply", "-f", &path.display().to_string()])
            .with_context(|| format!("creating the identity of node {node}"))?;
        let mut kubeconfig = self.token_kubeconfig(&account)?;
        kubeconfig.push_str(&format!(
            "    as: \"system:node:{node}\"\n    as-groups: [\"system:nodes\"]\n"
        ));
        Ok(kubeconfig)
    }

    /// The cluster's CA (PEM), which the kubelets trust for client certificates: the bed's
    /// own, or the `certificate-authority-data` of an existing cluster's admin kubeconfig.
    pub fn ca_pem(&self) -> anyhow::Result<Vec<u8>> {
        match self {
            Cluster::Started(server) => server.ca_pem(),
            Cluster::Existing { kubeconfig, .. } => {
                let ca = self.ca_base64()?;
                if ca.trim().is_empty() {
                    anyhow::bail!(
                        "{} has no certificate-authority-data: the nodes' kubelets need the cluster's CA",
                        kubeconfig.display()
                    );
                }
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(ca.trim())
                    .context("decoding the kubeconfig's certificate-authority-data")
            }
        }
    }

    /// Writes a kubeconfig for the controller to `out`: the ServiceAccount
    /// `inplace-system/inplace-controller` that the shipped ClusterRoleBinding names, so it
    /// has the shipped RBAC and nothing more (a client certificate for that name on a started
    /// cluster, the account's token on an existing one).
    pub fn write_controller_kubeconfig(&self, out: &Path) -> anyhow::Result<()> {
        match self {
            Cluster::Started(server) => server.write_kubeconfig(
                out,
                inplace_tests::install::CONTROLLER_USER,
                &inplace_tests::install::CONTROLLER_GROUPS,
            ),
            Cluster::Existing { .. } => {
                let kubeconfig = self.token_kubeconfig("inplace-controller")?;
                std::fs::write(out, kubeconfig)
                    .with_context(|| format!("writing {}", out.display()))
            }
        }
    }

    /// A kubeconfig for the ServiceAccount `account` of [`NAMESPACE`] (a day's token from the
    /// TokenRequest API), the user entry last so that a caller can add to it.
    fn token_kubeconfig(&self, account: &str) -> anyhow::Result<String> {
        let token = self.kubectl(&[
            "create",
            "token",
            account,
            "-n",
            NAMESPACE,
            "--duration=24h",
        ])?;
        let ca = self.ca_base64()?;
        let trust = if ca.trim().is_empty() {
            String::new()
        } else {
            format!("    certificate-authority-data: {}\n", ca.trim())
        };
        Ok(format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: cluster\n  cluster:\n    server: {}\n{trust}\
             contexts:\n- name: {account}\n  context: {{cluster: cluster, user: {account}}}\n\
             current-context: {account}\nusers:\n- name: {account}\n  user:\n    token: {}\n",
            self.url()?,
            token.trim()
        ))
    }

    /// The admin kubeconfig's `certificate-authority-data` (base64; empty when it has none).
    fn ca_base64(&self) -> anyhow::Result<String> {
        self.kubectl(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "--flatten",
            "-o",
            "jsonpath={.clusters[0].cluster.certificate-authority-data}",
        ])
    }

    /// On an existing cluster: removes what the demo created (its rollouts first, while the
    /// controller still runs to take its finalizer off; then the workload's namespace, plans,
    /// releases, Node objects and the nodes' identities). The CRDs and the shipped RBAC stay. A started cluster goes away
    /// whole when dropped.
    pub fn remove_demo_objects(&self, rollouts: &[&str], nodes: &[String]) -> anyhow::Result<()> {
        let Cluster::Existing { .. } = self else {
            return Ok(());
        };
        let mut names = vec![
            "delete",
            "--ignore-not-found",
            "--timeout=120s",
            "noderollout",
        ];
        names.extend(rollouts);
        self.kubectl(&names)?;
        // Its Pods go with their Nodes (the nodes are off by now): no need to wait for them.
        self.kubectl(&[
            "delete",
            "namespace",
            crate::workload::WORKLOAD_NAMESPACE,
            "--ignore-not-found",
            "--wait=false",
        ])?;
        let mut names = vec!["delete", "--ignore-not-found", "nodeupdateplan"];
        names.extend(nodes.iter().map(String::as_str));
        self.kubectl(&names)?;
        self.kubectl(&[
            "delete",
            "nodereleases",
            "-l",
            &format!("{DEMO_LABEL}=true"),
            "--ignore-not-found",
        ])?;
        let mut names = vec!["delete", "--ignore-not-found", "node"];
        names.extend(nodes.iter().map(String::as_str));
        self.kubectl(&names)?;
        for kind in ["clusterrolebinding", "clusterrole"] {
            self.kubectl(&["delete", kind, "-l", &format!("{DEMO_LABEL}=true")])?;
        }
        self.kubectl(&[
            "delete",
            "serviceaccount",
            "-n",
            NAMESPACE,
            "-l",
            &format!("{DEMO_LABEL}=true"),
        ])?;
        Ok(())
    }
}
