//! kured's reboot lock on the API server: read the annotation on kured's DaemonSet, and
//! take or release it (or join and leave kured's multi-holder lock) with an update carrying
//! the resourceVersion read, as kured 1.23.0 does (`pkg/daemonsetlock/daemonsetlock.go`). What to write is decided in
//! `decision/kured.rs`.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};

use crate::decision::kured::{KuredLock, KuredView, KuredWrite, holder_id, read_lock};
use crate::error::{Error, Result};

/// How often a rollout with Staged nodes reads kured's lock again.
pub const KURED_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// Where kured keeps its lock (`--kured-daemonset`, `--kured-lock-annotation`,
/// `--kured-lock-ttl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KuredSettings {
    /// kured's DaemonSet namespace (kured's `--ds-namespace`).
    pub namespace: String,
    /// kured's DaemonSet name (kured's `--ds-name`).
    pub name: String,
    /// The annotation (kured's `--lock-annotation`).
    pub annotation: String,
    /// The TTL inplace writes on the lock it takes (as kured's `--lock-ttl`; 0: none): a
    /// controller that dies holding it does not keep kured out longer than this.
    pub ttl: SignedDuration,
    /// How often a rollout with Staged nodes reads the lock again (kured's release changes
    /// nothing the controller watches).
    pub recheck: std::time::Duration,
}

/// The lock as read, with the DaemonSet to write it back with.
pub struct KuredRead {
    /// What the decision sees.
    pub view: KuredView,
    daemonset: Option<DaemonSet>,
}

impl KuredSettings {
    fn api(&self, client: &kube::Client) -> Api<DaemonSet> {
        Api::namespaced(client.clone(), &self.namespace)
    }

    /// Reads the lock for `rollout`. A DaemonSet that does not exist (kured not installed)
    /// or cannot be read holds every grant: the lock fails closed.
    pub async fn read(&self, client: &kube::Client, rollout: &str, now: Timestamp) -> KuredRead {
        let ours = holder_id(rollout);
        match self.api(client).get_opt(&self.name).await {
            Ok(Some(daemonset)) => {
                let value = daemonset
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(&self.annotation));
                KuredRead {
                    view: KuredView {
                        lock: read_lock(value.map(String::as_str), now),
                        ours,
                    },
                    daemonset: Some(daemonset),
                }
            }
            Ok(None) => self.unreadable(ours, "the DaemonSet does not exist".to_owned()),
            Err(e) => self.unreadable(ours, e.to_string()),
        }
    }

    fn unreadable(&self, ours: String, why: String) -> KuredRead {
        KuredRead {
            view: KuredView {
                lock: KuredLock::Unreadable(format!(
                    "DaemonSet {}/{}: {why}",
                    self.namespace, self.name
                )),
                ours,
            },
            daemonset: None,
        }
    }

    /// Writes `write` onto the DaemonSet as read. `Ok(false)`: someone wrote it in between
    /// (a conflict); the next round reads it again.
    pub async fn write(
        &self,
        client: &kube::Client,
        read: KuredRead,
        write: &KuredWrite,
    ) -> Result<bool> {
        let Some(mut daemonset) = read.daemonset else {
            return Ok(false);
        };
        let annotations = daemonset.metadata.annotations.get_or_insert_default();
        match write {
            KuredWrite::Take(value) => {
                annotations.insert(self.annotation.clone(), value.clone());
            }
            KuredWrite::Release(None) => {
                annotations.remove(&self.annotation);
            }
            KuredWrite::Release(Some(value)) => {
                annotations.insert(self.annotation.clone(), value.clone());
            }
        }
        match self
            .api(client)
            .replace(&self.name, &PostParams::default(), &daemonset)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(source) => Err(Error::Kube {
                action: format!(
                    "writing kured's lock on DaemonSet {}/{}",
                    self.namespace, self.name
                ),
                source,
            }),
        }
    }
}
