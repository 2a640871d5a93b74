use super::*;

const ARMED_WALL: u64 = 1_800_000_000;
const ARMED_BOOTTIME: u64 = 5_000;
const DAY: u64 = 86_400;

/// Armed in boot-1 at [`ARMED_BOOTTIME`] (wall [`ARMED_WALL`]) with 120 s to confirm.
fn armed() -> Pending {
    let mut armed = crate::self_update::tests::pending(0);
    (armed.deadline, armed.boot_deadline) =
        reading("boot-1", ARMED_BOOTTIME, ARMED_WALL).deadline_after(armed.confirm_timeout);
    armed
}

fn reading(boot: &str, boottime: u64, wall: u64) -> ClockReading {
    ClockReading {
        boot_id: Some(boot.into()),
        boottime: Some(boottime),
        wall,
    }
}

/// `elapsed` seconds after arming in boot-1, the wall clock stepped by `step`.
fn same_boot(elapsed: u64, step: i64) -> ClockReading {
    let wall = (ARMED_WALL + elapsed).saturating_add_signed(step);
    reading("boot-1", ARMED_BOOTTIME + elapsed, wall)
}

#[test]
fn the_deadline_is_recorded_on_the_boots_clock_and_the_wall_clock() {
    let p = armed();
    assert_eq!(p.deadline, ARMED_WALL + 120);
    assert_eq!(
        p.boot_deadline,
        Some(BootDeadline {
            boot_id: "boot-1".into(),
            boottime: ARMED_BOOTTIME + 120,
        })
    );
}

#[test]
fn in_the_same_boot_the_deadline_is_judged_on_that_boots_clock() {
    let p = armed();
    let started = same_boot(1, 0);
    assert_eq!(remaining(&p, &started, &same_boot(20, 0)), 100);
    assert_eq!(remaining(&p, &started, &same_boot(120, 0)), 0);
    assert_eq!(remaining(&p, &started, &same_boot(500, 0)), 0);
}

/// On the wall clock alone (at b9e2007) the guard restored here, 10 s after arming.
#[test]
fn a_wall_clock_stepped_forward_a_day_does_not_expire_the_deadline_early() {
    let p = armed();
    let started = same_boot(1, 0);
    assert_eq!(remaining(&p, &started, &same_boot(10, DAY as i64)), 110);
}

/// On the wall clock alone (at b9e2007) the guard waited here another day.
#[test]
fn a_wall_clock_stepped_back_a_day_does_not_keep_an_unconfirmed_agent() {
    let p = armed();
    let started = same_boot(1, 0);
    assert_eq!(remaining(&p, &started, &same_boot(200, -(DAY as i64))), 0);
}

/// A guard restarted late in the same boot keeps the armed deadline (it does not grant
/// itself another `confirm_timeout`).
#[test]
fn a_guard_started_again_in_the_same_boot_keeps_the_armed_deadline() {
    let p = armed();
    let started = same_boot(100, 0);
    assert_eq!(remaining(&p, &started, &same_boot(110, 0)), 10);
}

#[test]
fn in_another_boot_the_guard_grants_confirm_timeout_from_its_own_start() {
    let p = armed();
    // boot-2's clock starts again near 0, below the armed boot's deadline, and its wall
    // clock may be anything (an RTC a day behind here).
    let started = reading("boot-2", 30, ARMED_WALL - DAY);
    assert_eq!(
        remaining(&p, &started, &reading("boot-2", 30, ARMED_WALL - DAY)),
        120
    );
    assert_eq!(
        remaining(&p, &started, &reading("boot-2", 100, ARMED_WALL + DAY)),
        50
    );
    assert_eq!(
        remaining(&p, &started, &reading("boot-2", 150, ARMED_WALL - DAY)),
        0
    );
}

#[test]
fn a_boot_that_cannot_be_named_counts_as_another_boot() {
    let p = armed();
    let unnamed = |boottime| ClockReading {
        boot_id: None,
        boottime: Some(boottime),
        wall: ARMED_WALL,
    };
    assert_eq!(remaining(&p, &unnamed(4_000), &unnamed(4_050)), 70);
}

/// A record written by an agent before boot deadlines: the wall-clock rule, unchanged.
#[test]
fn a_record_without_the_boot_is_judged_on_the_wall_clock_as_before() {
    let json = r#"{
        "previousImage": "/opt/extensions/inplace-agent/a.raw",
        "nextImage": "/opt/extensions/inplace-agent/b.raw",
        "expectedVersion": "0.2.0",
        "deadline": 1000,
        "confirmTimeout": 120
    }"#;
    let old: Pending = serde_json::from_str(json).unwrap();
    assert_eq!(old.boot_deadline, None);
    let at = |wall| reading("boot-1", 7, wall);
    assert_eq!(remaining(&old, &at(0), &at(400)), 600);
    assert_eq!(remaining(&old, &at(0), &at(1_000)), 0);
    // After a power loss: at least confirm_timeout from the guard's own start.
    assert_eq!(remaining(&old, &at(5_000), &at(5_050)), 70);
    assert_eq!(remaining(&old, &at(5_000), &at(5_120)), 0);
}

#[test]
fn without_a_boot_id_or_its_clock_only_the_wall_deadline_is_recorded() {
    let no_boot = ClockReading {
        boot_id: None,
        boottime: Some(10),
        wall: 1_000,
    };
    assert_eq!(no_boot.deadline_after(120), (1_120, None));
    let no_clock = ClockReading {
        boot_id: Some("boot-1".into()),
        boottime: None,
        wall: 1_000,
    };
    assert_eq!(no_clock.deadline_after(120), (1_120, None));
}

#[test]
fn the_boot_deadline_travels_in_pending_json() {
    let p = armed();
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(
        json["bootDeadline"],
        serde_json::json!({"bootId": "boot-1", "boottime": ARMED_BOOTTIME + 120})
    );
    assert_eq!(serde_json::from_value::<Pending>(json).unwrap(), p);
}

#[test]
fn this_hosts_clocks_can_be_read() {
    let now = ClockReading::read(read_boot_id());
    assert!(now.boottime.is_some_and(|t| t > 0), "{now:?}");
    assert!(now.wall > ARMED_WALL - 200_000_000);
}
