//! A fake logind: boot IDs, inhibitors that block a number of looks, reboots counted (or
//! refused). [`super::Bed::boot`] plays the boot a reboot brings.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use inplace_agent::power::{Inhibitor, Power, PowerError};

pub struct FakePower {
    /// This boot's ID (`boot-1`, `boot-2`, ...); an agent reads it when it opens.
    pub boot: Mutex<String>,
    /// Reboots asked for (and accepted).
    pub reboots: AtomicUsize,
    /// A blocking shutdown inhibitor is listed for this many more looks.
    pub blocked_looks: AtomicUsize,
    /// logind refuses every reboot (no inhibitor to explain it).
    pub refuse: AtomicBool,
}

impl Default for FakePower {
    fn default() -> Self {
        FakePower {
            boot: Mutex::new("boot-1".into()),
            reboots: AtomicUsize::new(0),
            blocked_looks: AtomicUsize::new(0),
            refuse: AtomicBool::new(false),
        }
    }
}

impl FakePower {
    /// A new boot ID, as the kernel makes one at every boot.
    pub fn next_boot(&self) {
        let mut boot = self.boot.lock().unwrap();
        let n: u32 = boot.trim_start_matches("boot-").parse().unwrap();
        *boot = format!("boot-{}", n + 1);
    }

    pub fn reboots(&self) -> usize {
        self.reboots.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Power for FakePower {
    fn boot_id(&self) -> Option<String> {
        Some(self.boot.lock().unwrap().clone())
    }

    async fn inhibitors(&self) -> Result<Vec<Inhibitor>, PowerError> {
        let delay = Inhibitor {
            what: "shutdown".into(),
            who: "ModemManager".into(),
            why: "delay is fine".into(),
            mode: "delay".into(),
            uid: 0,
            pid: 7,
        };
        let blocked = self
            .blocked_looks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let mut all = vec![delay];
        if blocked {
            all.push(Inhibitor {
                what: "shutdown:sleep".into(),
                who: "backup".into(),
                why: "copying /var/lib/etcd".into(),
                mode: "block".into(),
                uid: 0,
                pid: 4242,
            });
        }
        Ok(all)
    }

    async fn reboot(&self) -> Result<(), PowerError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(PowerError(
                "org.freedesktop.DBus.Error.AccessDenied: Access denied".into(),
            ));
        }
        self.reboots.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}
