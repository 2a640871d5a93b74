//! What runs the controllers: `inplace-controller run` ([`run`]) with its leader election, the
//! watch caches' readiness and back-off, the API clients' request counting and the API
//! server's version.

pub mod api_server_version;
pub mod cache_readiness;
pub mod leader;
pub mod request_counting;
pub mod run;
pub mod watch_backoff;
