//! Puts the controller together: the HTTP server for metrics and probes, leader election,
//! the watch caches and the two kube-runtime Controllers, and a graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use futures::{StreamExt, TryStreamExt};
use inplace_proto::{NodeRelease, NodeRollout, NodeUpdatePlan};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::context::{Context, ReconcileSettings};
use crate::metrics::Metrics;
use crate::rollout::alert_gate::{AlertSource, Prometheus};
use crate::rollout::plan_watch::{WatchedPlan, plan_event};
use crate::rollout::plans::{RecentWrites, plan_owner, slim_node};
use crate::rollout::view::RolloutViews;
use crate::runtime::cache_readiness::CachesReady;
use crate::runtime::leader::{LeaderElector, LeaseSettings};
use crate::runtime::request_counting::counted_client;
use crate::runtime::watch_backoff::watch_backoff;
use crate::{release, rollout};

/// Everything `inplace-controller run` is configured with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (none: no server).
    pub metrics_addr: Option<SocketAddr>,
    /// Leader election; `None` runs without it (a single replica, or tests).
    pub lease: Option<LeaseSettings>,
    /// Reconciler tunables.
    pub reconcile: ReconcileSettings,
}

/// Why `run` ended other than by a requested stop.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Another replica holds the Lease now; this one must stop reconciling.
    #[error("lost the leader Lease")]
    LostLeadership,
}

/// Runs until `stop` turns true; then stops the controllers (letting running reconciles
/// finish), releases the Lease and returns. Returns an error when leadership is lost.
pub async fn run(
    config: kube::Config,
    settings: Settings,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let client = counted_client(config.clone(), metrics.clone())?;
    let mut no_retry = config;
    no_retry.default_retry = false;
    let eviction_client =
        counted_client(no_retry, metrics.clone()).context("building the eviction client")?;
    let server = settings
        .metrics_addr
        .map(|addr| tokio::spawn(serve_http(addr, metrics.clone(), stop.clone())));
    // A standby replica is ready: it serves probes and waits for the Lease.
    metrics.set_ready(true);

    let result = lead(
        client,
        eviction_client,
        &settings,
        metrics.clone(),
        &mut stop,
    )
    .await;
    metrics.set_leader(false);
    if let Some(server) = server {
        server.abort();
    }
    result
}

async fn lead(
    client: kube::Client,
    eviction_client: kube::Client,
    settings: &Settings,
    metrics: Arc<Metrics>,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let mut elector = settings
        .lease
        .clone()
        .map(|lease| (LeaderElector::new(client.clone(), lease.clone()), lease));
    // Wait for the Lease.
    if let Some((elector, lease)) = elector.as_mut() {
        loop {
            match elector.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "leader election attempt failed"),
            }
            tokio::select! {
                () = stopped(stop.clone()) => return Ok(()),
                () = tokio::time::sleep(lease.renew_every) => {}
            }
        }
        tracing::info!(identity = elector.identity(), "leading");
    }
    metrics.set_leader(true);

    let (stop_controllers, controllers_stop) = watch::channel(false);
    let mut controllers = tokio::spawn(run_controllers(
        client.clone(),
        eviction_client,
        metrics.clone(),
        settings.reconcile.clone(),
        controllers_stop,
    ));
    let mut last_renewal = tokio::time::Instant::now();
    let renew_every = settings
        .lease
        .as_ref()
        .map_or(Duration::from_secs(3600), |l| l.renew_every);
    loop {
        tokio::select! {
            () = stopped(stop.clone()) => {
                let _ = stop_controllers.send(true);
                let _ = (&mut controllers).await;
                if let Some((elector, _)) = &elector
                    && let Err(error) = elector.release().await
                {
                    tracing::warn!(%error, "could not release the leader Lease");
                }
                return Ok(());
            }
            result = &mut controllers => {
                return match result {
                    Ok(inner) => inner,
                    Err(join) => Err(anyhow::anyhow!("controllers panicked: {join}")),
                };
            }
            () = tokio::time::sleep(renew_every) => {
                let Some((elector, lease)) = elector.as_mut() else { continue };
                match elector.try_acquire_or_renew().await {
                    Ok(true) => last_renewal = tokio::time::Instant::now(),
                    Ok(false) => {
                        tracing::error!(
                            identity = elector.identity(),
                            "another replica holds the leader Lease now; stopping"
                        );
                        controllers.abort();
                        return Err(RunError::LostLeadership.into());
                    }
                    Err(error) if last_renewal.elapsed() < lease.lease_duration => {
                        tracing::warn!(%error, "could not renew the leader Lease; retrying");
                    }
                    Err(error) => {
                        tracing::error!(%error, "could not renew the leader Lease in time");
                        controllers.abort();
                        return Err(RunError::LostLeadership.into());
                    }
                }
            }
        }
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The watch caches and both controllers, until `stop` turns true.
pub async fn run_controllers(
    client: kube::Client,
    eviction_client: kube::Client,
    metrics: Arc<Metrics>,
    reconcile: ReconcileSettings,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    // Every Node and plan event marks its node for the rollouts' views to rebuild
    // (after the reflector stored it, so the rebuild reads the new object).
    let views = Arc::new(RolloutViews::default());
    let (nodes, nodes_writer) = reflector::store::<Node>();
    let node_feed = views.clone();
    let node_events = reflector::reflector(
        nodes_writer,
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .backoff(watch_backoff())
            .modify(slim_node),
    )
    .inspect_ok(move |event| node_feed.feed.saw(event))
    .touched_objects();
    let (plans, plans_writer) = reflector::store::<NodeUpdatePlan>();
    let plan_feed = views.clone();
    let plan_events = reflector::reflector(
        plans_writer,
        watcher(
            Api::<WatchedPlan>::all(client.clone()),
            watcher::Config::default(),
        )
        .backoff(watch_backoff())
        .map_ok(plan_event),
    )
    .inspect_ok(move |event| plan_feed.feed.saw(event))
    .touched_objects();
    let (releases, releases_writer) = reflector::store::<NodeRelease>();
    let release_events = reflector::reflector(
        releases_writer,
        watcher(
            Api::<NodeRelease>::all(client.clone()),
            watcher::Config::default(),
        )
        .backoff(watch_backoff()),
    )
    .touched_objects();

    let rollout_controller = Controller::new(
        Api::<NodeRollout>::all(client.clone()),
        watcher::Config::default(),
    );
    let rollouts = rollout_controller.store();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "inplace-controller".to_owned(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let alerts = match &reconcile.prometheus {
        Some(prometheus) => Some(Arc::new(
            Prometheus::new(prometheus).context("building the Prometheus client")?,
        ) as Arc<dyn AlertSource>),
        None => None,
    };
    let caches_ready = CachesReady::of(&nodes, &plans, &releases);
    let ctx = Arc::new(Context {
        client: client.clone(),
        eviction_client,
        recorder,
        metrics,
        nodes,
        plans: plans.clone(),
        caches_ready,
        releases,
        rollouts: rollouts.clone(),
        writes: RecentWrites::default(),
        written_status: Default::default(),
        views,
        status_pacer: Default::default(),
        alerts,
        api_server_version: Default::default(),
        budget_gate: Default::default(),
        settings: reconcile,
    });
    let fleetlock = ctx.settings.fleetlock.clone().map(|settings| {
        tokio::spawn(rollout::fleetlock::serve(
            settings,
            ctx.clone(),
            stopped(stop.clone()),
        ))
    });

    let for_nodes = {
        let rollouts = rollouts.clone();
        let plans = plans.clone();
        move |node: Node| rollout::controller::rollouts_for_node(&rollouts, &plans, &node)
    };
    let for_releases = {
        let rollouts = rollouts.clone();
        move |release: NodeRelease| rollout::controller::rollouts_for_release(&rollouts, &release)
    };
    let rollouts_run = rollout_controller
        .trigger_backoff(watch_backoff())
        .watches_stream(node_events, for_nodes)
        .watches_stream(plan_events, |plan: NodeUpdatePlan| {
            plan_owner(&plan).map(ObjectRef::<NodeRollout>::new)
        })
        .watches_stream(release_events, for_releases)
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(
            rollout::controller::reconcile,
            rollout::controller::error_policy,
            ctx.clone(),
        )
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "rollout controller");
            }
        });
    let releases_run = Controller::new(
        Api::<NodeRelease>::all(client.clone()),
        watcher::Config::default(),
    )
    .trigger_backoff(watch_backoff())
    .graceful_shutdown_on(stopped(stop.clone()))
    .run(
        release::controller::reconcile,
        release::controller::error_policy,
        ctx,
    )
    .for_each(|result| async move {
        if let Err(error) = result {
            tracing::debug!(%error, "release controller");
        }
    });
    tokio::join!(rollouts_run, releases_run);
    if let Some(fleetlock) = fleetlock {
        fleetlock.abort();
    }
    Ok(())
}

/// Serves `/metrics`, `/healthz` and `/readyz` until `stop` turns true.
pub async fn serve_http(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics address {addr}"))?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, router(metrics))
        .with_graceful_shutdown(stopped(stop))
        .await
        .context("serving metrics")
}

/// The HTTP routes.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move {
                ([("content-type", crate::metrics::CONTENT_TYPE)], m.render())
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                if m.is_ready() {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(metrics)
}
