//! Leader election with a `coordination.k8s.io/v1` Lease, so that two replicas are safe:
//! only the holder reconciles. The holder renews the Lease every `renew_every`; another
//! replica takes it over when it has not seen the Lease change for `lease_duration`
//! (measured on its own clock, as client-go does, so clock skew between machines does
//! not matter). A replica that stops cleanly releases the Lease at once.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

use crate::error::{Error, Result};

/// Where the Lease lives and how it is held.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (pod name, or host name and process id).
    pub identity: String,
    /// How long a Lease nobody renews stays held.
    pub lease_duration: Duration,
    /// How often the holder renews, and a follower retries.
    pub renew_every: Duration,
}

impl LeaseSettings {
    /// The defaults client-go uses (15 s lease, renew every 2 s is client-go's retry
    /// period; we renew every 5 s).
    pub fn new(namespace: &str, identity: &str) -> Self {
        LeaseSettings {
            namespace: namespace.to_owned(),
            name: "inplace-controller".to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        }
    }
}

/// What a replica last saw of the Lease, and when (on its own clock).
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    at: Instant,
}

/// Acquires, renews and releases the Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    observed: Option<Observed>,
}

impl LeaderElector {
    /// An elector for `settings`.
    pub fn new(client: kube::Client, settings: LeaseSettings) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: None,
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.settings.identity
    }

    /// One attempt: creates the Lease, renews it, or takes it over when it expired.
    /// `Ok(true)` when this replica holds it afterwards.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        let now = MicroTime(Timestamp::now());
        let duration_secs =
            i32::try_from(self.settings.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let me = self.settings.identity.clone();
        let Some(mut lease) = self
            .api
            .get_opt(&self.settings.name)
            .await
            .map_err(Error::kube("reading the leader Lease"))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(source) => Err(Error::Kube {
                    action: "creating the leader Lease".to_owned(),
                    source,
                }),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let seen = Observed {
            holder: holder.clone(),
            renew_time: spec.renew_time.clone(),
            at: Instant::now(),
        };
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|o| o.holder != seen.holder || o.renew_time != seen.renew_time);
        if changed {
            self.observed = Some(seen);
        }
        let held_by_me = holder.as_deref() == Some(me.as_str());
        let lease_duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.settings.lease_duration, Duration::from_secs);
        let expired = holder.is_none()
            || self
                .observed
                .as_ref()
                .is_some_and(|o| o.at.elapsed() > lease_duration);
        if !held_by_me && !expired {
            return Ok(false);
        }
        let mut new_spec = spec.clone();
        new_spec.holder_identity = Some(me);
        new_spec.lease_duration_seconds = Some(duration_secs);
        new_spec.renew_time = Some(now.clone());
        if !held_by_me {
            new_spec.acquire_time = Some(now);
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(new_spec);
        // The resourceVersion in `lease` makes this a compare-and-swap: if another
        // replica wrote in between, the API answers 409 and this attempt fails.
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(source) => Err(Error::Kube {
                action: "renewing the leader Lease".to_owned(),
                source,
            }),
        }
    }

    /// Gives the Lease up so another replica can take over at once.
    pub async fn release(&self) -> Result<()> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.settings.name)
            .await
            .map_err(Error::kube("reading the leader Lease"))?
        else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(source) => Err(Error::Kube {
                action: "releasing the leader Lease".to_owned(),
                source,
            }),
        }
    }
}
