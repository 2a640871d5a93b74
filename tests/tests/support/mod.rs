//! Helpers shared by integration tests in this directory.

pub mod packaging;
#[allow(
    dead_code,
    reason = "each test binary compiles this module; only the agent-switch suites use it"
)]
pub mod switch_node;
