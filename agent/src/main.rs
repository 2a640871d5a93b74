//! `inplace-agent`: applies this node's NodeUpdatePlan.

fn main() {
    println!("inplace-agent {}", env!("CARGO_PKG_VERSION"));
}
