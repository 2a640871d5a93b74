//! Helpers shared by integration tests in this directory.

#[allow(
    dead_code,
    reason = "each test binary compiles this module; only the agent-update suites use it"
)]
pub mod agent_images;
pub mod packaging;
