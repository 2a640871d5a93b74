//! `inplace-bench`: measures inplace against the machine's limits and its peers.

fn main() {
    println!("inplace-bench {}", env!("CARGO_PKG_VERSION"));
}
