//! The staging fan-out: with `INPLACE_BENCH_FANOUT_MIB` set, each node's staging is a real
//! download of that many MiB from one artifact server whose uplink all downloads share,
//! capped at `INPLACE_BENCH_LINK_MIBPS` (default 100), as a fleet's artifact server or
//! registry mirror is; `INPLACE_BENCH_MAX_CONCURRENT` sets the rollout's
//! `spec.staging.maxConcurrent` (a count or a percentage). Reported: when every node was
//! staged, against the link's own limit (all the bytes over the cap); the most downloads
//! at once, counted by the server; how long one node's download took (median, slowest);
//! the attempts that failed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inplace_tests::artifact_server::{Artifact, ArtifactServer, SharedLink};
use inplace_tests::sim_agent::Fleet;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};

use crate::env_number;

const MIB: u64 = 1 << 20;

pub struct Fanout {
    nodes: usize,
    bytes: u64,
    link_bytes_per_second: u64,
    max_concurrent: Option<IntOrString>,
    link: Arc<SharedLink>,
    url: String,
    /// Serves while the run lasts.
    _server: ArtifactServer,
}

impl Fanout {
    /// The fan-out asked for in the environment, its server started; `None` without it.
    pub async fn from_env(nodes: usize) -> anyhow::Result<Option<Fanout>> {
        let mib = env_number("INPLACE_BENCH_FANOUT_MIB", 0);
        if mib == 0 {
            return Ok(None);
        }
        let bytes = mib * MIB;
        let link_bytes_per_second = env_number("INPLACE_BENCH_LINK_MIBPS", 100) * MIB;
        let max_concurrent = std::env::var("INPLACE_BENCH_MAX_CONCURRENT")
            .ok()
            .map(|text| match text.parse::<i32>() {
                Ok(count) => IntOrString::Int(count),
                Err(_) => IntOrString::String(text),
            });
        let server = ArtifactServer::start().await?;
        server.put(
            "/kubernetes.raw",
            Artifact::bytes(vec![0x6b_u8; usize::try_from(bytes)?]),
        );
        let link = server.share_link(link_bytes_per_second);
        let url = server.url("/kubernetes.raw");
        Ok(Some(Fanout {
            nodes,
            bytes,
            link_bytes_per_second,
            max_concurrent,
            link,
            url,
            _server: server,
        }))
    }

    /// Where the simulated agents download from.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The rollout's `spec.staging`, when a limit was asked for.
    pub fn staging(&self) -> Option<Value> {
        let limit = self.max_concurrent.as_ref()?;
        Some(json!({ "maxConcurrent": limit }))
    }

    /// One line a person reads and `inplace-bench` parses (`key=value`, seconds).
    pub fn report(&self, began: Instant, fleet: &Fleet) {
        let downloads = fleet
            .stats
            .downloads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let staged_all = downloads
            .iter()
            .map(|d| d.ended.saturating_duration_since(began))
            .max()
            .unwrap_or_default();
        let mut took: Vec<Duration> = downloads.iter().map(|d| d.took).collect();
        took.sort();
        let median = took.get(took.len() / 2).copied().unwrap_or_default();
        let slowest = took.last().copied().unwrap_or_default();
        let link_limit =
            (self.nodes as u64 * self.bytes) as f64 / self.link_bytes_per_second as f64;
        let limit = match &self.max_concurrent {
            Some(IntOrString::Int(n)) => n.to_string(),
            Some(IntOrString::String(s)) => s.clone(),
            None => "none".to_owned(),
        };
        println!(
            "fan-out: nodes={} mib={} link_mibps={} max_concurrent={limit} downloads={} \
             staged_all_s={:.1} link_limit_s={link_limit:.1} peak_downloads={} \
             median_download_s={:.1} slowest_download_s={:.1} failed_attempts={}",
            self.nodes,
            self.bytes / MIB,
            self.link_bytes_per_second / MIB,
            downloads.len(),
            staged_all.as_secs_f64(),
            self.link.peak(),
            median.as_secs_f64(),
            slowest.as_secs_f64(),
            fleet
                .stats
                .failed_downloads
                .load(std::sync::atomic::Ordering::SeqCst),
        );
    }
}
