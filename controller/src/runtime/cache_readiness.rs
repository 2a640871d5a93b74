//! Waiting for the watch caches' first full list, for any number of reconciles at once.
//!
//! kube-runtime 5.0.0's `Store::wait_until_ready` cannot be awaited by two tasks at the same
//! time: it polls one futures oneshot receiver (`utils/delayed_init.rs`), which keeps the
//! waker of the last task that polled it only. Two rollouts reconciled while a cache was
//! still listing (a new leader's first rounds) then left the first one asleep for good: it
//! was never woken when the list completed and never reconciled again, as a new node
//! showed (`operations.rs` `two_replicas_one_leader_and_a_clean_handover`, on the real
//! server). Here one task waits for the stores and opens a gate every reconcile may wait on.

use std::future::Future;
use std::pin::Pin;

use futures::future::join_all;
use inplace_proto::{NodeRelease, NodeUpdatePlan};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::WriterDropped;
use tokio::sync::watch;

/// One store's `wait_until_ready`.
type Waiting = Pin<Box<dyn Future<Output = Result<(), WriterDropped>> + Send>>;

/// Opens once every cache it was given has listed everything once.
#[derive(Debug, Clone)]
pub struct CachesReady {
    open: watch::Receiver<bool>,
}

impl CachesReady {
    /// A gate that opens when every one of `waits` (each a store's `wait_until_ready`,
    /// awaited by this gate's task alone) has finished. A store whose writer was dropped
    /// counts as ready, as before: the controllers are stopping then.
    pub fn after<F>(waits: Vec<F>) -> CachesReady
    where
        F: Future<Output = Result<(), WriterDropped>> + Send + 'static,
    {
        let (opened, open) = watch::channel(false);
        tokio::spawn(async move {
            join_all(waits).await;
            let _ = opened.send(true);
        });
        CachesReady { open }
    }

    /// The gate of the Node, plan and release caches the rollout controller reads.
    pub fn of(
        nodes: &Store<Node>,
        plans: &Store<NodeUpdatePlan>,
        releases: &Store<NodeRelease>,
    ) -> CachesReady {
        let (nodes, plans, releases) = (nodes.clone(), plans.clone(), releases.clone());
        CachesReady::after(vec![
            Box::pin(async move { nodes.wait_until_ready().await }) as Waiting,
            Box::pin(async move { plans.wait_until_ready().await }),
            Box::pin(async move { releases.wait_until_ready().await }),
        ])
    }

    /// Returns once the gate is open (at once after that). A gate whose task ended
    /// without opening it (the runtime shutting down) does not hold anyone.
    pub async fn wait(&self) {
        let mut open = self.open.clone();
        let _ = open.wait_for(|o| *o).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;

    use super::*;

    /// Many reconciles waiting at once all go on when the caches are listed: the lost
    /// wake-up of `Store::wait_until_ready` this gate replaces.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_waiter_goes_on_once_the_caches_are_listed() {
        let mut nodes: Writer<Node> = Writer::default();
        let mut plans: Writer<NodeUpdatePlan> = Writer::default();
        let mut releases: Writer<NodeRelease> = Writer::default();
        let gate = CachesReady::of(
            &nodes.as_reader(),
            &plans.as_reader(),
            &releases.as_reader(),
        );
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move { gate.wait().await })
            })
            .collect();
        // Every waiter has polled the gate before the lists complete.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        nodes.apply_watcher_event(&watcher::Event::Init);
        nodes.apply_watcher_event(&watcher::Event::InitDone);
        plans.apply_watcher_event(&watcher::Event::Init);
        plans.apply_watcher_event(&watcher::Event::InitDone);
        releases.apply_watcher_event(&watcher::Event::Init);
        releases.apply_watcher_event(&watcher::Event::InitDone);
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(60), waiter)
                .await
                .expect("a reconcile waiting for the caches was never woken")
                .unwrap();
        }
    }
}
