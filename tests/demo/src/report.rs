//! What the demo prints at the end of the v2 rollout: the summary and where to look.

use std::path::Path;
use std::time::Duration;

use kubectl_inplace::render::{self, Style};

use crate::fleet::{Member, Paths, V2};
use crate::follow::NodeTiming;
use crate::measure::{self, KubeletSeen, UnitRestart};

/// One node's line in the summary: timing, what the poller saw, systemd's restart, link.
pub(crate) type Row = (
    Member,
    Option<NodeTiming>,
    KubeletSeen,
    Option<UnitRestart>,
    String,
);

pub(crate) fn summary(
    rows: &[Row],
    rollout_took: Duration,
    total: Duration,
    health_window: u64,
    style: &Style,
) {
    let bold = |s: &str| {
        if style.color {
            format!("\x1b[1m{s}\x1b[0m")
        } else {
            s.to_owned()
        }
    };
    println!("\n{}", bold("Summary"));
    println!(
        "  {:<10} {:>16} {:>18} {:>16} {:>22} {:>9}  sysext link",
        "node",
        "slot → success",
        "healthz unanswered",
        "Node not Ready",
        "kubelet.service down",
        "restarts"
    );
    for (m, timing, seen, restart, link) in rows {
        let took = timing
            .and_then(|t| Some(t.succeeded?.saturating_duration_since(t.granted?)))
            .map(render::human_duration)
            .unwrap_or_else(|| "-".to_owned());
        let ms = |d: Duration| format!("{} ms", d.as_millis());
        let (unanswered, not_ready) = (ms(seen.unanswered.longest), ms(seen.not_ready.longest));
        let (down, restarts) = match restart {
            Some(r) => (
                format!("{} ms", r.down.as_millis()),
                r.n_restarts.to_string(),
            ),
            None => ("-".to_owned(), "-".to_owned()),
        };
        println!(
            "  {:<10} {took:>16} {unanswered:>18} {not_ready:>16} {down:>22} {restarts:>9}  {link}",
            m.name
        );
    }
    println!(
        "  rollout of {V2}: {}   whole demo: {}",
        render::human_duration(rollout_took),
        render::human_duration(total)
    );
    println!(
        "  slot → success: from the controller granting the node (plan desiredState Active) to the agent\n\
         \x20   reporting Succeeded, seen by the demo's watch (±250 ms); includes the {health_window}s health window.\n\
         \x20 healthz unanswered: the longest stretch the kubelet's GET /healthz did not answer ok, polled\n\
         \x20   every {} ms from the host (the downtime a client saw); Node not Ready: the longest stretch\n\
         \x20   its Ready condition was not True, read every 500 ms (what the control plane saw).\n\
         \x20 kubelet.service down: systemd's ActiveExit → ActiveEnter timestamps of the restart (the unit's\n\
         \x20   own downtime); restarts: NRestarts (crashes restarted by systemd; 0 is good).",
        measure::POLL_EVERY.as_millis()
    );
}

pub(crate) fn inspect_hints(
    paths: &Paths,
    kubeconfig: &Path,
    members: &[Member],
    pids: &[(String, i32)],
) {
    let first = members.first().map(|m| m.name.as_str()).unwrap_or("demo-1");
    println!("\nLook around (in another shell, while this one waits):");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!(
        "  export PATH={}:{}:$PATH   # kubectl-inplace (the plugin), the cluster's kubectl",
        paths.bin_dir.display(),
        inplace_tests::apiserver::bin_dir().display(),
    );
    println!("  kubectl get nodereleases,noderollouts");
    println!("  kubectl get nodeupdateplans -o wide");
    println!("  kubectl inplace status");
    println!("  kubectl inplace plan {first}");
    println!("  kubectl get events --sort-by=.metadata.creationTimestamp");
    for (name, pid) in pids {
        println!("  nsenter -t {pid} -a journalctl -u inplace-agent   # on {name} (or: -a bash)");
    }
    println!(
        "  controller log: {}",
        paths.work.join("controller.log").display()
    );
}
