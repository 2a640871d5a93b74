//! Helpers shared by integration tests in this directory.

pub mod packaging;
pub mod switch_node;
