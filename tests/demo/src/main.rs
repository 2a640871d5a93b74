//! `inplace-demo`: boots a local fleet and rolls a kubelet update across it.

fn main() {
    println!("inplace-demo {}", env!("CARGO_PKG_VERSION"));
}
