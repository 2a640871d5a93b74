//! `kubectl-inplace`: the fleet at a glance.

fn main() {
    println!("kubectl-inplace {}", env!("CARGO_PKG_VERSION"));
}
