//! Loopback ports for the servers the beds start, chosen so that concurrent tests never
//! choose the same one.

use std::path::Path;

use crate::error::IoContext;
use crate::{Error, Result};

/// Ports for servers the beds start (kubelets, Cluster API's manager, stand-in kubelets) come
/// from below the kernel's ephemeral range (32768-60999 here): such a server binds its ports
/// seconds after they were chosen, and a port the kernel hands out for `bind(0)` meanwhile
/// (an etcd of another test takes its ports that way) would collide.
const BED_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// Where each chosen port has a lock file, locked by the process that chose it until it exits.
/// The tests run in processes of their own (nextest), and a port stays unbound from its choice
/// until its server starts: a kubelet's, until its node has booted. Another test choosing
/// meanwhile found the port free (Cluster API's manager: "bind: address already in use").
const PORT_LOCKS: &str = "/run/inplace-tests/ports";

/// A port of [`BED_PORTS`] free now and chosen by no other running process, tried from a
/// point that differs per process and call; held (its lock) until this process exits.
pub fn free_port() -> Result<u16> {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    std::fs::create_dir_all(PORT_LOCKS).ctx(|| format!("creating {PORT_LOCKS}"))?;
    let span = u32::from(BED_PORTS.end - BED_PORTS.start);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let start = (std::process::id().wrapping_mul(7919) ^ nanos).wrapping_add(call.wrapping_mul(97));
    let candidates = (0..span)
        .map(|i| BED_PORTS.start + u16::try_from(start.wrapping_add(i) % span).unwrap_or(0));
    let (port, lock) = first_free_port(candidates)
        .ok_or_else(|| Error::Invalid(format!("no free port in {BED_PORTS:?} on 127.0.0.1")))?;
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(lock);
    Ok(port)
}

/// The first of `candidates` that no process holds the lock of and that is free to bind now,
/// with its lock.
fn first_free_port(mut candidates: impl Iterator<Item = u16>) -> Option<(u16, std::fs::File)> {
    candidates.find_map(|port| {
        let lock = lock_port(port)?;
        std::net::TcpListener::bind(("127.0.0.1", port)).ok()?;
        Some((port, lock))
    })
}

/// The port's lock file, locked, unless another process holds it.
fn lock_port(port: u16) -> Option<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(Path::new(PORT_LOCKS).join(port.to_string()))
        .ok()?;
    file.try_lock().ok()?;
    Some(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_process_chose_and_has_not_bound_yet_is_not_chosen() {
        std::fs::create_dir_all(PORT_LOCKS).unwrap();
        let (chosen, lock) = first_free_port(BED_PORTS).unwrap();
        // Another test's choice: its lock is held (flock conflicts across open files as
        // across processes) while nothing listens on the port yet.
        assert!(std::net::TcpListener::bind(("127.0.0.1", chosen)).is_ok());
        let (next, _) = first_free_port(chosen..BED_PORTS.end).unwrap();
        assert_ne!(next, chosen);
        drop(lock);
        let (again, _) = first_free_port(chosen..BED_PORTS.end).unwrap();
        assert_eq!(again, chosen, "a lock is released with its file");
    }
}
